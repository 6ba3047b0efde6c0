"""How the control loops reach node agents: a Celery task on the node's own queue.

Injected into placement and scaling services so their tests can record what would be sent
(tests/fakes/dispatcher.py).
"""
from __future__ import annotations

from typing import Protocol

# The names on the wire keep the module the tasks were first defined in (models_registry), so
# node agents and control loops of either side of an upgrade understand each other.
START_TASK = "models_registry.agent_tasks.start_replica"
STOP_TASK = "models_registry.agent_tasks.stop_replica"


class Dispatcher(Protocol):
    def start(self, queue: str, replica_id: int) -> None: ...

    def stop(self, queue: str, replica_id: int) -> None: ...


class CeleryDispatcher:
    def __init__(self, app=None):
        if app is None:
            from llm_platform.celery import app  # noqa: PLC0415
        self._app = app

    def start(self, queue: str, replica_id: int) -> None:
        self._app.send_task(START_TASK, args=[replica_id], queue=queue)

    def stop(self, queue: str, replica_id: int) -> None:
        self._app.send_task(STOP_TASK, args=[replica_id], queue=queue)
