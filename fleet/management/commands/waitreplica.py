"""manage.py waitreplica MODEL [--timeout-s 900]: block until the model's newest active version
has a ready replica; exit status 1 on timeout (used by `make serve`)."""
from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from models_registry.models import ModelVersion, Replica


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("model")
        parser.add_argument("--timeout-s", type=float, default=900.0)

    def handle(self, *args, **options):
        version = (ModelVersion.objects.filter(model__name=options["model"],
                                               state=ModelVersion.State.ACTIVE)
                   .order_by("-version_number").first())
        if version is None:
            raise CommandError(f"no active version of {options['model']!r}")
        end = time.monotonic() + options["timeout_s"]
        while time.monotonic() < end:
            replica = Replica.objects.filter(model_version=version, state=Replica.State.READY).first()
            if replica is not None:
                self.stdout.write(f"{version} ready at {replica.grpc_address} "
                                  f"(node {replica.node.name if replica.node else '-'})")
                return
            time.sleep(1.0)
        raise CommandError(f"no ready replica of {version} after {options['timeout_s']:.0f} s")
