"""Chained hashes of full token blocks.

Block i's hash covers every token of blocks 0..i (through the previous block's hash) and the
cache salt, so equal hashes mean equal prefixes up to a hash collision; a collision is caught by
the token check on every hit (see PrefixCache). Stable across processes (blake2b, not Python's
randomised `hash`), so the platform's router computes the same hashes as the engine.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

ROOT_HASH = 0


def hash_block(parent_hash: int, token_ids: Sequence[int], cache_salt: str = "") -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(parent_hash.to_bytes(8, "little"))
    if cache_salt:
        h.update(cache_salt.encode("utf-8"))
    h.update(b"\x00")
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little")


def hash_full_blocks(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str = "",
    known: Sequence[int] = (),
) -> list[int]:
    """Hashes of every full block of `token_ids`; `known` are already-computed leading hashes."""
    hashes = list(known)
    parent = hashes[-1] if hashes else ROOT_HASH
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], cache_salt)
        hashes.append(parent)
    return hashes
