"""A model's chat template: the Jinja program that turns a message list into its prompt text.

Rendered the way Hugging Face transformers renders it, so templates written for `transformers`
behave the same here: a sandboxed, immutable Jinja environment with `trim_blocks` and
`lstrip_blocks`, the loop-controls extension, a `tojson` filter that keeps non-ASCII, and the
globals `raise_exception(msg)` and `strftime_now(fmt)`. The variables are `messages`,
`add_generation_prompt`, the special-token strings (`bos_token`, `eos_token`, ...) and any extra
keyword the caller passes (`tools`, `enable_thinking`, ...).
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Callable

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the messages (its `raise_exception`) or is not valid Jinja."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class ChatTemplate:
    """One compiled template. `now` supplies the time for `strftime_now` (inject a fixed clock in
    tests); `special_tokens` are the strings every render sees (`bos_token`, `eos_token`, ...)."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None,
                 now: Callable[[], datetime] = datetime.now) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"invalid chat template: {e}") from e

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               **extra: Any) -> str:
        variables = {**self.special_tokens, **extra, "messages": messages,
                     "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(**variables)
        except ChatTemplateError:
            raise
        except TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e
