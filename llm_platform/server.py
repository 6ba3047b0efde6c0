"""`python -m llm_platform.server [daphne options] APPLICATION`: daphne on uvloop's event loop.

daphne runs Twisted's asyncio reactor on an event loop it creates when `daphne.server` is
imported (`asyncio.new_event_loop()`, from the event loop policy in force then). This module
installs uvloop's policy first, then hands the command line to daphne's own CLI, so the same
daphne (HTTP parsing, WebSockets, Channels) runs on libuv's loop, whose scheduling, timers and
transports are in C: the stock loop's own bookkeeping (`_run_once`, handles, `call_soon`,
futures, tasks) was about a tenth of the API process's CPU per short request (profile in
benchmarks/README.md, "gateway").

The HTTP/1.1 daphne speaks is llm_platform.lean_http's (llhttp through httptools) unless
`API_HTTP_PROTOCOL` is `daphne` (Twisted's own; unset or empty: `lean`): installed here too,
before daphne's server is built.

`API_EVENT_LOOP` chooses: `uvloop` (unset or empty: the default) or `asyncio` (the standard
library's loop, e.g. to compare, or on a platform without uvloop). Used by
llm_platform.web_processes (the web image, `make serve`, the benchmarks) and the e2e tests'
daphne.
"""
from __future__ import annotations

import asyncio
import os
import sys

EVENT_LOOPS = ("uvloop", "asyncio")
HTTP_PROTOCOLS = ("lean", "daphne")


def _choice(name: str, choices: tuple[str, ...]) -> str:
    """The environment variable `name`, one of `choices` (unset or empty: the first)."""
    choice = os.environ.get(name, "").strip() or choices[0]
    if choice not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {choice!r}")
    return choice


def event_loop_choice() -> str:
    return _choice("API_EVENT_LOOP", EVENT_LOOPS)


def http_protocol_choice() -> str:
    return _choice("API_HTTP_PROTOCOL", HTTP_PROTOCOLS)


def install_event_loop(choice: str) -> None:
    """Before daphne.server is imported: its reactor's loop comes from this policy."""
    if "daphne.server" in sys.modules:
        raise RuntimeError("daphne.server is already imported: its event loop exists")
    if choice == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main() -> None:
    install_event_loop(event_loop_choice())
    if http_protocol_choice() == "lean":
        from llm_platform.lean_http import install

        install()
    from daphne.cli import CommandLineInterface

    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
