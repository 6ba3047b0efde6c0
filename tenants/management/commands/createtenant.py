from django.core.management.base import BaseCommand, CommandError

from tenants.models import Tenant
from tenants.services import create_tenant


class Command(BaseCommand):
    help = "Create a tenant: createtenant NAME [--tier interactive|standard|batch|...]"

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--tier", default="standard")

    def handle(self, *args, name, tier, **options):
        if Tenant.objects.filter(name=name).exists():
            raise CommandError(f"tenant {name!r} already exists")
        tenant = create_tenant(name, tier)
        self.stdout.write(f"created tenant {tenant.name} (tier {tenant.tier.name})")
