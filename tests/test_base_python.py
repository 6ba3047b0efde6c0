"""scripts/base_python.sh: the interpreter `make install` makes .venv/ from (the Makefile's
PYTHON): the candidate (the distribution's CPython 3.11) when it can make a virtualenv, else
python3 from PATH."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "base_python.sh"


def choose(candidate: str | None = None) -> str:
    env = dict(os.environ)
    env.pop("BASE_PYTHON_CANDIDATE", None)
    if candidate is not None:
        env["BASE_PYTHON_CANDIDATE"] = candidate
    return subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _executable(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_candidate_that_makes_virtualenvs_is_chosen(tmp_path):
    # Stands for the distribution's interpreter: it answers `-c "import ensurepip, venv"`.
    python = _executable(tmp_path / "python3.11", 'exec python3 "$@"\n')
    assert choose(python) == python


def test_a_candidate_without_venv_support_or_missing_falls_back_to_python3(tmp_path):
    no_venv = _executable(tmp_path / "python3.11", "exit 1\n")  # e.g. no python3.11-venv
    assert choose(no_venv) == "python3"
    assert choose(str(tmp_path / "absent")) == "python3"


def test_the_interpreter_chosen_here_can_make_the_virtualenv():
    # The pinned wheels (requirements/*.txt) are CPython 3.11's.
    chosen = choose()
    out = subprocess.run([chosen, "-c", "import ensurepip, sys, venv; "
                          "print(sys.implementation.name, *sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["cpython", "3", "11"]


def test_the_makefile_makes_the_virtualenv_from_the_chosen_interpreter():
    dry_run = subprocess.run(["make", "-n", f"VENV={REPO / 'var' / 'no-such-venv'}", "install"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert f"{choose()} -m venv" in dry_run
