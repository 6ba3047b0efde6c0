"""`python -m llm_platform.web_processes [--host H] [--port P] [-- daphne options]`: the API as
several daphne processes sharing one listening socket.

The parent binds the sockets (accept backlog 1024: Twisted's default of 50 reset connections
when a few hundred clients arrived at once) and starts WEB_PROCESSES daphne processes (unset or
empty: one per CPU this process may run on; each on uvloop's event loop, llm_platform/server.py),
each given its socket with `--fd`. Where the kernel has SO_REUSEPORT (Linux), each process has
a listening socket of its own on the one port and the kernel spreads new connections over them
by a hash of their addresses; one socket shared by all (the fallback elsewhere) let whichever
process woke first accept a whole burst: 32 connections at once all went to one of two
processes in two tries of three (benchmarks/README.md, round frontdoor11). SO_REUSEPORT only
joins sockets of the same user, so no other user's process can bind into the set. Each process has its own event loop and connection
pools; everything the processes share (quotas, admission, routing, idempotency, usage) is in
Redis already, so nothing else changes with their number.

The parent forwards SIGTERM / SIGINT to every child, waits for them, and exits as soon as any
child exits (with its status), stopping the others: the orchestrator (Kubernetes, compose,
`make serve`) restarts the whole set rather than run with fewer processes than asked.
Used by the web image's command (deploy/), `make serve` (scripts/serve.py) and the benchmarks.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

from common.parent_death import dies_with_parent

BACKLOG = 1024
APPLICATION = "llm_platform.asgi:application"
STOP_GRACE_SECONDS = 30.0


def process_count() -> int:
    """WEB_PROCESSES, else one per CPU this process may run on."""
    value = os.environ.get("WEB_PROCESSES", "").strip()
    if value:
        count = int(value)
        if count < 1:
            raise ValueError(f"WEB_PROCESSES must be at least 1, not {value!r}")
        return count
    return len(os.sched_getaffinity(0))


def listen(host: str, port: int, backlog: int = BACKLOG, *,
           reuse_port: bool = False) -> socket.socket:
    """A listening socket (port 0: any free port; read it with getsockname())."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def listen_each(host: str, port: int, count: int, backlog: int = BACKLOG) -> list[socket.socket]:
    """`count` listening sockets on one port, one per process: SO_REUSEPORT where the kernel
    has it (it spreads connections over them), else one socket `count` times (shared)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        return [listen(host, port, backlog)] * count
    if port:  # a port already taken is an error, as without SO_REUSEPORT: a second platform
        listen(host, port, backlog).close()  # of this user must not join the first's set
    first = listen(host, port, backlog, reuse_port=True)
    port = first.getsockname()[1]  # port 0 asked for any: the rest join the one it got
    return [first, *(listen(host, port, backlog, reuse_port=True) for _ in range(count - 1))]


def server_command() -> list[str]:
    """daphne on the event loop API_EVENT_LOOP chooses (llm_platform/server.py: uvloop by
    default); daphne's options and the application follow."""
    return [sys.executable, "-m", "llm_platform.server"]


def single_endpoint(host: str, port: int) -> str:
    """`daphne -e` endpoint of one daphne that binds its own socket (the e2e tests, the chaos
    benchmark), with the same accept backlog as the shared socket."""
    return f"tcp:port={port}:interface={host}:backlog={BACKLOG}"


def daphne_command(fd: int, daphne_args: list[str]) -> list[str]:
    return [*server_command(), "--fd", str(fd), *daphne_args, APPLICATION]


def start(socks: list[socket.socket], daphne_args: list[str] = (), *,
          command: Callable[[int, list[str]], list[str]] = daphne_command,
          **popen) -> list[subprocess.Popen]:
    """A daphne process serving on each of `socks` (`listen_each`); `popen`: more
    subprocess.Popen arguments (env, cwd, stdout, start_new_session...); `command(fd, args)`:
    the process's command line (`daphne_command`).

    Each process gets SIGTERM from the kernel when this one dies, even by SIGKILL or the OOM
    killer (common/parent_death.py): it drains and exits instead of living on as an orphan
    that holds the port, which a restarted supervisor could then not bind (its check that the
    port is free fails)."""
    return [subprocess.Popen(dies_with_parent(command(sock.fileno(), list(daphne_args))),
                             pass_fds=(sock.fileno(),), **popen)
            for sock in socks]


def stop(procs: list[subprocess.Popen], grace_s: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM to all at once (each finishes its requests), SIGKILL after `grace_s`."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Stop(Exception):
    """SIGTERM or SIGINT: stop every API process."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("daphne_args", nargs=argparse.REMAINDER,
                        help="passed to every daphne (after `--`), e.g. --proxy-headers")
    args = parser.parse_args()
    daphne_args = [a for a in args.daphne_args if a != "--"]
    socks = listen_each(args.host, args.port, process_count())
    procs = start(socks, daphne_args)
    for sock in set(socks):
        sock.close()  # the children hold them
    print(f"{len(procs)} API processes on {args.host}:{args.port}: "
          f"{' '.join(str(p.pid) for p in procs)}", flush=True)
    return supervise(procs)


def supervise(procs: list[subprocess.Popen], grace_s: float = STOP_GRACE_SECONDS) -> int:
    """Until a child exits or SIGTERM / SIGINT comes, then `stop` them all; the exit status.

    Once the stop is under way, another SIGTERM or SIGINT (a process group signalled twice, a
    second Ctrl-C) is said on stderr and changes nothing: the stop ends within its grace,
    SIGKILL after. Raised again inside `stop`, it ended this process with a traceback while
    its children were still draining, and nothing killed them after the grace."""
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        if not stopping:
            stopping = True
            raise _Stop()
        os.write(2, f"signal {signum} while stopping: the stop goes on (SIGKILL after "
                    f"{grace_s:.0f} s)\n".encode())

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    status = 0
    try:
        pid, wait_status = os.wait()  # until a child exits (or a signal stops us)
        stopping = True
        status = os.waitstatus_to_exitcode(wait_status) or 1
        print(f"API process {pid} exited with {status}; stopping the others", file=sys.stderr,
              flush=True)
    except _Stop:
        pass
    stop(procs, grace_s)
    return status


if __name__ == "__main__":
    sys.exit(main())
