"""Weights from anywhere: an `https://` weights URI, fetched once per host into a local cache.

`fetch(url, sha256)` returns the cached file `<cache>/<sha256>/<file name>`. A miss downloads
into a temporary file in the cache directory while hashing it, checks the SHA-256 the version
declares, and only then renames it into place (atomic on one filesystem): a cached file is
always a complete, verified one, and a wrong or truncated download never becomes one. A lock
file per hash makes concurrent fetchers on one host (two replicas starting, or registration and
an agent) download once. The server's certificate is checked against the system's CAs, or
`WEIGHTS_CA_FILE` (a PEM bundle, e.g. a private CA's); plain `http://` is refused.

Environment: `WEIGHTS_CACHE_DIR` (default `var/weights-cache` in the repository),
`WEIGHTS_CA_FILE`.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import ssl
import tempfile
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlsplit

import httpx

REPO = Path(__file__).resolve().parents[1]
_SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20


class WeightsError(ValueError):
    """The weights cannot be had: a bad URI or hash, an unreachable server, a hash mismatch."""


def is_remote(uri: str) -> bool:
    return uri.startswith(("https://", "http://"))


def check_remote(uri: str, sha256: str) -> None:
    """Refuse what `fetch` would refuse, before anything is stored (registration)."""
    if uri.startswith("http://"):
        raise WeightsError("weights over plain http:// are refused: use https://")
    parts = urlsplit(uri)
    if not parts.hostname or not Path(unquote(parts.path)).name:
        raise WeightsError(f"{uri!r} names no file to download")
    if not _SHA256.fullmatch(sha256 or ""):
        raise WeightsError("https:// weights need their SHA-256 (64 lowercase hex digits)")


def cache_dir(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("WEIGHTS_CACHE_DIR") or REPO / "var" / "weights-cache")


def cached_path(uri: str, sha256: str, root: Path) -> Path:
    return root / sha256 / Path(unquote(urlsplit(uri).path)).name


def fetch(uri: str, sha256: str, *, root: Path | None = None, ca_file: str | None = None,
          progress: Callable[[int, int | None], None] | None = None) -> Path:
    """The verified local copy of `uri` (see the module doc). `progress(done, total)` is
    called as bytes arrive."""
    check_remote(uri, sha256)
    root = cache_dir() if root is None else root
    target = cached_path(uri, sha256, root)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(root / f"{sha256}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another fetcher may be downloading it right now
        if target.is_file():
            return target
        ca_file = ca_file or os.environ.get("WEIGHTS_CA_FILE")
        _download(uri, sha256, target, ssl.create_default_context(cafile=ca_file) if ca_file
                  else True, progress)
    return target


def _download(uri: str, sha256: str, target: Path, verify: ssl.SSLContext | bool,
              progress) -> None:
    digest = hashlib.sha256()
    fd, partial = tempfile.mkstemp(prefix=".partial-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with httpx.stream("GET", uri, verify=verify, follow_redirects=True,
                                  timeout=httpx.Timeout(30.0, read=300.0)) as response:
                    if response.status_code != 200:
                        raise WeightsError(f"GET {uri}: HTTP {response.status_code}")
                    total = int(response.headers.get("content-length", 0)) or None
                    done = 0
                    for chunk in response.iter_bytes(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, total)
            except httpx.HTTPError as exc:
                raise WeightsError(f"GET {uri} failed: {exc}") from exc
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise WeightsError(f"{uri}: SHA-256 is {digest.hexdigest()}, the version declares "
                               f"{sha256}: refusing these weights (fix the URI or the hash)")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
