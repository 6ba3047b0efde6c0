"""The reaper: pending rows of dead processes are finalised from the replicas' ledgers, once."""
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import UsageRecord
from billing.reaper import ReplicaCount, reap_pending_usage
from billing.services import write_usage
from tests.support.billing import event

pytestmark = pytest.mark.django_db(transaction=True)

LATER = timedelta(seconds=60)


def admit(account, model_version, request_id: str) -> None:
    tenant, key = account
    final = event(tenant.pk, key.pk, model_version.pk, request_id=request_id)
    write_usage([replace(final, status="pending", input_tokens=0, output_tokens=0,
                         estimated_tokens=50)])


def finished(input_tokens, output_tokens, reason="abort", cached=0):
    return ReplicaCount("finished", input_tokens, cached, output_tokens, reason)


def reap(answers, held=frozenset(), at=LATER, give_up_s=3600.0):
    asked = []

    def lookup(model_name, request_ids):
        asked.append((model_name, sorted(request_ids)))
        return {rid: answers.get(rid, []) for rid in request_ids}

    result = reap_pending_usage(timezone.now() + at, lookup, lambda ids: set(ids) & set(held),
                                min_age_s=10.0, give_up_s=give_up_s)
    return result, asked


def row(request_id):
    return UsageRecord.objects.get(request_id=request_id)


def test_a_dead_process_row_is_finalised_from_the_replicas(account, model_version):
    admit(account, model_version, "r1")
    # It ran on two replicas (the first failed before its first token after prefilling).
    result, asked = reap({"r1": [finished(12, 0), finished(12, 7, "length", cached=8),
                                 ReplicaCount("unknown")]})
    assert result.finalised == 1 and asked == [("chat-small", ["r1"])]
    r = row("r1")
    assert (r.status, r.input_tokens, r.cached_tokens, r.output_tokens, r.finish_reason) == \
        ("ok", 24, 8, 7, "length")
    assert r.settled_at is not None


def test_cancelled_before_the_first_token_bills_the_prefill(account, model_version):
    admit(account, model_version, "r2")
    reap({"r2": [finished(30, 0)]})
    assert (row("r2").status, row("r2").input_tokens, row("r2").output_tokens) == \
        ("cancelled", 30, 0)


def test_rows_that_are_alive_running_young_or_unanswered_wait(account, model_version):
    for rid in ("held", "running", "unreachable", "young"):
        admit(account, model_version, rid)
    answers = {"running": [ReplicaCount("running")],
               "unreachable": [finished(5, 5), ReplicaCount("unreachable")],
               "held": [finished(1, 1)], "young": [finished(1, 1)]}
    young, _ = reap(answers, held={"held"}, at=timedelta(seconds=1))
    assert (young.finalised, young.waiting) == (0, 0)  # younger than min_age_s: not looked at
    result, asked = reap(answers, held={"held"}, at=timedelta(seconds=60))
    assert result.waiting == 3 and result.finalised == 1  # "young" is old enough at +60 s
    assert row("young").status == "cancelled"
    assert all(row(rid).status == "pending" for rid in ("held", "running", "unreachable"))
    assert all("held" not in ids for _, ids in asked)  # a live process's row is not even asked


def test_after_the_give_up_time_what_answered_is_billed(account, model_version):
    admit(account, model_version, "r3")
    reap({"r3": [finished(5, 4), ReplicaCount("unreachable")]}, at=timedelta(hours=2),
         give_up_s=3600.0)
    assert (row("r3").status, row("r3").input_tokens, row("r3").output_tokens) == \
        ("cancelled", 5, 4)


def test_reaping_twice_or_after_the_final_event_bills_once(account, model_version):
    tenant, key = account
    admit(account, model_version, "r4")
    reap({"r4": [finished(10, 3)]})
    again, _ = reap({"r4": [finished(10, 3)]})
    assert again.finalised == 0
    late_final = event(tenant.pk, key.pk, model_version.pk, request_id="r4", input_tokens=10,
                       output_tokens=3, status="cancelled")
    assert write_usage([late_final]) == 0
    assert UsageRecord.objects.filter(request_id="r4").count() == 1
    assert row("r4").output_tokens == 3


def test_nothing_found_anywhere_is_a_failed_row_without_tokens(account, model_version):
    admit(account, model_version, "r5")
    reap({"r5": [ReplicaCount("unknown")]})
    assert (row("r5").status, row("r5").input_tokens, row("r5").output_tokens) == ("failed", 0, 0)
