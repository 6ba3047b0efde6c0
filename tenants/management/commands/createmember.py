import getpass

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tenants.models import Tenant
from tenants.services import add_member


class Command(BaseCommand):
    help = ("Create (or reuse) a user and make it a member of TENANT (its dashboard, /dashboard/). "
            "A password set here passes settings.AUTH_PASSWORD_VALIDATORS.")

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
        user = user_model.objects.filter(username=username).first()
        created = user is None
        if created:
            user = user_model(username=username)
        if created or password:
            password = password or getpass.getpass(f"password for {username}: ")
            try:
                validate_password(password, user)
            except ValidationError as exc:
                raise CommandError("password refused: " + " ".join(exc.messages)) from exc
            user.set_password(password)
        with transaction.atomic():
            user.save()
            add_member(user, tenant_obj)
        self.stdout.write(f"{username} is a member of {tenant}")
