from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from common.per_loop import PerLoop
        from inference.container import build_container
        from inference.tokenization import TokenizerCache

        # Per-process state lives here, on the app registry, not in module globals.
        self.tokenizers = TokenizerCache()
        self.containers = PerLoop(lambda: build_container(self.tokenizers))  # one per event loop
