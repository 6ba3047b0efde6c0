import weakref

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from inference.container import build_container
        from llm_platform.db_watchdog import install
        from inference.tokenization import TokenizerCache

        # Per-process state lives here, on the app registry, not in module globals.
        self.tokenizers = TokenizerCache()
        self.containers = weakref.WeakKeyDictionary()  # event loop -> Container
        self.metric_buffers = weakref.WeakKeyDictionary()  # event loop -> MetricBuffer
        self.container_factory = build_container
        # A read timeout for PostgreSQL on the request path (llm_platform/db_watchdog.py).
        connection_created.connect(install, dispatch_uid="llm_platform.db_watchdog")
