"""EngineLoop: the one thread that owns an LLMEngine and serves requests from other threads.

Invariants:
- Only the loop thread touches the engine (add, abort, step, stats). Other threads talk to it
  through `submit` / `abort` / `drain` / `stop`, which only queue commands under a lock.
- Every submitted request gets exactly one final `RequestOutput` (finished=True) through its
  `on_output`: a normal finish, an abort (client cancel, drain deadline, stop), or an error output
  (`error` and `error_kind` set) when the engine refused it later (INVALID_INPUT), failed it alone
  (INTERNAL, llm_engine.py) or the loop thread died (ENGINE_DEAD).
- The loop dies only on what escapes `engine.step()` and the loop's own bookkeeping (EngineFault,
  a bug); then every open request gets an ENGINE_DEAD error, `submit` raises EngineDeadError
  from then on, and `on_dead` (if given) is called once with the exception, on the dying thread.
- Callbacks run on the loop thread and must be quick; one that raises aborts its own request and
  nobody else's.
- The thread sleeps on a condition while the engine has nothing to do (no busy spin).
- The loop depends on the `Engine` protocol only (LLMEngine is one; the tests drive others).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from replica.engine.request import ErrorKind, FinishReason, RequestOutput
from replica.engine.sampling_params import InvalidRequestError, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """What EngineLoop drives (replica/engine/llm_engine.py's LLMEngine). All calls come from
    the loop thread, except `check_prompt`, which reads only what never changes."""

    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raise InvalidRequestError for a prompt the engine would refuse."""

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams, *,
                    priority: int = 0, tenant: str = "", cache_salt: str = "") -> None: ...

    def abort_request(self, request_id: str) -> RequestOutput | None: ...

    def step(self) -> list[RequestOutput]: ...

    def has_unfinished_requests(self) -> bool: ...

    def stats(self) -> Any: ...


OutputCallback = Callable[[RequestOutput], None]
TickCallback = Callable[[Any], None]  # receives engine.stats()
DeadCallback = Callable[[BaseException], None]

_NEW, _RUNNING, _DRAINING, _STOPPED, _DEAD = "new", "running", "draining", "stopped", "dead"


class EngineUnavailableError(RuntimeError):
    """The loop takes no new work: draining, stopped, never started or dead."""


class EngineDeadError(EngineUnavailableError):
    """The loop thread died: this engine serves nothing any more."""


class InjectedFault(RuntimeError):
    """Raised on the loop thread by `inject_fault` (fault-injection tests and benchmarks)."""


@dataclass
class LoopTiming:
    """Cumulative seconds in `engine.step()` and in output callbacks (sending responses)."""

    num_steps: int = 0
    num_outputs: int = 0
    step_s: float = 0.0
    callback_s: float = 0.0

    def record(self, step_s: float, callback_s: float, num_outputs: int) -> None:
        self.num_steps += 1
        self.num_outputs += num_outputs
        self.step_s += step_s
        self.callback_s += callback_s

    def summary(self) -> str:
        per_output_us = 1e6 * self.callback_s / max(1, self.num_outputs)
        return (f"{self.num_steps} steps in {self.step_s:.2f}s, {self.num_outputs} outputs sent in "
                f"{self.callback_s:.3f}s ({per_output_us:.0f} us per output)")


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    tenant: str
    cache_salt: str


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Fault:
    message: str


