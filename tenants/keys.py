"""API key format: `llmp_<8 visible chars>_<43 secret chars>`; the first two parts are the prefix."""
from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_SCHEME = "llmp"
VISIBLE_LEN = 8


def generate_key() -> tuple[str, str]:
    """A new key and its visible prefix. The key itself is never stored."""
    visible = secrets.token_hex(VISIBLE_LEN // 2)
    secret = secrets.token_urlsafe(32)
    prefix = f"{KEY_SCHEME}_{visible}"
    return f"{prefix}_{secret}", prefix


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def prefix_of(raw_key: str) -> str | None:
    """The visible prefix of a well-formed key, else None (so junk never reaches the database:
    a NUL or a lone surrogate in a presented key would fail there, not as a refusal)."""
    if not (raw_key.isascii() and raw_key.isprintable()):
        return None
    parts = raw_key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_SCHEME or len(parts[1]) != VISIBLE_LEN or not parts[2]:
        return None
    return f"{parts[0]}_{parts[1]}"


def hashes_match(stored_hash: str, raw_key: str) -> bool:
    """Constant-time comparison of a stored hash with the hash of a presented key."""
    return hmac.compare_digest(stored_hash.encode("ascii"), hash_key(raw_key).encode("ascii"))
