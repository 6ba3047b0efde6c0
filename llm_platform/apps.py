"""The project as an app: only so that its startup checks run in every process."""
from __future__ import annotations

from django.apps import AppConfig


class PlatformConfig(AppConfig):
    name = "llm_platform"
    label = "llm_platform"

    def ready(self) -> None:
        from django.conf import settings  # noqa: PLC0415

        from llm_platform import checks  # noqa: PLC0415 - registers the system check

        checks.refuse_insecure_settings(settings)
