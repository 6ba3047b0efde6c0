"""manage.py nodeagent --name N --zone Z --cpu-slots 2 --memory-mib 4096: run this machine's node
agent, a Celery worker on the queue `node.<name>` (same as
`NODE_NAME=N NODE_ZONE=Z celery -A llm_platform worker -Q node.N --pool solo`)."""
from __future__ import annotations

import os

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--zone", default="")
        parser.add_argument("--address", default=os.environ.get("NODE_ADDRESS") or "127.0.0.1",
                            help="the address the platform reaches this node's replicas at "
                                 "(default: NODE_ADDRESS, else 127.0.0.1; required off loopback)")
        parser.add_argument("--port-range", default=os.environ.get("REPLICA_PORT_RANGE", ""),
                            help="replicas' ports, LOW-HIGH (default: REPLICA_PORT_RANGE, else "
                                 "any free port)")
        parser.add_argument("--bind-address", default=os.environ.get("NODE_BIND_ADDRESS", ""),
                            help="where replicas listen (default: NODE_BIND_ADDRESS, else "
                                 "--address if it is an IP address, else 127.0.0.1)")
        parser.add_argument("--cpu-slots", type=int, default=2)
        parser.add_argument("--memory-mib", type=int, default=4096)
        parser.add_argument("--heartbeat-s", type=float, default=2.0)
        parser.add_argument("--replica-threads", type=int, default=0,
                            help="torch threads per replica; 0 (default): its reserved CPU slots")
        parser.add_argument("--drain-grace-s", type=float, default=30.0)
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args, **options):
        os.environ.update({
            "NODE_NAME": options["name"], "NODE_ZONE": options["zone"],
            "NODE_ADDRESS": options["address"], "NODE_CPU_SLOTS": str(options["cpu_slots"]),
            "NODE_BIND_ADDRESS": options["bind_address"],
            "REPLICA_PORT_RANGE": options["port_range"],
            "NODE_MEMORY_MIB": str(options["memory_mib"]),
            "NODE_HEARTBEAT_SECONDS": str(options["heartbeat_s"]),
            "NODE_REPLICA_THREADS": str(options["replica_threads"]),
            "NODE_DRAIN_GRACE_SECONDS": str(options["drain_grace_s"]),
        })
        from llm_platform.celery import app  # noqa: PLC0415

        name = options["name"]
        app.worker_main(["worker", "-Q", f"node.{name}", "-n", f"{name}@%h", "--pool", "solo",
                         "--without-gossip", "--without-mingle", "--loglevel", options["loglevel"]])
