"""The Django project. Importing it loads the Celery app so `@shared_task`s bind to it."""
from llm_platform.celery import app as celery_app

__all__ = ("celery_app",)
