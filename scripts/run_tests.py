"""`make test`: the whole pytest suite against real PostgreSQL and Redis (given, local, or
embedded under ./var/, as for `make serve`). Extra arguments go to pytest. pytest's own exit
status is returned, so 5 ("no tests collected") fails the run like any other failure."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.services import ensure_services  # noqa: E402


def main() -> int:
    services = ensure_services(REPO / "var")
    env = {**os.environ, "DATABASE_URL": services.database_url, "REDIS_URL": services.redis_url}
    try:
        return subprocess.call([sys.executable, "-m", "pytest", *sys.argv[1:]], cwd=REPO, env=env)
    finally:
        services.stop()


if __name__ == "__main__":
    sys.exit(main())
