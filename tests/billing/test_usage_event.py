"""UsageEvent.stamped: the event with its time set, every other field as it was, the original
untouched; an event that has a time keeps it."""
import dataclasses

from billing.events import UsageEvent


def event(**changes) -> UsageEvent:
    base = UsageEvent(request_id="r-1", tenant_id=3, api_key_id=4, model_name="chat-small",
                      model_version_id=5, replica_id=6, input_tokens=7, cached_tokens=2,
                      output_tokens=9, ttft_ms=12.5, total_ms=40.0, status="ok",
                      finish_reason="length", endpoint="generate", estimated_tokens=20)
    return dataclasses.replace(base, **changes)


def test_stamped_sets_the_time_and_keeps_every_other_field():
    unstamped = event()
    stamped = unstamped.stamped(1700000000.25)
    assert stamped == dataclasses.replace(unstamped, occurred_at=1700000000.25)
    assert type(stamped) is UsageEvent and stamped is not unstamped
    assert unstamped.occurred_at is None  # the original is not changed
    assert UsageEvent.from_json(stamped.to_json()) == stamped


def test_an_event_with_a_time_keeps_it():
    already = event(occurred_at=5.0)
    assert already.stamped(9.0) is already
