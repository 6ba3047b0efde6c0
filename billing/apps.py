from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from billing.stream import build_recorder
        from common.per_loop import PerLoop

        # Per-process state lives on the app registry, not in module globals.
        self.recorders = PerLoop(build_recorder)  # one UsageRecorder per event loop
