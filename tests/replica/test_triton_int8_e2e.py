"""End to end: `python -m replica.launch --quantization int8` serves SmolLM2 with int8 weights in a
real tritonserver, and its greedy text is the in-process int8 engine's, token for token."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from replica.engine.config import EngineConfig
from replica.engine.llm_engine import LLMEngine
from replica.engine.models.loader import default_model_path
from replica.engine.sampling_params import SamplingParams
from scripts.services import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The three primary colours are"


def test_int8_replica_serves_what_the_int8_engine_generates(tmp_path):
    grpc_port, http_port, metrics_port = free_ports(3)
    command = [sys.executable, "-m", "replica.launch", "--model", "chat-int8", "--quantization", "int8",
               "--dtype", "float32", "--kv-cache-bytes", str(32 << 20), "--grpc-port", str(grpc_port),
               "--http-port", str(http_port), "--metrics-port", str(metrics_port), "--workdir", str(tmp_path),
               "--drain-grace-s", "5"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = ""
        deadline = time.monotonic() + 600
        for line in process.stdout:
            if line.startswith("replica ready:"):
                ready = line
                break
            assert time.monotonic() < deadline, "replica did not become ready"
        assert "quantization=int8" in ready, ready
        body = {"text_input": PROMPT, "stream": False, "exclude_input_in_output": True,
                "sampling_parameters": json.dumps({"max_tokens": 12, "temperature": 0, "ignore_eos": True})}
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/models/chat-int8/generate",
                                         data=json.dumps(body).encode())
        served = json.loads(urllib.request.urlopen(request, timeout=120).read())
        assert served["num_output_tokens"] == 12 and served["finish_reason"] == "length"
        assert "quantization int8" in (tmp_path / "tritonserver.log").read_text(errors="replace")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    engine = LLMEngine.from_config(EngineConfig(model_path=default_model_path(), dtype="float32", quantization="int8",
                                                kv_cache_bytes=32 << 20))
    ids = engine.tokenizer.encode(PROMPT)
    expected = engine.generate([ids], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
    assert served["text_output"] == engine.tokenizer.decode(expected)