class EngineLoop:
    """Runs `engine.step()` in a dedicated thread while any request is open."""

    def __init__(
        self,
        engine: Engine,
        *,
        on_tick: TickCallback | None = None,
        on_dead: DeadCallback | None = None,
        tick_interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
        thread_name: str = "engine-loop",
    ) -> None:
        self._engine = engine
        self._on_tick = on_tick
        self._on_dead = on_dead
        self._tick_interval_s = tick_interval_s
        self._clock = clock
        self._log = logger or logging.getLogger(__name__)
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

        self._cond = threading.Condition()
        # Guarded by _cond:
        self._state = _NEW
        self._commands: deque[_Add | _Abort | _Fault] = deque()
        self._open: dict[str, OutputCallback] = {}  # submitted, final output not yet delivered
        self._drain_deadline: float | None = None
        self._stop_requested = False
        self._error: BaseException | None = None
        # Written by the loop thread only: where its time goes (engine steps vs. our callbacks).
        self.timing = LoopTiming()

    # ---- called from any thread -------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            if self._state != _NEW:
                raise RuntimeError(f"EngineLoop already {self._state}")
            self._state = _RUNNING
        self._thread.start()

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        tenant: str = "",
        cache_salt: str = "",
        *,
        on_output: OutputCallback,
    ) -> None:
        """Queue a request. Raises InvalidRequestError or EngineUnavailableError synchronously;
        once it returns, `on_output` will eventually see exactly one finished output."""
        self._validate(request_id, prompt_token_ids, params)
        with self._cond:
            if self._state == _DEAD:
                raise EngineDeadError(self._unavailable_reason())
            if self._state != _RUNNING:
                raise EngineUnavailableError(self._unavailable_reason())
            if request_id in self._open:
                raise InvalidRequestError(f"duplicate request id {request_id!r}")
            self._open[request_id] = on_output
            self._commands.append(
                _Add(request_id, list(prompt_token_ids), params, int(priority), tenant, cache_salt)
            )
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        """Abort an open request (no-op when unknown or already finished)."""
        with self._cond:
            if request_id in self._open and self._state in (_RUNNING, _DRAINING):
                self._commands.append(_Abort(request_id))
                self._cond.notify()

    def inject_fault(self, message: str = "injected fault") -> None:
        """Kill the loop thread as a bug would (InjectedFault raised on it): for fault-injection
        tests and benchmarks only."""
        with self._cond:
            if self._state in (_RUNNING, _DRAINING):
                self._commands.append(_Fault(message))
                self._cond.notify()

    def drain(self, grace_s: float) -> None:
        """Refuse new work from now on; abort whatever is still open after `grace_s`."""
        with self._cond:
            if self._state == _RUNNING:
                self._state = _DRAINING
                self._drain_deadline = self._clock() + max(0.0, grace_s)
                self._cond.notify_all()

    def wait_drained(self, timeout_s: float | None = None) -> bool:
        """Block until no request is open (after `drain`, until the loop is quiescent)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._open, timeout=timeout_s)

    def stop(self, timeout_s: float | None = 10.0) -> None:
        """Abort everything still open and end the thread."""
        with self._cond:
            if self._state == _NEW:
                self._state = _STOPPED
                return
            self._stop_requested = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    @property
    def is_accepting(self) -> bool:
        with self._cond:
            return self._state == _RUNNING

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def is_dead(self) -> bool:
        """The loop thread died (not stopped): the engine serves nothing any more."""
        with self._cond:
            return self._state == _DEAD

    @property
    def num_open(self) -> int:
        with self._cond:
            return len(self._open)

    # ---- validation (caller's thread; reads only immutable engine facts) --------------------

    def _validate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request id must be a non-empty string")
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("sampling parameters must be a SamplingParams")
        self._engine.check_prompt(prompt_token_ids)  # the engine's one prompt check, refused now

    def _unavailable_reason(self) -> str:
        if self._state == _DRAINING:
            return "the replica is draining and takes no new requests"
        if self._state == _DEAD:
            return f"the engine failed: {self._error!r}"
        if self._state == _NEW:
            return "the engine loop has not started"
        return "the engine loop is stopped"

    # ---- the loop thread ----------------------------------------------------------------------

    def _run(self) -> None:
        busy = False
        last_tick = self._clock()
        try:
            while True:
                with self._cond:
                    while not (self._commands or busy or self._stop_requested or self._drain_due()):
                        self._cond.wait(self._wait_timeout())
                    if self._stop_requested:
                        self._state = _STOPPED  # from here on submit() refuses
                    commands = list(self._commands)
                    self._commands.clear()
                    stop, drain_due = self._stop_requested, self._drain_due()
                for command in commands:
                    self._apply(command)
                if stop or drain_due:
                    self._abort_all_open()
                if stop:
                    break
                if self._engine.has_unfinished_requests():
                    started = time.perf_counter()
                    outputs = self._engine.step()
                    stepped = time.perf_counter()
                    self._deliver(outputs)
                    self.timing.record(stepped - started, time.perf_counter() - stepped, len(outputs))
                was_busy, busy = busy, self._engine.has_unfinished_requests()
                now = self._clock()
                if self._on_tick is not None and (now - last_tick >= self._tick_interval_s or (was_busy and not busy)):
                    last_tick = now
                    self._tick()
        except BaseException as exc:  # noqa: BLE001 - a dead loop must fail every open request
            self._die(exc)
            return
        with self._cond:
            self._state = _STOPPED
            self._cond.notify_all()

    def _drain_due(self) -> bool:
        return (
            self._state == _DRAINING
            and bool(self._open)
            and self._drain_deadline is not None
            and self._clock() >= self._drain_deadline
        )

    def _wait_timeout(self) -> float | None:
        if self._state == _DRAINING and self._open and self._drain_deadline is not None:
            return max(0.0, self._drain_deadline - self._clock())
        return None

    def _apply(self, command: _Add | _Abort | _Fault) -> None:
        if isinstance(command, _Abort):
            self._abort(command.request_id)
            return
        if isinstance(command, _Fault):
            raise InjectedFault(command.message)
        try:
            self._engine.add_request(
                command.request_id,
                command.prompt_token_ids,
                command.params,
                priority=command.priority,
                tenant=command.tenant,
                cache_salt=command.cache_salt,
            )
        except InvalidRequestError as exc:
            self._finish_with(command.request_id, _error_output(
                command.request_id, f"invalid request: {exc}", ErrorKind.INVALID_INPUT))
        except Exception as exc:  # noqa: BLE001 - one request's admission must not kill the loop
            self._log.exception("adding request %s failed", command.request_id)
            self._engine.abort_request(command.request_id)  # whatever part of it got in
            self._finish_with(command.request_id, _error_output(
                command.request_id, f"request failed: {exc!r}", ErrorKind.INTERNAL))

    def _abort(self, request_id: str) -> None:
        with self._cond:
            if request_id not in self._open:
                return
        final = self._engine.abort_request(request_id)
        self._finish_with(request_id, final or _abort_output(request_id))

    def _abort_all_open(self) -> None:
        with self._cond:
            request_ids = list(self._open)
        for request_id in request_ids:
            self._abort(request_id)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            with self._cond:
                callback = self._open.get(output.request_id)
                if callback is not None and output.finished:
                    del self._open[output.request_id]
                    self._cond.notify_all()
            if callback is None:
                continue
            if not self._call(callback, output) and not output.finished:
                self._abort_silently(output.request_id)

    def _finish_with(self, request_id: str, output: RequestOutput) -> None:
        with self._cond:
            callback = self._open.pop(request_id, None)
            self._cond.notify_all()
        if callback is not None:
            self._call(callback, output)

    def _abort_silently(self, request_id: str) -> None:
        """The request's own callback failed: free its engine state without calling it again."""
        with self._cond:
            self._open.pop(request_id, None)
            self._cond.notify_all()
        self._engine.abort_request(request_id)

    def _call(self, callback: OutputCallback, output: RequestOutput) -> bool:
        try:
            callback(output)
            return True
        except Exception:  # noqa: BLE001 - one request's sender must not take the loop down
            self._log.exception("on_output failed for request %s; aborting it", output.request_id)
            return False

    def _tick(self) -> None:
        try:
            self._on_tick(self._engine.stats())  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - metrics and polling are best effort
            self._log.exception("on_tick failed")

    def _die(self, exc: BaseException) -> None:
        self._log.error("engine loop died", exc_info=exc)
        with self._cond:
            self._state = _DEAD
            self._error = exc
            open_requests = dict(self._open)
            self._open.clear()
            self._commands.clear()
            self._cond.notify_all()
        for request_id, callback in open_requests.items():
            self._call(callback, _error_output(request_id, f"engine failed: {exc!r}", ErrorKind.ENGINE_DEAD))
        if self._on_dead is not None:
            try:
                self._on_dead(exc)
            except Exception:  # noqa: BLE001 - the loop is dead either way
                self._log.exception("on_dead failed")


def _abort_output(request_id: str) -> RequestOutput:
    return RequestOutput(request_id, [], "", True, FinishReason.ABORT, 0, 0, 0)


def _error_output(request_id: str, message: str, kind: ErrorKind) -> RequestOutput:
    return RequestOutput(request_id, [], "", True, FinishReason.ABORT, 0, 0, 0, error=message, error_kind=kind)
