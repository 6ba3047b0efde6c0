"""Random ids without a system call each: 32 hex digits (128 bits from the OS's CSPRNG, as
`uuid.uuid4().hex` has 122), cut from a buffer of `os.urandom` refilled every 256 ids.

`uuid.uuid4()` asks the kernel for 16 bytes every time (a getrandom call) and builds a UUID
object: a generation request takes three such ids (its request id, admission ticket, routing
lease), and under a burst each system call is a point where the kernel hands the API's core to
another process (the profile of round frontdoor14 charged 13 us to each, 0.3 us when measured
alone). Each thread has its own buffer, and a forked child starts a fresh one, so no two
callers are ever handed the same bytes.
"""
from __future__ import annotations

import os
import threading

_ID_BYTES = 16
_BUFFER_IDS = 256


class _Pool(threading.local):
    def __init__(self):
        self.buffer = b""
        self.offset = 0


_pool = _Pool()


def _reset_after_fork() -> None:
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_reset_after_fork)


def random_hex() -> str:
    """32 lowercase hex digits, from 16 bytes no other call gets."""
    pool = _pool
    offset = pool.offset
    if offset >= len(pool.buffer):
        pool.buffer, offset = os.urandom(_ID_BYTES * _BUFFER_IDS), 0
    pool.offset = offset + _ID_BYTES
    return pool.buffer[offset:offset + _ID_BYTES].hex()
