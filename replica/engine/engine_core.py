"""EngineCore.step(): schedule -> run -> update, then detokenise into RequestOutput deltas."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

from replica.engine.detokenizer import Decoder, IncrementalDetokenizer
from replica.engine.models.llama import StepInterrupted
from replica.engine.request import FinishReason, Request, RequestOutput
from replica.engine.runner.model_runner import ModelRunner
from replica.engine.sampling_params import InvalidRequestError, SamplingParams
from replica.engine.scheduler import Scheduler


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
        rng: random.Random | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.decoder = decoder
        self.eos_token_ids = eos_token_ids
        self.clock = clock
        self.rng = rng or random.Random(0)
        self._seeds: dict[str, int] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._generated_tokens = 0

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
        seed = sampling_params.seed
        self._seeds[request_id] = seed if seed is not None else self.rng.getrandbits(62)
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
        progressed = self.scheduler.update(out, sampled, self.eos_token_ids)
        self._generated_tokens += len(progressed)
        outputs = []
        for request in progressed:
            token = request.output_token_ids[-1]
            detok = self._detok[request.request_id]
            delta, stopped = detok.append([token])
            if stopped:
                self.scheduler.finish(request, FinishReason.STOP)
            if request.is_finished:
                outputs.append(self._final_output(request, [token], delta))
            else:
                outputs.append(self._output(request, [token], delta))
        return outputs

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
