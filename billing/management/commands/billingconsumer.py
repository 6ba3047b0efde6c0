"""`python manage.py billingconsumer [--name N]`: the usage stream -> PostgreSQL consumer.

Restartable at any point: entries it read but did not acknowledge are read again at its next
start (same --name), or claimed by another consumer once idle for --claim-idle-ms.
SIGTERM / SIGINT stop it after the current batch and a final drain (the outbox, then the
stream until empty, for at most --drain-seconds): `make serve` stops it after the API, so the
API's last events are billed before it exits.
"""
from __future__ import annotations

import os
import signal
import socket
import threading

import redis
from django.conf import settings
from django.core.management.base import BaseCommand

from billing.consumer import UsageConsumer
from billing.outbox import FileOutbox
from billing.stream import StreamKeys


class Command(BaseCommand):
    help = "Consume the usage stream into PostgreSQL (and replay this host's outbox)."

    def add_arguments(self, parser):
        parser.add_argument("--name", default=f"{socket.gethostname()}-{os.getpid()}")
        parser.add_argument("--batch-size", type=int, default=settings.BILLING_CONSUMER_BATCH)
        parser.add_argument("--claim-idle-ms", type=int,
                            default=settings.BILLING_CLAIM_IDLE_MS)
        parser.add_argument("--drain-seconds", type=float, default=20.0)

    def handle(self, *args, **options):
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10,
                                      socket_connect_timeout=5)
        consumer = UsageConsumer(
            client, StreamKeys(settings.REDIS_KEY_PREFIX), options["name"],
            outbox=FileOutbox(settings.BILLING_OUTBOX_DIR), batch_size=options["batch_size"],
            claim_idle_ms=options["claim_idle_ms"], block_ms=500,
        )
        self.stdout.write(f"billing consumer {options['name']} started", ending="\n")
        self.stdout.flush()
        consumer.run(stop.is_set)
        drained = consumer.finish(options["drain_seconds"])
        self.stdout.write(f"billing consumer stopped (drained {drained} entries on the way out)")
