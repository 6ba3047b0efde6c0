"""manage.py replicatoken: print the replica access token (for a replica started by hand:
`REPLICA_ACCESS_TOKEN=$(python manage.py replicatoken) python -m replica.launch ...`).

Node agents pass it to their replicas themselves; this is for replicas outside them. The token
opens every replica of this platform: keep it out of command lines, logs and shell history.
"""
from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def handle(self, *args, **options):
        self.stdout.write(settings.REPLICA_ACCESS_TOKEN)
