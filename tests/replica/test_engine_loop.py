"""EngineLoop against a scripted stand-in engine: threading, ordering, drain, death (no model)."""
from __future__ import annotations

import threading
import time

import pytest

from replica.engine.engine_loop import Engine, EngineDeadError, EngineLoop, EngineUnavailableError, InjectedFault
from replica.engine.request import ErrorKind, FinishReason, RequestOutput
from replica.engine.sampling_params import InvalidRequestError, SamplingParams
from tests.support.waiting import wait_until


class ScriptedEngine:
    """Emits one token per step per request until max_tokens; records which thread calls it.
    An `Engine` (engine_loop.py) as the loop sees it."""

    max_model_len = 32

    def __init__(self, *, step_sleep_s: float = 0.0, fail_on_step: int | None = None) -> None:
        self.requests: dict[str, list] = {}  # id -> [prompt_len, max_tokens, num_out]
        self.num_steps = 0
        self.caller_threads: set[str] = set()
        self.step_sleep_s = step_sleep_s
        self.fail_on_step = fail_on_step
        self.refuse_ids: set[str] = set()
        self.crash_ids: set[str] = set()

    def _touch(self) -> None:
        self.caller_threads.add(threading.current_thread().name)

    def check_prompt(self, prompt_token_ids):
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty")
        if len(prompt_token_ids) >= self.max_model_len:
            raise InvalidRequestError(f"the context window is {self.max_model_len} tokens")

    def add_request(self, request_id, prompt_token_ids, sampling_params, *, priority=0, tenant="", cache_salt=""):
        self._touch()
        if request_id in self.refuse_ids:
            raise InvalidRequestError("refused by the engine")
        if request_id in self.crash_ids:
            raise KeyError("a bug on admission")
        self.requests[request_id] = [len(prompt_token_ids), sampling_params.max_tokens, 0]

    def abort_request(self, request_id):
        self._touch()
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        return RequestOutput(request_id, [], "", True, FinishReason.ABORT, state[0], state[2], 0)

    def has_unfinished_requests(self):
        self._touch()
        return bool(self.requests)

    def step(self):
        self._touch()
        self.num_steps += 1
        if self.fail_on_step is not None and self.num_steps >= self.fail_on_step:
            raise RuntimeError("kaboom")
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)  # the scripted engine's step time
        outputs = []
        for request_id, state in list(self.requests.items()):
            state[2] += 1
            done = state[2] >= state[1]
            outputs.append(
                RequestOutput(request_id, [state[2]], f"t{state[2]} ", done,
                              FinishReason.LENGTH if done else None, state[0], state[2], 0)
            )
            if done:
                del self.requests[request_id]
        return outputs

    def stats(self):
        self._touch()
        return {"num_running": len(self.requests)}


class Collector:
    def __init__(self) -> None:
        self.outputs: dict[str, list[RequestOutput]] = {}
        self.done: dict[str, threading.Event] = {}

    def __call__(self, request_id: str):
        self.outputs[request_id] = []
        self.done[request_id] = threading.Event()

        def on_output(output: RequestOutput) -> None:
            self.outputs[request_id].append(output)
            if output.finished:
                self.done[request_id].set()

        return on_output

    def wait(self, *request_ids: str, timeout_s: float = 5.0) -> None:
        for request_id in request_ids:
            assert self.done[request_id].wait(timeout_s), f"{request_id} never finished"

    def text(self, request_id: str) -> str:
        return "".join(o.text_delta for o in self.outputs[request_id])


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


@pytest.fixture
def engine():
    return ScriptedEngine()


@pytest.fixture
def loop(engine):
    loop = EngineLoop(engine, thread_name="owner")
    loop.start()
    yield loop
    loop.stop()


def test_requests_stream_and_finish_exactly_once(engine, loop):
    got = Collector()
    loop.submit("a", [1, 2, 3], greedy(3), on_output=got("a"))
    loop.submit("b", [1], greedy(5), on_output=got("b"))
    got.wait("a", "b")
    assert got.text("a") == "t1 t2 t3 "
    assert [o.finished for o in got.outputs["b"]] == [False] * 4 + [True]
    assert got.outputs["b"][-1].finish_reason == FinishReason.LENGTH
    assert engine.caller_threads == {"owner"}  # nobody else touched the engine
    assert loop.num_open == 0


