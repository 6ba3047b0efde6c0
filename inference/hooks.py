"""Where the apps above the request path plug into it.

The layering (docs/architecture.md) puts `fleet` and `rollouts` above `inference`: the request
path never imports them, not even inside a function. When it must tell them something, or ask
them something, it goes through one of these two hooks, which they connect in their
AppConfig.ready():

- `engine_died` (a Django signal, sent with `asend`): the request path saw a replica's engine
  die. fleet connects `fleet.health_check.on_engine_died`, which marks the replica failed at
  once (the node agent then stops it and the autoscaler replaces it). Keyword arguments:
  `replica_id`, `reason`. Unconnected: nothing happens beyond the router's own drop.
- `rollout_source`: the one function that answers a model's live canary rollout. rollouts
  connects `rollouts.selectors.live_rollout`. Unconnected: no rollout, every request goes to
  the stable version.
"""
from __future__ import annotations

from typing import Awaitable, Callable

from django.dispatch import Signal

from inference.canary import LiveRollout

engine_died = Signal()


class RolloutSource:
    """One async function `model_name -> LiveRollout | None`; connecting again replaces it."""

    def __init__(self) -> None:
        self._read: Callable[[str], Awaitable[LiveRollout | None]] | None = None

    def connect(self, read: Callable[[str], Awaitable[LiveRollout | None]]) -> None:
        self._read = read

    async def __call__(self, model_name: str) -> LiveRollout | None:
        if self._read is None:
            return None
        return await self._read(model_name)


rollout_source = RolloutSource()
