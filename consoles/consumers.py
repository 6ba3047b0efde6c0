"""WebSocket /ws/admin/fleet: the live fleet page's feed (staff allowed to view replicas).

On connect: every replica's row. Then: `{"type": "replicas", "rows": [...]}` whenever a replica
changes (fleet_events), and `{"type": "load", "load": {replica id: outstanding tokens}}` every
`interval_s` (the router's shared counters in Redis, for the replicas the page shows).
"""
from __future__ import annotations

import asyncio
import contextlib

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from consoles.fleet_events import FLEET_GROUP, replica_rows
from inference.router import OutstandingTokens
from llm_platform.redis_clients import async_redis


def _may_view(user) -> bool:
    return bool(user and user.is_active and user.is_staff
                and user.has_perm("models_registry.view_replica"))


class FleetConsumer(AsyncJsonWebsocketConsumer):
    interval_s = settings.FLEET_LOAD_INTERVAL_SECONDS

    async def connect(self):
        user = self.scope.get("user")
        if not await sync_to_async(_may_view)(user):
            await self.close(code=4403)
            return
        self.versions: dict[int, int] = {}  # replica id -> model version id
        await self.channel_layer.group_add(FLEET_GROUP, self.channel_name)
        await self.accept()
        rows = await sync_to_async(replica_rows)()
        self._remember(rows)
        await self.send_json({"type": "replicas", "rows": rows, "snapshot": True})
        self.redis = async_redis(max_connections=2)  # timeouts: llm_platform/redis_clients.py
        self.loads = OutstandingTokens(self.redis, settings.REDIS_KEY_PREFIX)
        self.load_task = asyncio.create_task(self._push_loads())

    async def disconnect(self, code):
        await self.channel_layer.group_discard(FLEET_GROUP, self.channel_name)
        task = getattr(self, "load_task", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.redis.aclose()

    def _remember(self, rows: list[dict]) -> None:
        for row in rows:
            self.versions[row["id"]] = row["model_version_id"]

    async def fleet_replicas(self, message):
        self._remember(message["rows"])
        await self.send_json({"type": "replicas", "rows": message["rows"]})

    async def _push_loads(self) -> None:
        while True:
            by_version: dict[int, list[int]] = {}
            for replica_id, version_id in self.versions.items():
                by_version.setdefault(version_id, []).append(replica_id)
            load = {}
            try:
                for version_id, replica_ids in by_version.items():
                    load.update(await self.loads.read(version_id, replica_ids))
                await self.send_json({"type": "load", "load": {str(k): v for k, v in load.items()}})
            except Exception:  # noqa: BLE001 - Redis hiccup: try again next tick
                pass
            await asyncio.sleep(self.interval_s)
