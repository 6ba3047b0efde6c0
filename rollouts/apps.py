from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    """Canary rollouts: a new version takes a growing share of its model's traffic."""

    name = "rollouts"
    verbose_name = "Canary rollouts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from inference.hooks import rollout_source  # noqa: PLC0415
        from rollouts.selectors import live_rollout  # noqa: PLC0415

        rollout_source.connect(live_rollout)
