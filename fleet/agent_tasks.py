"""The node agent's side of Celery: a worker started with NODE_NAME set (see `manage.py
nodeagent`) becomes that node's agent and consumes `node.<name>`; the control loops send it
`start_replica` / `stop_replica` there (dispatch.py).

The worker holds its one NodeAgent on the Celery app object (`app.node_agent`): the agent is the
worker process, created when the worker is ready and drained when it shuts down. Run it with
`--pool solo` (one process: tasks, heartbeats and watchers share the agent).
"""
from __future__ import annotations

import logging
import os

from celery import current_app, shared_task
from celery.signals import worker_ready, worker_shutdown
from django.conf import settings
from django.utils import timezone

from fleet.dispatch import START_TASK, STOP_TASK

logger = logging.getLogger(__name__)


def _agent():
    agent = getattr(current_app, "node_agent", None)
    if agent is None:
        raise RuntimeError("this worker is not a node agent (start it with NODE_NAME set)")
    return agent


@worker_ready.connect
def _start_agent(sender=None, **_):
    if not os.environ.get("NODE_NAME"):
        return
    from fleet.node_agent import AgentConfig, NodeAgent  # noqa: PLC0415

    config = AgentConfig.from_env(dict(os.environ), access_token=settings.REPLICA_ACCESS_TOKEN)
    agent = NodeAgent(config, now=timezone.now)
    agent.start()
    sender.app.node_agent = agent


@worker_shutdown.connect
def _stop_agent(sender=None, **_):
    agent = getattr(current_app, "node_agent", None)
    if agent is not None:
        agent.shutdown()


@shared_task(name=START_TASK, ignore_result=True)
def start_replica(replica_id: int) -> bool:
    return _agent().start_replica(replica_id)


@shared_task(name=STOP_TASK, ignore_result=True)
def stop_replica(replica_id: int) -> None:
    _agent().stop_replica(replica_id)
