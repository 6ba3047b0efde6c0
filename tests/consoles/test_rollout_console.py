"""The rollout page of the staff console: evidence, and buttons calling the rollout services."""
import pytest
from django.test import Client

from models_registry.models import ModelVersion
from rollouts.models import Rollout
from rollouts.services import start_rollout
from models_registry.services import ensure_model_version
from tests.support.billing import priced

pytestmark = pytest.mark.django_db(transaction=True)
EVIDENCE = {"decision": "hold", "canary": {"num_requests": 14, "num_failed": 3},
            "stable": {"num_requests": 120, "num_failed": 0}}


@pytest.fixture
def rollout(transactional_db):
    stable = ensure_model_version("chat-small", 1, "fake", tokenizer="bytes")
    canary = priced(ensure_model_version("chat-small", 2, "fake", tokenizer="bytes"))
    rollout = start_rollout(canary, stable=stable, actor="test")
    Rollout.objects.filter(pk=rollout.pk).update(last_evidence=EVIDENCE)
    return rollout


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_buttons_follow_the_state_and_call_the_services(operator, rollout):
    client = logged_in(operator)
    url = f"/admin/rollouts/rollout/{rollout.pk}/change/"
    page = client.get(url).content.decode()
    assert "<dt>decision</dt><dd>hold</dd>" in page and "num_failed" in page
    assert 'data-verb="pause"' in page and 'data-verb="rollback"' in page
    assert 'data-verb="resume"' not in page
    act = f"/admin/rollouts/rollout/{rollout.pk}/act/"
    assert client.post(act + "pause/").status_code == 302
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PAUSED
    page = client.get(url).content.decode()
    assert 'data-verb="resume"' in page and 'data-verb="pause"' not in page
    client.post(act + "rollback/")
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.ROLLED_BACK
    assert rollout.canary_version.state == ModelVersion.State.RETIRED
    assert rollout.history.last().actor == "operator"
    # Nothing applies any more: no buttons, and a late POST is refused with a message.
    response = client.post(act + "promote/", follow=True)
    assert "cannot promote" in response.content.decode()
    assert client.get(act + "pause/").status_code == 405  # POST only (CSRF-protected form)


def test_only_those_allowed_to_change_rollouts_act(manager, member_a, rollout):
    act = f"/admin/rollouts/rollout/{rollout.pk}/act/rollback/"
    assert logged_in(manager).post(act).status_code == 403
    assert logged_in(member_a).post(act).status_code == 302  # to the admin log-in
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.RUNNING
