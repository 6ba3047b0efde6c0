"""The Celery app: Redis as broker, configuration from Django settings (CELERY_* names)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")

app = Celery("llm_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
