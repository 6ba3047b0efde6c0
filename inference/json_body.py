"""A request body decoded into JSON values the rest of the request path can trust.

Invariants of every value `decode_json` returns (else InvalidRequest, 400, code `invalid_json`,
or PayloadTooLarge, 413):
- the body was at most `max_bytes` bytes of strict UTF-8 (RFC 8259; no other encoding, no
  UTF-8-encoded surrogates);
- arrays and objects nest at most MAX_DEPTH deep, so no later recursion over the value (DRF,
  `json.dumps` of the idempotency fingerprint) can hit Python's recursion limit;
- every integer has at most MAX_INT_DIGITS digits (Python refuses to even parse more than
  4,300) and every number is finite: no `NaN`, `Infinity`, or `1e400` (parsed as inf);
- every string, object keys included, is valid Unicode: no lone surrogate from a `\\ud800`
  escape, so it encodes to UTF-8 wherever it goes (tokenizer, Redis, replica, logs).
"""
from __future__ import annotations

import json
import math
import re

import orjson

from inference.errors import InvalidRequest, PayloadTooLarge

MAX_DEPTH = 32
MAX_INT_DIGITS = 100  # far above any parameter's range, so those say which one is out of range

_SURROGATE = re.compile("[\ud800-\udfff]")
_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_json")


def _parse_int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        raise _invalid(f"An integer in the body has more than {MAX_INT_DIGITS} digits.")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _invalid(f"The number {text[:40]} is out of range (not a finite double).")
    return value


def _parse_constant(name: str):
    raise _invalid(f"{name} is not valid JSON: numbers must be finite.")


def _check_string(text: str) -> None:
    if not text.isascii() and _SURROGATE.search(text):
        raise _invalid("A string in the body holds a lone UTF-16 surrogate (an unpaired "
                       "\\ud800-\\udfff escape): not valid Unicode.")


def _check_tree(value: object) -> None:
    """Depth and strings, iteratively (the check itself must not recurse)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_string(item)
        elif isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise _invalid(f"The body nests arrays and objects more than {MAX_DEPTH} deep.")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_string(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _nests_within(value: object, max_depth: int) -> bool:
    """Whether no array or object in `value` nests deeper than `max_depth` (iteratively)."""
    if type(value) is not dict and type(value) is not list:
        return True
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return False
        for child in (item.values() if type(item) is dict else item):
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return True


def decode_json(raw: bytes, max_bytes: int) -> object:
    if len(raw) > max_bytes:
        raise PayloadTooLarge(f"The request body exceeds {max_bytes} bytes.")
    # The fast path: orjson holds the invariants itself (strict UTF-8, no surrogate, finite
    # numbers, its refusals) but reads an integer outside 64 bits as a float: a body with 19
    # or more digits in a row takes the thorough path, as does any body orjson refuses (which
    # says what is wrong) or that nests too deep.
    if _LONG_NUMBER.search(raw) is None:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            if _nests_within(value, MAX_DEPTH):
                return value
    return decode_thoroughly(raw)


def decode_thoroughly(raw: bytes) -> object:
    """The standard library's parser with every invariant checked as it goes: what the fast
    path returns for a body it takes, and the precise refusal of any other."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"The body is not valid UTF-8: {exc}") from None
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                           parse_constant=_parse_constant)
    except RecursionError:
        raise _invalid(f"The body nests arrays and objects more than {MAX_DEPTH} deep.") from None
    except ValueError as exc:  # json.JSONDecodeError, and any other refusal of the parser
        raise _invalid(f"Malformed JSON body: {exc}") from None
    _check_tree(value)
    return value
