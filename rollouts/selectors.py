"""Reads on rollouts for the request path (async; plain frozen results). Connected to
`inference.hooks.rollout_source` in RolloutsConfig.ready()."""
from __future__ import annotations

from inference.canary import LiveRollout
from models_registry.selectors import ServingVersion
from rollouts.models import Rollout


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
