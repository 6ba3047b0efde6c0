"""A tensor-parallel replica (N=2: rank 0 inside tritonserver, one worker process, gloo) behind a
real tritonserver: it is health-checked as one model, serves the greedy answers of the
single-device engine, drains as one replica (the worker stops with it), and a dead worker is a
dead engine (the launcher exits 3, as for any engine death: docs/engine-faults.md)."""
from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

grpc_aio = pytest.importorskip("tritonclient.grpc.aio")
from replica.engine.config import EngineConfig  # noqa: E402
from replica.engine.llm_engine import LLMEngine  # noqa: E402
from replica.engine.models.loader import default_model_path  # noqa: E402
from replica.engine.sampling_params import SamplingParams  # noqa: E402
from scripts.services import free_ports  # noqa: E402
from tests.replica.test_triton_e2e import KV_CACHE_BYTES, MODEL, PROMPTS, REPO_ROOT, _pump, generate  # noqa: E402
from tests.replica.test_triton_engine_death import _model_ready  # noqa: E402
from tests.support.waiting import async_wait_until  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
MAX_TOKENS = 12


class Launched:
    def __init__(self, tmp_path, tensor_parallel: int) -> None:
        grpc_port, http_port, metrics_port = free_ports(3)
        self.workdir = tmp_path / "replica"
        self.url = f"127.0.0.1:{grpc_port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "replica.launch", "--model", MODEL, "--dtype", "float32",
             "--tensor-parallel", str(tensor_parallel), "--num-threads", "2",
             "--kv-cache-bytes", str(KV_CACHE_BYTES), "--grpc-port", str(grpc_port), "--http-port", str(http_port),
             "--metrics-port", str(metrics_port), "--workdir", str(self.workdir), "--drain-grace-s", "30"],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=_pump, args=(self.process.stdout, self.lines), daemon=True).start()

    async def ready(self) -> str:
        deadline = time.monotonic() + 600
        while not any(line.startswith("replica ready:") for line in self.seen):
            line = await asyncio.to_thread(self.lines.get, True, max(0.1, deadline - time.monotonic()))
            assert line is not None and time.monotonic() < deadline, "\n".join(self.seen)
            self.seen.append(line)
        return self.seen[-1]

    def workers(self, ready_line: str) -> list[psutil.Process]:
        server = psutil.Process(int(re.search(r" pid=(\d+) ", ready_line).group(1)))
        return [p for p in server.children(recursive=True)
                if "replica.engine.parallel.worker" in " ".join(p.cmdline())]

    def output(self) -> str:
        rest = [line for line in iter(lambda: self.lines.get(timeout=5), None)]
        return "\n".join(self.seen + rest)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _single_device_answers() -> list[str]:
    engine = LLMEngine.from_config(EngineConfig(model_path=default_model_path(), dtype="float32",
                                                kv_cache_bytes=KV_CACHE_BYTES))
    ids = [engine.tokenizer.encode(p) for p in PROMPTS[:3]]
    tokens = engine.generate(ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    return [engine.tokenizer.decode(t) for t in tokens]


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.asyncio
async def test_a_tensor_parallel_replica_serves_single_device_answers_and_drains_as_one(tmp_path):
    replica = Launched(tmp_path, tensor_parallel=2)
    try:
        ready_line = await replica.ready()
        assert "tensor_parallel=2" in ready_line
        assert await _model_ready(replica.url)  # the fleet's health check: one model, one replica
        (worker,) = replica.workers(ready_line)

        client = grpc_aio.InferenceServerClient(replica.url)
        served = await asyncio.gather(*(generate(client, p, MAX_TOKENS) for p in PROMPTS[:3]))
        assert all(s.error is None and s.num_output_tokens == MAX_TOKENS for s in served), served
        expected = await asyncio.to_thread(_single_device_answers)
        assert [s.text for s in served] == expected

        started = asyncio.Event()
        in_flight = asyncio.create_task(generate(client, PROMPTS[3], 24, on_response=lambda g: started.set()))
        await asyncio.wait_for(started.wait(), 120)
        replica.process.send_signal(signal.SIGTERM)
        finished = await in_flight
        await client.close()
        code = await asyncio.to_thread(replica.process.wait, 120)
        output = replica.output()
        assert finished.error is None and finished.num_output_tokens == 24, finished
        assert code == 0 and "drained=True" in output, output
        await async_wait_until(lambda: _gone(worker), 30, "the worker to stop with its replica")
    finally:
        replica.kill()


@pytest.mark.asyncio
async def test_a_dead_worker_stops_the_replica(tmp_path):
    replica = Launched(tmp_path, tensor_parallel=2)
    try:
        ready_line = await replica.ready()
        (worker,) = replica.workers(ready_line)
        os.kill(worker.pid, signal.SIGKILL)
        killed = time.monotonic()
        code = await asyncio.to_thread(replica.process.wait, 120)
        output = replica.output()
        assert code == 3, output
        assert (f"replica failed: the engine died: InjectedFault('tensor-parallel worker rank 1 (pid {worker.pid}) "
                "exited with code -9')") in output
        assert not await _model_ready(replica.url)
        print(f"launcher exited {time.monotonic() - killed:.2f} s after the worker was killed")
    finally:
        replica.kill()
