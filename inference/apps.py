import weakref

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from inference.container import build_container
        from inference.tokenization import TokenizerCache

        # Per-process state lives here, on the app registry, not in module globals.
        self.tokenizers = TokenizerCache()
        self.containers = weakref.WeakKeyDictionary()  # event loop -> Container
        self.metric_buffers = weakref.WeakKeyDictionary()  # event loop -> MetricBuffer
        self.container_factory = build_container
