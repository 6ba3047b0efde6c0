"""EngineCore.step(): schedule -> run -> update, then detokenise into RequestOutput deltas.

Fault isolation (no request can kill the engine):
- a request whose row cannot be sampled, or whose text cannot be decoded, finishes alone with
  an INTERNAL error output; the step and the other requests go on;
- a step whose model run raises fails the requests it scheduled (INTERNAL error outputs) and
  leaves the others and the engine's state intact: nothing of that step was counted, and only
  computed blocks ever enter the prefix cache (scheduler.update);
- `max_failed_steps` failed steps in a row are no longer one request's doing (a broken device,
  say): `step` raises EngineFault and the engine is dead.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from replica.engine.detokenizer import Decoder, IncrementalDetokenizer
from replica.engine.models.llama import StepInterrupted
from replica.engine.request import ErrorKind, FinishReason, Request, RequestOutput
from replica.engine.runner.model_runner import ModelRunner
from replica.engine.runner.sampler import SampleError
from replica.engine.sampling_params import InvalidRequestError, SamplingParams
from replica.engine.scheduler import Scheduler

_log = logging.getLogger(__name__)


class EngineFault(RuntimeError):
    """The engine cannot go on (steps keep failing whatever they hold): the loop dies on it."""


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    prefix_hit_tokens: int  # cumulative
    # cumulative: prompt tokens prefilled, prefix-cache hits included, a recompute after
    # preemption not counted again; equals the sum of what the requests are billed as input
    prompt_tokens: int
    generated_tokens: int  # cumulative
    num_preemptions: int  # cumulative
    num_interrupted_steps: int = 0  # cumulative: steps cut short for a lighter newcomer


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        decoder: Decoder,
        eos_token_ids: tuple[int, ...],
        clock: Callable[[], float] = time.monotonic,
        max_failed_steps: int = 3,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.decoder = decoder
        self.eos_token_ids = eos_token_ids
        self.clock = clock
        self._seeds: dict[str, int] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._generated_tokens = 0
        self.max_failed_steps = max_failed_steps
        self._num_failed_steps = 0  # in a row
        self.vocab_size = int(runner.model.config.vocab_size)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        priority: int = 0,
        tenant: str = "",
        cache_salt: str = "",
    ) -> None:
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty")
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            raise InvalidRequestError(f"prompt token ids must lie in [0, {self.vocab_size})")
        if request_id in self.scheduler.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        max_len = self.scheduler.max_seq_len
        if len(prompt_token_ids) >= max_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_token_ids)} tokens; this replica serves at most "
                f"{max_len - 1} prompt tokens (context window {max_len})"
            )
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=sampling_params,
            arrival_time=self.clock(),
            priority=priority,
            tenant=tenant,
            cache_salt=cache_salt,
        )
        if sampling_params.seed is not None:  # the others share the sampler's batch generator
            self._seeds[request_id] = sampling_params.seed
        self._detok[request_id] = IncrementalDetokenizer(self.decoder, prompt_token_ids, sampling_params.stop)
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        request = self.scheduler.requests.get(request_id)
        if request is None:
            return None
        self.scheduler.finish(request, FinishReason.ABORT)
        return self._final_output(request, [], "")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def would_isolate(self, tenant: str, priority: int) -> bool:
        return self.scheduler.would_isolate(tenant, priority)

    def step(self, interrupt: Callable[[], bool] | None = None) -> list[RequestOutput]:
        """One step. `interrupt`, asked between layers where the scheduler allows cutting this
        step short (step interruption), ends it early with no outputs when it says so."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        try:
            sampled = self.runner.execute(
                out, self._seeds, interrupt if self.scheduler.step_interruptible else None)
        except StepInterrupted:
            self.scheduler.interrupted()
            return []
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, not the engine
            return self._fail_step(out, exc)
        self._num_failed_steps = 0
        outputs = []
        tokens: dict[str, int] = {}
        for request_id, token in sampled.items():
            if isinstance(token, SampleError):
                # Finished before update: update skips it, its blocks are freed now.
                outputs.append(self._error_output(self.scheduler.requests[request_id], ErrorKind.INTERNAL,
                                                  f"request failed: {token.message}"))
            else:
                tokens[request_id] = token
        progressed = self.scheduler.update(out, tokens, self.eos_token_ids)
        self._generated_tokens += len(progressed)
        for request in progressed:
            try:
                outputs.append(self._postprocess(request))
            except Exception as exc:  # noqa: BLE001 - one request's text must not fail the others
                _log.exception("postprocessing %s failed", request.request_id)
                outputs.append(self._error_output(request, ErrorKind.INTERNAL, f"request failed: {exc!r}"))
        return outputs

    def _postprocess(self, request: Request) -> RequestOutput:
        token = request.output_token_ids[-1]
        detok = self._detok[request.request_id]
        delta, stopped = detok.append([token])
        if stopped:
            self.scheduler.finish(request, FinishReason.STOP)
        if request.is_finished:
            return self._final_output(request, [token], delta)
        return self._output(request, [token], delta)

    def _fail_step(self, out, exc: Exception) -> list[RequestOutput]:
        self._num_failed_steps += 1
        if self._num_failed_steps >= self.max_failed_steps:
            raise EngineFault(f"{self._num_failed_steps} engine steps in a row failed; the last: {exc!r}") from exc
        _log.error("an engine step failed; failing the %d requests it held", len(out.scheduled), exc_info=exc)
        return [self._error_output(request, ErrorKind.INTERNAL, f"request failed: the engine step failed: {exc!r}")
                for request, _ in out.scheduled if not request.is_finished]

    def _error_output(self, request: Request, kind: ErrorKind, message: str) -> RequestOutput:
        """Finish `request` with an error: its blocks are freed, its counts reported."""
        self.scheduler.finish(request, FinishReason.ABORT)
        self._detok.pop(request.request_id, None)
        self._seeds.pop(request.request_id, None)
        out = self._output(request, [], "")
        out.finished = True
        out.finish_reason = FinishReason.ABORT
        out.error = message
        out.error_kind = kind
        return out

    def _output(self, request: Request, token_ids: list[int], delta: str) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=token_ids,
            text_delta=delta,
            finished=False,
            finish_reason=None,
            num_prompt_tokens=request.num_prefilled_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=min(request.num_cached_tokens, request.num_prefilled_tokens),
        )

    def _final_output(self, request: Request, token_ids: list[int], delta: str) -> RequestOutput:
        detok = self._detok.pop(request.request_id)
        self._seeds.pop(request.request_id, None)
        out = self._output(request, token_ids, delta + detok.flush())
        out.finished = True
        out.finish_reason = request.finish_reason
        return out

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            num_running=len(s.running),
            num_waiting=len(s.waiting),
            num_free_blocks=s.kv.num_free_blocks,
            num_total_blocks=s.kv.num_blocks,
            prefix_hit_tokens=s.prefix_hit_tokens,
            prompt_tokens=s.prefilled_tokens,
            generated_tokens=self._generated_tokens,
            num_preemptions=s.num_preemptions,
            num_interrupted_steps=s.num_interrupted_steps,
        )
