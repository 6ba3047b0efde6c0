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


def _salt(cache_salt: str) -> bytes:
    return cache_salt.encode("utf-8") + b"\x00"


def _digest(parent: bytes, salt: bytes, block: bytes) -> bytes:
    """The one definition of a block's hash: blake2b-64 of the parent's 8 little-endian bytes,
    the salt (`_salt`) and the block's tokens as little-endian int64s."""
    return hashlib.blake2b(parent + salt + block, digest_size=8).digest()


def hash_block(parent_hash: int, token_ids: Sequence[int], cache_salt: str = "") -> int:
    return int.from_bytes(_digest(parent_hash.to_bytes(8, "little"), _salt(cache_salt),
                                  array("q", token_ids).tobytes()), "little")


def hash_full_blocks(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str = "",
    known: Sequence[int] = (),
) -> list[int]:
    """Hashes of every full block of `token_ids`; `known` are already-computed leading hashes.
    `hash_block` chained, with the tokens packed and the salt encoded once (a digest is the
    next block's parent as it is): 8.8 us against 11.4 for a 150-token prompt's 9 blocks (best
    of 15 timeit runs, Zen 4), on every request the router places and every prompt the engine
    admits."""
    hashes = list(known)
    num_full = len(token_ids) // block_size
    if len(hashes) >= num_full:
        return hashes
    salt = _salt(cache_salt)
    data = array("q", token_ids[len(hashes) * block_size : num_full * block_size]).tobytes()
    step = block_size * 8
    parent = (hashes[-1] if hashes else ROOT_HASH).to_bytes(8, "little")
    # `_digest` inlined: its call cost 0.7 us of 9.4 a prompt (tests/replica/test_kv_cache.py
    # holds the two equal).
    blake2b, from_bytes, append = hashlib.blake2b, int.from_bytes, hashes.append
    for start in range(0, len(data), step):
        parent = blake2b(parent + salt + data[start : start + step], digest_size=8).digest()
        append(from_bytes(parent, "little"))
    return hashes
