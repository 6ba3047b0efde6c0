"""`make serve`: the whole platform on this machine, stopped together with Ctrl-C.

PostgreSQL and Redis (given, local, or embedded under ./var/), migrations, the demo fleet
(tenant `demo` with one API key printed once; model `chat-small` v1 = bundled SmolLM2, with a
scaling policy of one replica), one node agent (node `local`: a Celery worker on `node.local`),
daphne, the billing consumer, a Celery worker and Celery beat. Beat's autoscaler places the
replica on the node; the agent starts it through replica.launch and marks it ready after a
warm-up request. The API is WEB_PROCESSES daphne processes (default: one per core) on one
port, a SO_REUSEPORT listening socket each (llm_platform/web_processes.py). Logs: var/logs/
(the replica's: var/logs/agents/).

Stop order (Ctrl-C): the API (its daphne processes) first, so that its in-flight requests end and send their
usage events while the replica and Redis are still up; then the node agent (it drains its
replica), Celery beat and worker; the billing consumer last, after it drained the usage stream
and this host's outbox; then the private PostgreSQL and Redis. The private Redis keeps its data
(append-only file under var/redis), so usage events not yet consumed survive a restart.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.services import ensure_services  # noqa: E402

VAR = REPO / "var"
LOGS = VAR / "logs"


# The API first (its last requests bill while everything else is up), the consumer last.
STOP_ORDER = ("api", "node-agent", "celery-beat", "celery-worker", "billing-consumer")
STOP_GRACE_SECONDS = {"api": 35, "node-agent": 60, "billing-consumer": 30}


def secret_key() -> str:
    """SECRET_KEY, else this install's own in var/secret_key (0600), created once; settings read
    the same file, so `manage.py` commands in this checkout share the key."""
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    path = VAR / "secret_key"
    if not path.exists():
        VAR.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never world-readable
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(48))
    return path.read_text().strip()


class Supervisor:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def manage(self, *args: str, check: bool = True) -> str:
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self.env,
                                capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout.strip()

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(LOGS / f"{name}.log", "ab")
        # A session of its own: Ctrl-C reaches this supervisor only, which stops children in order.
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def exited(self) -> list[tuple[str, int]]:
        return [(name, p.returncode) for name, p in self.procs if p.poll() is not None]

    def stop_all(self, order: tuple[str, ...] = STOP_ORDER) -> None:
        """Stop the processes one after another in `order` (then any others), each given its
        grace to finish before the next is told to stop."""
        rank = {name: i for i, name in enumerate(order)}
        for name, proc in sorted(self.procs, key=lambda item: rank.get(item[0], len(order))):
            if proc.poll() is not None:
                continue
            print(f"stopping {name} ...", flush=True)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_SECONDS.get(name, 20))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_ready(url: str, proc: subprocess.Popen, stop: threading.Event, what: str,
               deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not stop.is_set():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        stop.wait(0.5)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--embedded", action="store_true",
                        help="always start private PostgreSQL and Redis under ./var/")
    args = parser.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    services = ensure_services(VAR, force_embedded=args.embedded)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "llm_platform.settings",
        "DATABASE_URL": services.database_url,
        "REDIS_URL": services.redis_url,
        "SECRET_KEY": secret_key(),
        "PYTHONUNBUFFERED": "1",
    }
    env.setdefault("ALLOWED_HOSTS", f"localhost,127.0.0.1,{args.host}")
    env.setdefault("LOG_FORMAT", "console")  # var/logs/ for people; deployments keep JSON lines
    supervisor = Supervisor(env)
    try:
        print("migrating ...", flush=True)
        supervisor.manage("migrate", "--noinput")
        print(supervisor.manage("seeddemo"), flush=True)
        supervisor.start("node-agent", ["manage.py", "nodeagent", "--name", "local", "--zone",
                                        "local", "--cpu-slots", "2", "--memory-mib", "4096"])
        # WEB_PROCESSES daphne processes (default: one per core) on one port, a SO_REUSEPORT
        # socket each.
        supervisor.start("api", ["-m", "llm_platform.web_processes", "--host", args.host,
                                 "--port", str(args.port)])
        # Usage stream -> PostgreSQL; also replays this host's usage outbox (var/billing-outbox).
        supervisor.start("billing-consumer", ["manage.py", "billingconsumer",
                                              "--name", f"{os.uname().nodename}-serve"])
        supervisor.start("celery-worker", ["-m", "celery", "-A", "llm_platform", "worker",
                                           "--loglevel", "INFO", "--concurrency", "1"])
        supervisor.start("celery-beat", ["-m", "celery", "-A", "llm_platform", "beat",
                                         "--loglevel", "INFO", "--schedule",
                                         str(VAR / "celerybeat-schedule")])
        print(f"waiting for the replica (logs: {LOGS / 'agents'}) ...", flush=True)
        waiter = subprocess.Popen([sys.executable, "manage.py", "waitreplica", "chat-small"],
                                  cwd=REPO, env=env)
        while waiter.poll() is None and not stop.is_set():
            stop.wait(0.5)
        if waiter.poll() is None:
            waiter.terminate()
            waiter.wait()
        if waiter.returncode == 0:
            base = f"http://{args.host}:{args.port}"
            print(f"\nAPI base URL: {base}/v1   (admin: {base}/admin/, tenant dashboard: "
                  f"{base}/dashboard/ after `manage.py createmember USER demo`, logs: {LOGS})\n"
                  f"try: curl -N {base}/v1/chat/completions -H 'Authorization: Bearer <key>' "
                  "-H 'Content-Type: application/json' -d '{\"model\": \"chat-small\", "
                  "\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": true}'\n"
                  "Ctrl-C stops everything.", flush=True)
        while not stop.is_set():
            dead = supervisor.exited()
            if dead:
                print(f"exited unexpectedly: {dead}; see {LOGS}", file=sys.stderr, flush=True)
                return_code = 1
                break
            stop.wait(1.0)
        else:
            return_code = 0
    except RuntimeError as exc:
        print(f"make serve failed: {exc}", file=sys.stderr, flush=True)
        return_code = 1
    finally:
        supervisor.stop_all()  # API first; the node agent drains its replica; consumer last
        services.stop()
        print("stopped.", flush=True)
    return return_code


if __name__ == "__main__":
    sys.exit(main())
