from django.apps import AppConfig
from django.db.models.signals import post_migrate, post_save


class ConsolesConfig(AppConfig):
    """The staff console's pieces beyond the per-app admin classes: roles (groups with
    permissions) and the live fleet page (replica changes pushed over Channels)."""

    name = "consoles"

    def ready(self) -> None:
        from consoles.fleet_events import on_replica_saved, on_replica_states_changed
        from consoles.roles import ensure_roles_after_migrate
        from models_registry.models import Replica
        from models_registry.signals import replica_states_changed

        post_migrate.connect(ensure_roles_after_migrate, dispatch_uid="consoles-roles")
        post_save.connect(on_replica_saved, sender=Replica, dispatch_uid="consoles-fleet")
        replica_states_changed.connect(on_replica_states_changed,
                                       dispatch_uid="consoles-fleet-updates")
