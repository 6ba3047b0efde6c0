"""Django inside a benchmark process: the real settings on a bench database and a private
Redis key prefix, migrated."""
from __future__ import annotations

import os
import secrets
import uuid


def setup_django(database_url: str, redis_url: str, **extra_env: str) -> None:
    os.environ.update({"DJANGO_SETTINGS_MODULE": "llm_platform.settings",
                       "DATABASE_URL": database_url, "REDIS_URL": redis_url,
                       "REDIS_KEY_PREFIX": f"llmp-bench-{uuid.uuid4().hex[:8]}:",
                       "LOG_LEVEL": "WARNING", **extra_env})
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))  # DEBUG is off: one per run
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
