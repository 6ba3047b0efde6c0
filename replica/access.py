"""Who may call a replica: the platform, which holds the replica access token.

Triton's restricted-protocol options make the server refuse every call of a restricted group
that lacks one header with one value. Every group is restricted except `health` (readiness
says nothing and orchestrators probe it); the platform sends the header on health calls too.

Invariants:
- the token is derived from the platform's REPLICA_SECRET (`access_token`), hex, so it is safe
  in a header and a command-line flag, and the secret itself never leaves the platform's and
  node agents' settings;
- a launcher receives the token through its environment (`TOKEN_ENV`), never its own command
  line; tritonserver has no other way to take it than its command line (visible in `ps` on
  that node only: see docs/security.md);
- a replica without a token serves anyone who can reach it, so it binds loopback only
  (`check_bind`).
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress

TOKEN_ENV = "REPLICA_ACCESS_TOKEN"
HEADER_KEY = "llmp-replica-token"  # gRPC sends it as triton-grpc-protocol-<key> (lowercase)
GRPC_HEADER = f"triton-grpc-protocol-{HEADER_KEY}"
RESTRICTED_GROUPS = ("inference", "metadata", "shared-memory", "model-config",
                     "model-repository", "statistics", "trace", "logging")
LOOPBACK = "127.0.0.1"


def access_token(secret: str) -> str:
    """The replica access token of a platform secret ('' when there is none)."""
    if not secret:
        return ""
    return hmac.new(secret.encode("utf-8"), b"llmp replica access token v1", hashlib.sha256).hexdigest()


def grpc_headers(token: str) -> dict[str, str] | None:
    """The metadata every gRPC call to a replica carries (None: no token)."""
    return {GRPC_HEADER: token} if token else None


def http_headers(token: str) -> dict[str, str]:
    return {HEADER_KEY: token} if token else {}


def server_flags(token: str) -> list[str]:
    """tritonserver flags that refuse every restricted group without the token."""
    if not token:
        return []
    if not token.isalnum():
        raise ValueError("a replica access token is letters and digits only")
    groups = ",".join(RESTRICTED_GROUPS)
    return [f"--grpc-restricted-protocol={groups}:{HEADER_KEY}={token}",
            f"--http-restricted-api={groups}:{HEADER_KEY}={token}"]


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check_bind(bind_address: str, token: str) -> None:
    """Refuse to serve anyone beyond this host without a token (ValueError)."""
    if not token and not is_loopback(bind_address):
        raise ValueError(f"refusing to bind {bind_address} without a replica access token "
                         f"(set {TOKEN_ENV}, or bind {LOOPBACK})")
