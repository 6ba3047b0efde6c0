"""The commands the README and docs/ tell a reader to run still exist and, where cheap, work.

- every `manage.py COMMAND` names a command Django knows; the operator commands that only
  touch the database run for real, with the arguments the docs show;
- every `python -m benchmarks.NAME` names a benchmark module; those with a `--smoke` mode run
  in tests/benchmarks/test_smoke.py (slow);
- every `make TARGET` is a Makefile target; `lint-imports` runs in tests/test_layering.py.
Commands that start the whole platform or need a replica (`make serve`, `nodeagent`, the curl
against a running server) are exercised by the e2e tests (tests/e2e/), not here.
"""
from __future__ import annotations

import importlib.util
import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command, get_commands

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
MANAGE = re.compile(r"manage\.py ([a-z_]+)")
BENCH = re.compile(r"python -m benchmarks\.([a-z_][a-z0-9_]*)")
MAKE = re.compile(r"`make ([a-z][a-z-]*)")


def _text() -> str:
    return "\n".join(path.read_text() for path in DOCS if path.exists())


def test_every_manage_command_in_the_docs_exists():
    named = set(MANAGE.findall(_text()))
    assert {"createtenant", "createapikey", "seeddemo", "rollout"} <= named
    assert named - set(get_commands()) == set()


def test_every_benchmark_in_the_docs_is_a_module():
    named = set(BENCH.findall(_text()))
    assert {"metering", "consoles", "autoscale", "gateway"} <= named
    missing = {name for name in named if importlib.util.find_spec(f"benchmarks.{name}") is None}
    assert missing == set()


def test_every_make_target_in_the_docs_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), re.M))
    named = set(MAKE.findall(_text()))
    assert {"serve", "test", "lint"} <= targets
    assert named - targets == set()


@pytest.mark.django_db
def test_the_operator_commands_run_as_documented():
    out = StringIO()
    call_command("createtenant", "acme", "--tier", "interactive", stdout=out)
    call_command("createapikey", "acme", stdout=out, stderr=StringIO())
    assert re.search(r"\w+_\w+", out.getvalue())
    call_command("registermodel", "chat-small", "--model-version", "2", "--weights",
                 "FILE.gguf", "--state", "staging", stdout=out)
    call_command("setprice", "chat-small", "--model-version", "2", "--input", "0.15",
                 "--output", "0.6", stdout=out)
    call_command("ensureroles", stdout=out)
    call_command("seeddemo", stdout=out)
    from billing.models import Price
    from models_registry.models import ModelVersion
    from tenants.models import Tenant

    assert Tenant.objects.filter(name__in=["acme", "demo"]).count() == 2
    version = ModelVersion.objects.get(model__name="chat-small", version_number=2)
    assert version.state == "staging" and Price.objects.filter(model_version=version).exists()