def test_invalid_requests_raise_synchronously_and_others_continue(engine, loop):
    got = Collector()
    with pytest.raises(InvalidRequestError, match="empty"):
        loop.submit("e", [], greedy(1), on_output=got("e"))
    with pytest.raises(InvalidRequestError, match="context window"):
        loop.submit("long", list(range(32)), greedy(1), on_output=got("long"))
    loop.submit("ok", [1], greedy(20), on_output=got("ok"))
    with pytest.raises(InvalidRequestError, match="duplicate"):
        loop.submit("ok", [1], greedy(1), on_output=got("dup"))
    got.wait("ok")
    assert got.outputs["ok"][-1].finish_reason == FinishReason.LENGTH


def test_engine_side_refusal_becomes_an_error_output(engine, loop):
    engine.refuse_ids.add("bad")
    got = Collector()
    loop.submit("bad", [1], greedy(2), on_output=got("bad"))
    loop.submit("good", [1], greedy(2), on_output=got("good"))
    got.wait("bad", "good")
    (only,) = got.outputs["bad"]
    assert only.finished and only.error.startswith("invalid request: refused")
    assert got.outputs["good"][-1].error is None


def test_abort_delivers_a_final_abort_and_frees_the_engine(loop, engine):
    engine.step_sleep_s = 0.001
    got = Collector()
    loop.submit("long", [1], greedy(10_000), on_output=got("long"))
    wait_until(lambda: got.outputs["long"], 5.0, "the first output of 'long'", period_s=0.001)
    loop.abort("long")
    got.wait("long")
    assert got.outputs["long"][-1].finish_reason == FinishReason.ABORT
    assert not engine.requests
    loop.abort("long")  # unknown by now: a no-op
    loop.abort("never-seen")


def test_a_failing_callback_aborts_only_its_request(loop, engine):
    got = Collector()

    def explode(output):
        raise ConnectionError("client gone")

    loop.submit("boom", [1], greedy(50), on_output=explode)
    loop.submit("fine", [1], greedy(5), on_output=got("fine"))
    got.wait("fine")
    assert got.outputs["fine"][-1].finish_reason == FinishReason.LENGTH
    assert loop.wait_drained(2.0)
    assert "boom" not in engine.requests


def test_idle_loop_sleeps_instead_of_spinning(loop, engine):
    got = Collector()
    loop.submit("a", [1], greedy(2), on_output=got("a"))
    got.wait("a")
    steps = engine.num_steps
    time.sleep(0.1)  # an observation window: nothing may happen in it (no event to wait for)
    assert engine.num_steps == steps


def test_drain_refuses_new_work_and_lets_inflight_finish_within_grace(engine):
    loop = EngineLoop(engine)
    loop.start()
    engine.step_sleep_s = 0.002
    got = Collector()
    loop.submit("short", [1], greedy(5), on_output=got("short"))
    loop.drain(grace_s=30.0)
    with pytest.raises(EngineUnavailableError, match="draining"):
        loop.submit("late", [1], greedy(1), on_output=got("late"))
    got.wait("short")
    assert got.outputs["short"][-1].finish_reason == FinishReason.LENGTH
    assert loop.wait_drained(1.0)
    loop.stop()


def test_drain_aborts_what_is_still_open_at_the_deadline(engine):
    now = [100.0]
    loop = EngineLoop(engine, clock=lambda: now[0])
    loop.start()
    engine.step_sleep_s = 0.001
    got = Collector()
    loop.submit("endless", [1], greedy(10**9), on_output=got("endless"))
    loop.drain(grace_s=5.0)
    # Every loop turn checks the drain deadline before its step: three steps after the drain
    # saw the clock short of it.
    after = engine.num_steps + 1  # the next step may have been decided before the drain
    wait_until(lambda: engine.num_steps >= after + 3, 5.0, "three steps after the drain")
    assert not got.done["endless"].is_set()  # the clock has not reached the deadline
    now[0] += 6.0
    got.wait("endless")
    assert got.outputs["endless"][-1].finish_reason == FinishReason.ABORT
    assert not engine.requests
    loop.stop()


