"""Log records as JSON lines (structlog over the standard library's logging).

Every record, whether from `logging.getLogger(...)` or `structlog.get_logger(...)`, goes
through one formatter: `time` (UTC, ISO 8601), `level`, `logger`, `event` (the message), the
context bound for the current request (`request_id`, `tenant_id`, `model`, see
`bind_request_context`) and the exception's traceback when there is one.

LOG_FORMAT picks the renderer: `json` (one object per line, for files and collectors),
`console` (coloured key=value lines for a person at a terminal) or `auto` (console when
stderr is a terminal, else json). Invariant: a record never fails to render; values that are
not JSON types are written with `repr`.
"""
from __future__ import annotations

import sys

import structlog

_SHARED = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.ExtraAdder(),
    structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
]


def _renderer(log_format: str):
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    if log_format == "console":
        return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    return structlog.processors.JSONRenderer(default=repr)


def formatter(log_format: str = "json") -> structlog.stdlib.ProcessorFormatter:
    """The formatter of every handler: stdlib records and structlog's through one chain."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, _renderer(log_format)])


def logging_config(level: str, log_format: str) -> dict:
    """The `LOGGING` dict for Django's settings: one console handler whose formatter renders
    stdlib records through structlog (and structlog's own through the same chain)."""
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {"()": formatter, "log_format": log_format},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
        "root": {"handlers": ["console"], "level": level},
        # httpx logs every replica metrics poll at INFO (once a second per replica).
        "loggers": {"httpx": {"level": "WARNING"}},
    }


def bind_request_context(**values) -> None:
    """Bind request-scoped keys (None values are skipped) for every later record of this task."""
    structlog.contextvars.bind_contextvars(
        **{k: v for k, v in values.items() if v is not None})


def clear_request_context() -> None:
    structlog.contextvars.clear_contextvars()
