from django.core.management.base import BaseCommand

from consoles.roles import ensure_roles


class Command(BaseCommand):
    help = "Create or update the staff role groups ('account manager', 'operator')."

    def handle(self, *args, **options):
        for name, group in ensure_roles().items():
            self.stdout.write(f"{name}: {group.permissions.count()} permissions")
