"""Fleet e2e helpers: node agents (Celery workers on their own queues) started as
`manage.py nodeagent`, streaming load through the platform, and the control loops (lost-node
check, autoscaler) that Celery beat runs, ticked by the test on the real clock."""
from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field

import httpx
import redis as redis_lib
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from fleet.autoscaler import FleetContext, autoscale_all
from fleet.dispatch import CeleryDispatcher
from models_registry.models import Replica
from fleet.nodes import detect_lost_nodes
from tests.support.processes import Proc, start
from tests.support.waiting import wait_until

CHAT_BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Count to five."}],
             "max_tokens": 12, "stream": True}


@dataclass
class Load:
    """Streaming requests from a few threads; each outcome is (status, tokens seen, ok)."""

    url: str
    auth: dict
    body: dict = field(default_factory=lambda: dict(CHAT_BODY))
    outcomes: list[tuple[int, int, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def one(self, client: httpx.Client) -> None:
        tokens, ok, status = 0, False, 0
        try:
            with client.stream("POST", self.url + "/v1/generate", json=self.body, headers=self.auth) as r:
                status = r.status_code
                for line in r.iter_lines():
                    if line.startswith("event: token"):
                        tokens += 1
                    elif line.startswith("event: done"):
                        ok = True
        except httpx.HTTPError:
            pass
        self.outcomes.append((status, tokens, ok))

    def run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                self.one(client)

    def served(self) -> int:
        return sum(ok for *_, ok in self.outcomes)


class Control:
    """One tick = what beat runs: the lost-node check, then the autoscaler for every policy."""

    def __init__(self, lost_after_s: float, tick_s: float = 1.0):
        self.lost_after_s = lost_after_s
        self.redis = redis_lib.Redis.from_url(settings.REDIS_URL)
        self.ctx = FleetContext(redis=self.redis, key_prefix=settings.REDIS_KEY_PREFIX,
                                dispatcher=CeleryDispatcher(), tick_s=tick_s,
                                lost_after_s=lost_after_s)

    def tick(self) -> list:
        close_old_connections()
        now = timezone.now()
        detect_lost_nodes(now, lost_after_s=self.lost_after_s, dispatcher=self.ctx.dispatcher)
        return autoscale_all(now, self.ctx)

    def until(self, check, deadline_s: float, what: str, agents=(), period_s: float = 1.0,
              tick: bool = True):
        """Tick until `check()` holds (a guard against hangs, not a performance threshold).
        With tick=False it only waits: e.g. for every node to register before the autoscaler
        may place anything (a tick while only some are up places on whichever came first)."""
        def done() -> bool:
            if tick:
                self.tick()
            if check():
                return True
            for agent in agents:
                if agent.popen.poll() is not None:
                    raise RuntimeError(f"{agent.name} exited:\n{agent.log_tail()}")
            return False

        wait_until(done, deadline_s, what, period_s=period_s)


def start_agents(layout: dict[str, str], env: dict[str, str], log_dir, *, cpu_slots: int = 1,
                 memory_mib: int = 2048, drain_grace_s: float = 10.0) -> dict[str, Proc]:
    """One `manage.py nodeagent` per node name -> zone, heartbeating every second."""
    return {name: start(f"agent-{name}", [
        "manage.py", "nodeagent", "--name", name, "--zone", zone, "--cpu-slots", str(cpu_slots),
        "--memory-mib", str(memory_mib), "--heartbeat-s", "1", "--drain-grace-s",
        str(drain_grace_s)], env, log_dir) for name, zone in layout.items()}


def kill_replica_servers() -> None:
    """SIGKILL every recorded tritonserver (each runs in a session of its own)."""
    for pid in Replica.objects.exclude(server_pid=None).values_list("server_pid", flat=True):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_fleet(agents: dict[str, Proc], node_names, control: Control) -> None:
    """Stop the agents (each drains its replicas), kill any server left, drop the agents'
    Celery queues (they are not under this run's key prefix)."""
    for agent in agents.values():
        agent.stop(timeout=40)
    kill_replica_servers()
    for name in node_names:
        control.redis.delete(f"node.{name}", f"_kombu.binding.node.{name}")
    control.redis.close()
