"""The replica's error messages on the wire: what went wrong, by the message's prefix.

Triton's gRPC stream carries an error as a message only (no status code), so the prefix is the
contract with the platform (inference/triton_messages.py classifies by it):

  invalid request: ...  the request's own input; the same on every replica (client error, 400)
  request failed: ...   this request failed inside a working engine; the others went on
  engine failed: ...    the engine died while this request was open (the replica is done)
  engine dead: ...      refused: the engine had died before this request came
  unavailable: ...      refused: the replica is draining or stopping (try another)
"""
from __future__ import annotations

from replica.engine.request import ErrorKind

INVALID_REQUEST = "invalid request:"
REQUEST_FAILED = "request failed:"
ENGINE_FAILED = "engine failed:"
ENGINE_DEAD = "engine dead:"
UNAVAILABLE = "unavailable:"

_PREFIX = {
    ErrorKind.INVALID_INPUT: INVALID_REQUEST,
    ErrorKind.INTERNAL: REQUEST_FAILED,
    ErrorKind.ENGINE_DEAD: ENGINE_FAILED,
}


def with_prefix(prefix: str, message: str) -> str:
    return message if message.startswith(prefix) else f"{prefix} {message}"


def output_error_message(kind: ErrorKind | None, message: str) -> str:
    """The wire message of an error output (no kind: an internal failure of this request)."""
    return with_prefix(_PREFIX.get(kind, REQUEST_FAILED), message)
