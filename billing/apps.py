import weakref

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from billing.stream import build_recorder

        # Per-process state lives on the app registry, not in module globals.
        self.recorders = weakref.WeakKeyDictionary()  # event loop -> UsageRecorder
        self.recorder_factory = build_recorder
