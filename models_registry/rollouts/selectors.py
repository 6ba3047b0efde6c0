"""Reads on rollouts for the request path (async; plain frozen results)."""
from __future__ import annotations

from dataclasses import dataclass

from models_registry.rollout_models import Rollout
from models_registry.selectors import ServingVersion


@dataclass(frozen=True)
class LiveRollout:
    rollout_id: int
    percent: float  # 0..100 of the model's traffic goes to `canary`
    stable_version_id: int
    canary: ServingVersion


async def live_rollout(model_name: str) -> LiveRollout | None:
    """The model's running or paused rollout (a paused one keeps its share), if any."""
    rollout = await (Rollout.objects.select_related("model", "canary_version")
                     .filter(model__name=model_name, state__in=Rollout.LIVE_STATES).afirst())
    if rollout is None:
        return None
    return LiveRollout(
        rollout_id=rollout.pk,
        percent=rollout.traffic_percent,
        stable_version_id=rollout.stable_version_id,
        canary=ServingVersion.of(rollout.model, rollout.canary_version),
    )
