"""daphne's reactor runs on the event loop API_EVENT_LOOP chooses, with the HTTP protocol
API_HTTP_PROTOCOL chooses (llm_platform/server.py): uvloop and lean_http by default. Each check
runs in a fresh interpreter: the loop policy and Twisted's reactor are process-wide, and the
test process has its own."""
from __future__ import annotations

import subprocess
import sys

import pytest

from llm_platform.server import event_loop_choice, http_protocol_choice
from tests.support.processes import REPO

REACTOR_LOOP = ("from llm_platform.server import install_event_loop; "
                "install_event_loop({choice!r}); "
                "import daphne.server; from twisted.internet import reactor; "
                "loop = reactor._asyncioEventloop; print(type(loop).__module__)")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("value, choice", [(None, "uvloop"), ("", "uvloop"),
                                           ("uvloop", "uvloop"), (" asyncio ", "asyncio")])
def test_the_choice(monkeypatch, value, choice):
    if value is None:
        monkeypatch.delenv("API_EVENT_LOOP", raising=False)
    else:
        monkeypatch.setenv("API_EVENT_LOOP", value)
    assert event_loop_choice() == choice


def test_an_unknown_loop_is_refused(monkeypatch):
    monkeypatch.setenv("API_EVENT_LOOP", "trio")
    with pytest.raises(ValueError, match="API_EVENT_LOOP"):
        event_loop_choice()


@pytest.mark.parametrize("choice, module", [("uvloop", "uvloop"), ("asyncio", "asyncio.unix_events")])
def test_daphnes_reactor_runs_on_the_chosen_loop(choice, module):
    done = _run(REACTOR_LOOP.format(choice=choice))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == module


def test_too_late_once_daphne_made_its_loop():
    done = _run("import daphne.server; from llm_platform.server import install_event_loop; "
                "install_event_loop('uvloop')")
    assert done.returncode != 0
    assert "already imported" in done.stderr


@pytest.mark.parametrize("value, choice", [(None, "lean"), ("", "lean"), (" daphne ", "daphne")])
def test_the_http_protocol_choice(monkeypatch, value, choice):
    """API_HTTP_PROTOCOL: llm_platform.lean_http by default, Twisted's own on request (the
    live protocol behaviour of both: tests/e2e/test_lean_http.py)."""
    if value is None:
        monkeypatch.delenv("API_HTTP_PROTOCOL", raising=False)
    else:
        monkeypatch.setenv("API_HTTP_PROTOCOL", value)
    assert http_protocol_choice() == choice
    monkeypatch.setenv("API_HTTP_PROTOCOL", "h2")
    with pytest.raises(ValueError, match="API_HTTP_PROTOCOL"):
        http_protocol_choice()
