"""requirements/: one pinned list per role; each role's list holds only what that role runs.

web.txt (daphne, Celery, billing consumer: the `web` and `worker` images) < node.txt (+ the
engine and tritonserver: the `node` images) < dev.txt (+ tests, benchmarks, local services:
never in an image). A pin appears once, in the lowest role that needs it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements"
PIN = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(\[[a-z,]+\])?==(?P<version>[^\s;#]+)")


def _lines(name: str) -> list[str]:
    lines = []
    for raw in (REQUIREMENTS / name).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def _pins(name: str) -> dict[str, str]:
    """The file's own pins (not those of the files it includes), by normalised name."""
    pins = {}
    for line in _lines(name):
        if line.startswith("-r "):
            continue
        match = PIN.match(line)
        assert match, f"{name}: not pinned with ==: {line!r}"
        pins[re.sub(r"[-_.]+", "-", match["name"]).lower()] = match["version"]
    return pins


def _includes(name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in _lines(name) if line.startswith("-r ")]


def test_roles_include_each_other_in_order():
    assert _includes("web.txt") == []
    assert _includes("node.txt") == ["web.txt"]
    assert _includes("dev.txt") == ["node.txt"]


@pytest.mark.parametrize("name", ["web.txt", "node.txt", "dev.txt"])
def test_every_requirement_is_pinned(name):
    assert _pins(name)


def test_web_role_has_no_engine_or_test_packages():
    web = set(_pins("web.txt"))
    assert web.isdisjoint({"torch", "nvidia-pytriton", "safetensors", "transformers", "gguf"})
    assert web.isdisjoint({"pytest", "pytest-django", "hypothesis", "openai", "playwright"})


def test_node_role_adds_the_engine_and_no_test_tools():
    node = set(_pins("node.txt"))
    assert {"torch", "nvidia-pytriton", "safetensors"} <= node
    assert node.isdisjoint({"pytest", "hypothesis", "openai", "playwright", "transformers"})


def test_a_pin_is_never_contradicted_across_roles():
    seen: dict[str, tuple[str, str]] = {}
    for name in ("web.txt", "node.txt", "dev.txt"):
        for package, version in _pins(name).items():
            if package in seen:
                assert seen[package][1] == version, (package, seen[package], (name, version))
            seen[package] = (name, version)
