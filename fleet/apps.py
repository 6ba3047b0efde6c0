from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Nodes' agents, placement, the replica lifecycle, health checks and autoscaling: the
    control loops that write the catalogue's Node and Replica rows."""

    name = "fleet"
    verbose_name = "Fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from fleet.health_check import connect_engine_death  # noqa: PLC0415

        connect_engine_death()
