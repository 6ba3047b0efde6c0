"""Startup checks of the production settings.

Invariant: with DEBUG off no platform process (daphne, Celery, a node agent, manage.py) starts
with a missing, known-default or short SECRET_KEY: it signs sessions and CSRF tokens, and the
replica access token derives from it unless REPLICA_SECRET is set. The same problems are Django
system-check errors (`manage.py check`).
"""
from __future__ import annotations

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

MIN_SECRET_KEY_LEN = 32
KNOWN_DEFAULTS = frozenset({"dev-insecure-change-me", "change-me", "changeme", "secret"})


def settings_problems(settings) -> list[str]:
    """What makes these settings unfit to run with DEBUG off ([] when DEBUG is on)."""
    if settings.DEBUG:
        return []
    problems = []
    key = settings.SECRET_KEY or ""
    if not key:
        problems.append("SECRET_KEY is not set (set it in the environment; DEBUG is off)")
    elif key in KNOWN_DEFAULTS or key.startswith("django-insecure"):
        problems.append("SECRET_KEY is a known default value (set a random one; DEBUG is off)")
    elif len(key) < MIN_SECRET_KEY_LEN or len(set(key)) < 5:
        problems.append(f"SECRET_KEY is too weak (at least {MIN_SECRET_KEY_LEN} random "
                        "characters; DEBUG is off)")
    return problems


def refuse_insecure_settings(settings) -> None:
    problems = settings_problems(settings)
    if problems:
        raise ImproperlyConfigured("; ".join(problems))


@checks.register(checks.Tags.security)
def check_secret_key(app_configs=None, **kwargs):
    from django.conf import settings  # noqa: PLC0415

    return [checks.Error(problem, id="llm_platform.E001") for problem in settings_problems(settings)]
