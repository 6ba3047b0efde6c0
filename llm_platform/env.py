"""Reading settings from the environment (cookiecutter-django style, without extra packages)."""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else int(raw)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else float(raw)


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_file(name: str, default: Path) -> str:
    """The stripped contents of the file named by env var `name` (else `default`); '' when the
    file does not exist. A file named explicitly must exist."""
    raw = os.environ.get(name, "")
    path = Path(raw) if raw else default
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        if raw:
            raise
        return ""


def env_pair(name: str) -> tuple[str, str] | None:
    """`"A,B"` -> ("A", "B"); unset or empty -> None. Anything else is refused at startup."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    first, sep, second = (part.strip() for part in raw.partition(","))
    if not sep or not first or not second or "," in second:
        raise ValueError(f"{name} must be two comma-separated values, e.g. HTTP_X_FORWARDED_PROTO,https")
    return first, second


def parse_database_url(url: str) -> dict:
    """`postgres://user:pass@host:port/name?sslmode=...` -> a Django DATABASES entry.

    PostgreSQL only: the platform has one code path (no SQLite fallback).
    """
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(f"DATABASE_URL must be a postgres:// URL, got scheme {parsed.scheme!r}")
    options = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
        "OPTIONS": options,
    }
