from django.apps import AppConfig


class ModelsRegistryConfig(AppConfig):
    name = "models_registry"
    verbose_name = "Models"
    default_auto_field = "django.db.models.BigAutoField"
