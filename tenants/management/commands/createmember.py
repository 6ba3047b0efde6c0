import getpass

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tenants.models import Tenant
from tenants.services import add_member


class Command(BaseCommand):
    help = "Create (or reuse) a user and make it a member of TENANT (its dashboard, /dashboard/)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("tenant")
        parser.add_argument("--password", help="default: asked on the terminal")

    def handle(self, *args, username, tenant, password=None, **options):
        try:
            tenant_obj = Tenant.objects.get(name=tenant)
        except Tenant.DoesNotExist as exc:
            raise CommandError(f"no tenant named {tenant!r}") from exc
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(username=username)
        if created or password:
            user.set_password(password or getpass.getpass(f"password for {username}: "))
            user.save()
        add_member(user, tenant_obj)
        self.stdout.write(f"{username} is a member of {tenant}")
