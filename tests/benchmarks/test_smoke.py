"""Every benchmark that can run at a tiny size does, so none rots (`--smoke`; docs:
benchmarks/README.md). Each starts its own services as `make serve` finds them, so these run as
subprocesses, exactly as the README's commands. The ones that need real Triton replicas
(fairness, routing, quantization, engine at full size) are listed in benchmarks/README.md with
what they need."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(module: str, tmp_path: Path) -> dict | None:
    out = tmp_path / f"{module}.json"
    env = {**os.environ}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the benchmark configures Django itself
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--smoke", "--out",
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()) if out.exists() else None


def test_metering_smoke(tmp_path):
    result = _run("metering", tmp_path)
    # Every request of the overhead rounds answered 200 (a 429 from the tenant's own limit
    # used to stop the full run).
    assert result["num_requests_each"] == 4
    assert result["events_per_s"] > 0 and result["record_ms_p50"] > 0


def test_consoles_smoke(tmp_path):
    result = _run("consoles", tmp_path)
    assert result["worst_median_ms"] > 0


def test_autoscale_smoke(tmp_path):
    result = _run("autoscale", tmp_path)
    assert result is not None


def test_gateway_smoke(tmp_path):
    result = _run("gateway", tmp_path)
    fake = result["platform_only"]
    # The platform side reads through the lean client (benchmarks/raw_http.py): every stream's
    # tokens counted from its done event (2 streams of 4 tokens).
    assert fake["client"] == "raw" and fake["platform_tokens_per_s"] > 0
    assert fake["nonstream_requests_per_s"] > 0
    # The featureless front door ran beside it, through the same client, on the same replica.
    assert fake["floor_tokens_per_s"] > 0 and fake["floor_ttft_p50_ms"] > 0


def test_tensor_parallel_smoke(tmp_path):
    result = _run("tensor_parallel", tmp_path)
    assert set(result["step_ms_median"]) == {"1", "2"} and result["ratio_to_first_degree"]["1"] == 1.0
    assert all(ms > 0 for ms in result["step_ms_median"].values())