def test_dead_thread_fails_every_open_request():
    engine = ScriptedEngine(fail_on_step=3)
    loop = EngineLoop(engine)
    loop.start()
    got = Collector()
    loop.submit("a", [1], greedy(100), on_output=got("a"))
    loop.submit("b", [1], greedy(100), on_output=got("b"))
    got.wait("a", "b")
    for request_id in "ab":
        final = got.outputs[request_id][-1]
        assert final.finished and "engine failed" in final.error and "kaboom" in final.error
    assert not loop.is_alive
    with pytest.raises(EngineUnavailableError, match="kaboom"):
        loop.submit("c", [1], greedy(1), on_output=got("c"))
    loop.stop()


def test_stop_aborts_open_requests_and_ends_the_thread(engine):
    engine.step_sleep_s = 0.001
    loop = EngineLoop(engine)
    loop.start()
    got = Collector()
    loop.submit("a", [1], greedy(10**9), on_output=got("a"))
    loop.stop(timeout_s=5.0)
    got.wait("a")
    assert got.outputs["a"][-1].finish_reason == FinishReason.ABORT
    assert not loop.is_alive
    with pytest.raises(EngineUnavailableError):
        loop.submit("b", [1], greedy(1), on_output=got("b"))


def test_ticks_publish_stats_while_busy_and_once_on_going_idle(engine):
    ticks = []
    engine.step_sleep_s = 0.002
    loop = EngineLoop(engine, on_tick=ticks.append, tick_interval_s=0.01)
    loop.start()
    got = Collector()
    loop.submit("a", [1], greedy(30), on_output=got("a"))
    got.wait("a")
    wait_until(lambda: ticks and ticks[-1]["num_running"] == 0, 2.0, "the going-idle tick",
               period_s=0.005)
    assert any(t["num_running"] == 1 for t in ticks)
    assert ticks[-1] == {"num_running": 0}
    loop.stop()


def test_the_stand_in_is_an_engine_as_the_loop_sees_it(engine):
    assert isinstance(engine, Engine)  # the real one: test_engine_faults.py
    assert not isinstance(object(), Engine)


def test_submit_before_start_is_refused(engine):
    loop = EngineLoop(engine)
    with pytest.raises(EngineUnavailableError, match="not started"):
        loop.submit("a", [1], greedy(1), on_output=lambda o: None)


def test_a_dead_loop_says_so_once_and_refuses_with_engine_dead():
    engine = ScriptedEngine(fail_on_step=2)
    deaths: list[BaseException] = []
    loop = EngineLoop(engine, on_dead=deaths.append)
    loop.start()
    got = Collector()
    loop.submit("a", [1], greedy(100), on_output=got("a"))
    got.wait("a")
    final = got.outputs["a"][-1]
    assert final.error_kind == ErrorKind.ENGINE_DEAD and "kaboom" in final.error
    loop.stop()  # a stop after the death changes nothing
    assert loop.is_dead and len(deaths) == 1 and "kaboom" in repr(deaths[0])
    with pytest.raises(EngineDeadError, match="engine failed"):
        loop.submit("b", [1], greedy(1), on_output=got("b"))


def test_an_injected_fault_kills_the_loop_like_a_bug(engine):
    deaths: list[BaseException] = []
    engine.step_sleep_s = 0.001
    loop = EngineLoop(engine, on_dead=deaths.append)
    loop.start()
    got = Collector()
    loop.submit("a", [1], greedy(10_000), on_output=got("a"))
    loop.inject_fault("chaos")
    got.wait("a")
    assert got.outputs["a"][-1].error_kind == ErrorKind.ENGINE_DEAD
    assert isinstance(deaths[0], InjectedFault) and "chaos" in str(deaths[0])
    assert loop.is_dead and not loop.is_accepting


def test_engine_side_refusal_is_an_invalid_input_error(engine, loop):
    engine.refuse_ids.add("bad")
    got = Collector()
    loop.submit("bad", [1], greedy(1), on_output=got("bad"))
    got.wait("bad")
    assert got.outputs["bad"][-1].error_kind == ErrorKind.INVALID_INPUT
    assert not loop.is_dead


def test_a_bug_while_admitting_one_request_fails_it_alone(engine, loop):
    engine.crash_ids.add("odd")
    got = Collector()
    loop.submit("odd", [1], greedy(2), on_output=got("odd"))
    loop.submit("fine", [1], greedy(2), on_output=got("fine"))
    got.wait("odd", "fine")
    (only,) = got.outputs["odd"]
    assert only.error_kind == ErrorKind.INTERNAL and "a bug on admission" in only.error
    assert got.outputs["fine"][-1].error is None and not loop.is_dead
