"""A version without a price in effect never serves silently for free: a rollout refuses it as
canary, placement refuses to start its replicas and the autoscaler records why it holds."""
from datetime import datetime, timedelta, timezone

import pytest

from billing.selectors import MissingPrice
from billing.services import set_price
from fleet.placement import place_replicas
from rollouts import services
from rollouts.services import RolloutError
from models_registry.services import ensure_model_version

NOW = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)


class NoDispatch:
    def start(self, queue, replica_id):
        raise AssertionError("nothing may be started")

    def stop(self, queue, replica_id):
        raise AssertionError("nothing may be stopped")


@pytest.mark.django_db
def test_an_unpriced_canary_cannot_take_traffic(db):
    ensure_model_version("chat-small", 1, "fake-1", tokenizer="bytes")
    canary = ensure_model_version("chat-small", 2, "fake-2", tokenizer="bytes", state="staging")
    with pytest.raises(RolloutError, match="no price in effect.*setprice chat-small"):
        services.start_rollout(canary, now=NOW)
    set_price(canary, NOW + timedelta(days=1), "1", "2")  # not in effect yet: still refused
    with pytest.raises(RolloutError, match="no price in effect"):
        services.start_rollout(canary, now=NOW)
    set_price(canary, NOW - timedelta(days=1), "1", "2")
    assert services.start_rollout(canary, now=NOW).traffic_percent > 0


@pytest.mark.django_db
def test_placement_refuses_an_unpriced_version(db):
    version = ensure_model_version("chat-small", 1, "fake", tokenizer="bytes")
    with pytest.raises(MissingPrice, match="chat-small v1 has no price in effect"):
        place_replicas(version, 1, now=NOW, reason="test", dispatcher=NoDispatch(),
                       lost_after_s=30)
