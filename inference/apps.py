from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from common.per_loop import PerLoop
        from django.db.backends.signals import connection_created

        from inference.container import build_container
        from inference.db_connection import connection_opened
        from llm_platform.db_watchdog import install
        from inference.tokenization import TokenizerCache

        # Per-process state lives here, on the app registry, not in module globals.
        self.tokenizers = TokenizerCache()
        self.containers = PerLoop(lambda: build_container(self.tokenizers))  # one per event loop
        self.metric_buffers = PerLoop(self._metric_buffer)  # one MetricBuffer per event loop
        # A read timeout for PostgreSQL on the request path (llm_platform/db_watchdog.py).
        connection_created.connect(install, dispatch_uid="llm_platform.db_watchdog")
        # Which requests opened a connection to give back (inference/db_connection.py).
        connection_created.connect(connection_opened,
                                   dispatch_uid="inference.db_connection.opened")

    def _metric_buffer(self):
        """This loop's MetricBuffer, writing through this loop's container's Redis client."""
        from django.conf import settings

        from inference.observability.buffer import MetricBuffer
        from inference.observability.store import MetricStore

        container = self.containers.current()
        return MetricBuffer(MetricStore(container.redis, container.key_prefix),
                            settings.METRICS_FLUSH_SECONDS)
