"""A real replica whose engine loop dies (fault injection through its `fault` file, as a bug
would kill it): the request it was serving gets an "engine failed" error, the launcher stops the
server at once and exits 3 with the reason, and Triton's model readiness turns false."""
from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
import time

import pytest

grpc_aio = pytest.importorskip("tritonclient.grpc.aio")
from scripts.services import free_ports  # noqa: E402
from tests.support.waiting import async_wait_until  # noqa: E402
from tests.replica.test_triton_e2e import KV_CACHE_BYTES, MODEL, PROMPTS, REPO_ROOT, _pump, generate  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


async def _model_ready(url: str) -> bool:
    client = grpc_aio.InferenceServerClient(url)
    try:
        return bool(await asyncio.wait_for(client.is_model_ready(MODEL), 2.0))
    except Exception:  # noqa: BLE001 - refused, unreachable: not ready
        return False
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_a_dead_engine_fails_its_request_and_the_replica_stops_being_ready(tmp_path):
    grpc_port, http_port, metrics_port = free_ports(3)
    workdir = tmp_path / "replica"
    process = subprocess.Popen(
        [sys.executable, "-m", "replica.launch", "--model", MODEL, "--dtype", "float32",
         "--kv-cache-bytes", str(KV_CACHE_BYTES), "--grpc-port", str(grpc_port), "--http-port", str(http_port),
         "--metrics-port", str(metrics_port), "--workdir", str(workdir), "--drain-grace-s", "5"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
    seen: list[str] = []
    url = f"127.0.0.1:{grpc_port}"
    try:
        deadline = time.monotonic() + 600
        while not any(line.startswith("replica ready:") for line in seen):
            line = await asyncio.to_thread(lines.get, True, max(0.1, deadline - time.monotonic()))
            assert line is not None and time.monotonic() < deadline, "\n".join(seen)
            seen.append(line)
        assert await _model_ready(url)

        client = grpc_aio.InferenceServerClient(url)
        first = asyncio.Event()
        serving = asyncio.create_task(generate(client, PROMPTS[0], 4000, on_response=lambda g: first.set()))
        await asyncio.wait_for(first.wait(), 120)
        (workdir / "fault").write_text("chaos\n")
        killed = time.monotonic()
        result = await asyncio.wait_for(serving, 60)
        await client.close()
        assert result.error is not None and "engine failed:" in result.error and "chaos" in result.error, result

        async def not_ready() -> bool:
            return not await _model_ready(url)

        await async_wait_until(not_ready, 30, "the model not ready after its engine died", period_s=0.05)
        not_ready_after_s = time.monotonic() - killed
        code = await asyncio.to_thread(process.wait, 60)
        rest = [line for line in iter(lambda: lines.get(timeout=5), None)]
        output = "\n".join(seen + rest)
        assert code == 3, output
        assert "replica failed: the engine died: InjectedFault('chaos')" in output
        print(f"model not ready {not_ready_after_s:.2f} s after the engine died; launcher exited "
              f"{time.monotonic() - killed:.2f} s after")
        assert "engine-dead" in {p.name for p in workdir.iterdir()}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
