from django.core.management.base import BaseCommand, CommandError

from tenants.models import Tenant
from tenants.services import create_api_key


class Command(BaseCommand):
    help = "Issue an API key for a tenant and print it once (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("tenant")
        parser.add_argument("--name", default="")

    def handle(self, *args, tenant, name, **options):
        try:
            tenant_obj = Tenant.objects.get(name=tenant)
        except Tenant.DoesNotExist as exc:
            raise CommandError(f"no tenant {tenant!r}") from exc
        issued = create_api_key(tenant_obj, name=name)
        # The key alone on stdout so scripts can capture it.
        self.stdout.write(issued.raw_key)
        self.stderr.write(f"(shown once; prefix {issued.api_key.prefix})")
