from django.apps import AppConfig


def _metric_buffer():
    from inference.observability.buffer import new_buffer  # noqa: PLC0415

    return new_buffer()


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from common.per_loop import PerLoop
        from django.db.backends.signals import connection_created

        from inference.container import build_container
        from llm_platform.db_watchdog import install
        from inference.tokenization import TokenizerCache

        # Per-process state lives here, on the app registry, not in module globals.
        self.tokenizers = TokenizerCache()
        self.containers = PerLoop(lambda: build_container(self.tokenizers))  # one per event loop
        self.metric_buffers = PerLoop(_metric_buffer)  # one MetricBuffer per event loop
        # A read timeout for PostgreSQL on the request path (llm_platform/db_watchdog.py).
        connection_created.connect(install, dispatch_uid="llm_platform.db_watchdog")
