"""python -m benchmarks.gateway_profile: where the API process's CPU goes, by function.

Starts the fleet as `benchmarks.gateway --replica fake` does (the zero-cost fake replica, one
daphne), warms it up, then runs two phases while py-spy (`pip install py-spy`; not a
requirement) samples the daphne process with `--gil` (only samples where a thread held the GIL:
where the Python process's CPU went):

- `short`: `--requests` short non-streaming `/v1/generate` requests (`max_tokens` 1),
  `--concurrency` at a time;
- `stream`: `--rounds` rounds of `--streams` streams of `--max-tokens` tokens.

The client is benchmarks.gateway's (`--client raw` by default, or `httpx`), and the fleet has
as many admission slots as requests run at once, as there.

For each phase it prints the API process's CPU per request (or per token) measured during
the phase (py-spy's sampling adds to it: compare like with like) and the share of samples per
function, inclusive (the function and what it calls; a function counted once per sample) and
self (the sampled frame). The raw stacks stay in `--out-dir` (`python -m
benchmarks.gateway_profile --report FILE.txt` reads one again). Measurement only: the numbers
of record come from `benchmarks.gateway`.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from benchmarks.fleet import REPO, lift_tenant_limits, start_fleet
from benchmarks.gateway import api_processes, cpu_seconds, platform_caller, timed_round
from benchmarks.raw_http import RawClient

_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`function (path/to/module.py:123)` -> `module.py:function` (line numbers dropped)."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    return f"{os.path.basename(match['file'])}:{match['function']}"


def shares(raw_path: Path) -> tuple[int, collections.Counter, collections.Counter]:
    """(samples, inclusive counts, self counts) by function from py-spy's raw output."""
    inclusive: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";") if f and not f.startswith("process ")
                  and not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        for name in set(frames):
            inclusive[name] += n
        own[frames[-1]] += n
    return total, inclusive, own


def report(raw_path: Path, top: int) -> str:
    total, inclusive, own = shares(raw_path)
    if not total:
        return f"{raw_path}: no samples"
    lines = [f"{raw_path}: {total} samples (GIL held)", "", "inclusive:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in inclusive.most_common(top)]
    lines += ["", "self:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines)


def daphne_pids(fleet) -> list[int]:
    """The daphne processes (children of llm_platform.web_processes)."""
    return [p.pid for p in psutil.Process(fleet.api.pid).children(recursive=True)]


class Spy:
    """py-spy recording one process until stopped."""

    @staticmethod
    def executable() -> str | None:
        found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        return found if Path(found).exists() else None

    def __init__(self, pid: int, out: Path, rate: int):
        exe = self.executable()
        self.out = out
        self.proc = subprocess.Popen([exe, "record", "--gil", "--rate", str(rate), "--format",
                                      "raw", "--output", str(out), "--pid", str(pid)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        _, err = self.proc.communicate(timeout=60)
        if self.proc.returncode not in (0, -signal.SIGINT) or not self.out.exists():
            raise RuntimeError(f"py-spy failed ({self.proc.returncode}): {err.decode()[-500:]}")


async def run(args) -> None:
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # As benchmarks.gateway: as many admission slots as requests at once, so that none waits
    # for a slot (with the default of 16, 32 streams queued, and some were refused with 503).
    slots = max(args.streams, args.concurrency)
    fleet = start_fleet("fake", database=args.database,
                        extra_env={"ADMISSION_SLOTS_PER_REPLICA": str(slots)})
    try:
        lift_tenant_limits(fleet)  # 600 requests in seconds are past the tier's (429s)
        (pid,) = daphne_pids(fleet)
        api = api_processes(fleet)
        limits = httpx.Limits(max_connections=args.streams * 2,
                              max_keepalive_connections=args.streams)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            # The client of benchmarks.gateway (`--client raw`, the lean SSE reader, by
            # default): with httpx the client's own CPU paces the requests, and the API's CPU
            # per short request read 3.1 ms against 1.8 under the lean client, since requests
            # then arrive one by one and every write wakes an idle peer.
            raw = RawClient(fleet.base_url, max_connections=args.streams * 2)
            plat = platform_caller(args.client, raw, http, fleet)

            await timed_round(lambda i: plat(i, 8), 8)  # warm-up
            await timed_round(lambda i: plat(i, 1, stream=False), 32)
            sem = asyncio.Semaphore(args.concurrency)

            async def short(i):
                async with sem:
                    return await plat(i, 1, stream=False)

            for phase in args.phases:
                spy = Spy(pid, out_dir / f"{phase}.txt", args.rate) if not args.no_spy else None
                await asyncio.sleep(1.0)  # py-spy attaches
                cpu_before, start = cpu_seconds(api), time.perf_counter()
                if phase == "short":
                    await timed_round(short, args.requests)
                    work, unit = args.requests, "ms per request"
                else:
                    tokens = 0
                    for _ in range(args.rounds):
                        _, samples = await timed_round(
                            lambda i: plat(i, args.max_tokens), args.streams)
                        tokens += sum(s.output_tokens for s in samples)
                    work, unit = tokens, "us per token"
                wall = time.perf_counter() - start
                cpu = cpu_seconds(api) - cpu_before
                if spy is not None:
                    spy.stop()
                scale = 1e3 if phase == "short" else 1e6
                print(f"== {phase}: {work} in {wall:.2f} s, API CPU {cpu:.2f} s = "
                      f"{cpu * scale / work:.2f} {unit}; load {os.getloadavg()}", flush=True)
                if spy is not None:
                    print(report(spy.out, args.top), flush=True)
            await raw.aclose()
    finally:
        fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", nargs="+", choices=["short", "stream"],
                        default=["short", "stream"])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--out-dir", default="var/profile")
    parser.add_argument("--database", default="llm_platform_bench")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw",
                        help="as benchmarks.gateway's --client")
    parser.add_argument("--no-spy", action="store_true", help="the phases alone, no py-spy")
    parser.add_argument("--report", metavar="RAW", help="print the shares of a saved profile")
    args = parser.parse_args()
    if args.report:
        print(report(Path(args.report), args.top))
        return
    if not args.no_spy and Spy.executable() is None:
        raise SystemExit("gateway_profile: py-spy is not installed (it is not a requirement): "
                         f"{sys.executable} -m pip install py-spy, or run with --no-spy for the phases' CPU alone")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
