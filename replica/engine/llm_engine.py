"""LLMEngine: the engine. Built from an EngineConfig (model, KV pool, scheduler, runner); its
`step()` is one way: `Scheduler.schedule()` -> `ModelRunner.execute()` -> `Scheduler.update()`,
then the new tokens are detokenised into RequestOutput deltas. Nothing calls back up: the
runner runs the step it is given, whole, and the scheduler alone decides what a step holds.

Not thread-safe: one thread owns it (the Triton model's EngineLoop, or a benchmark).

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

import torch

from replica.engine.config import INT4, EngineConfig, ModelConfig
from replica.engine.detokenizer import IncrementalDetokenizer
from replica.engine.dtype import dtype_name, resolve_dtype
from replica.engine.kv.manager import KVCacheManager
from replica.engine.models.llama import LlamaForCausalLM, rope_inv_freq
from replica.engine.models.quantization import normalize_quantization, quantize_model
from replica.engine.request import ErrorKind, FinishReason, Request, RequestOutput
from replica.engine.runner.model_runner import ModelRunner, kv_bytes_per_block
from replica.engine.sampling_params import InvalidRequestError, SamplingParams
from replica.engine.scheduler import Scheduler, SchedulerOutput

_log = logging.getLogger(__name__)


class EngineFault(RuntimeError):
    """The engine cannot go on (steps keep failing whatever they hold): the loop dies on it."""


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int  # free, cached prefixes included (taking those evicts them)
    num_free_uncached_blocks: int  # free and holding no cached prefix
    num_total_blocks: int
    prefix_hit_tokens: int  # cumulative
    # cumulative: prompt tokens prefilled, prefix-cache hits included, a recompute after
    # preemption not counted again; equals the sum of what the requests are billed as input
    prompt_tokens: int
    generated_tokens: int  # cumulative
    num_preemptions: int  # cumulative


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, model: LlamaForCausalLM, tokenizer,
                 clock: Callable[[], float] = time.monotonic, max_failed_steps: int = 3) -> None:
        self.config = config
        self.model_config = model_config
        self.tokenizer = tokenizer
        device = torch.device(config.device)
        dtype = next(model.parameters()).dtype
        self.dtype = dtype  # the compute dtype (`auto` resolved): KV cache and activations
        num_blocks = num_kv_blocks(config, model_config, dtype)
        if num_blocks < 2:
            if config.kv_cache_blocks:
                raise ValueError(f"--kv-cache-blocks {config.kv_cache_blocks}: give at least 2 blocks")
            raise ValueError(
                f"--kv-cache-bytes {config.kv_cache_bytes} holds {num_blocks} blocks of {config.block_size} tokens; "
                f"give at least {2 * kv_bytes_per_block(model_config, config.block_size, dtype)} bytes"
            )
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)
        kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(kv, config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len)
        self.runner = ModelRunner(model, num_blocks, config.block_size, dtype, device)
        self.eos_token_ids = tuple(model_config.eos_token_ids) or tuple(tokenizer.eos_token_ids)
        self.vocab_size = int(model_config.vocab_size)
        self.clock = clock
        self._seeds: dict[str, int] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._generated_tokens = 0
        self.max_failed_steps = max_failed_steps
        self._num_failed_steps = 0  # in a row
        self._model = model

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs) -> "LLMEngine":
        from replica.engine.models.loader import load_checkpoint

        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        normalize_quantization(config.quantization)  # an unknown or unbuilt one fails before the load
        shard = None
        if config.tensor_parallel > 1:  # rank 0 reads only its shard of the weights too
            from replica.engine.parallel.sharding import rank_weights

            shard = rank_weights(config.tensor_parallel, 0)
        checkpoint = load_checkpoint(config.model_path, shard=shard)
        dtype = dtype_name(resolve_dtype(config.dtype, config.device))
        if config.tensor_parallel > 1:  # one replica over N ranks: replica/engine/parallel/
            from replica.engine.parallel.driver import start_tensor_parallel

            num_blocks = num_kv_blocks(config, checkpoint.config, resolve_dtype(dtype, config.device))
            model = start_tensor_parallel(config, checkpoint, dtype, num_blocks)
            return cls(config, checkpoint.config, model, checkpoint.tokenizer, **kwargs)
        blocks = None
        if normalize_quantization(config.quantization) == INT4:
            from replica.engine.models.gguf_linear import load_block_weights

            blocks = load_block_weights(config.model_path, checkpoint.config)
        model = build_model(checkpoint.config, checkpoint.state_dict, dtype, config.device,
                            quantization=config.quantization, blocks=blocks)
        return cls(config, checkpoint.config, model, checkpoint.tokenizer, **kwargs)

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """`callback(reason)` when the engine can no longer step (a tensor-parallel worker died);
        never called for a single-device engine."""
        if hasattr(self._model, "on_failure"):
            self._model.on_failure(callback)

    def close(self) -> None:
        """Stop what the engine started besides this thread (tensor-parallel workers)."""
        if hasattr(self._model, "close"):
            self._model.close()

    # --- the request API -------------------------------------------------------------------

    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        """The one prompt check (InvalidRequestError): not empty, ids in the vocabulary, room
        for at least one output token. Reads only what never changes after construction, so
        any thread may call it (EngineLoop.submit does, to refuse at once)."""
        if len(prompt_token_ids) == 0:
            raise InvalidRequestError("the prompt is empty")
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            raise InvalidRequestError(f"prompt token ids must lie in [0, {self.vocab_size})")
        max_len = self.scheduler.max_seq_len
        if len(prompt_token_ids) >= max_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_token_ids)} tokens; this replica serves at most "
                f"{max_len - 1} prompt tokens (context window {max_len}, prompt and output together)"
            )

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
        self.check_prompt(prompt_token_ids)
        if request_id in self.scheduler.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
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
        self._detok[request_id] = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, sampling_params.stop)
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        request = self.scheduler.requests.get(request_id)
        if request is None:
            return None
        self.scheduler.finish(request, FinishReason.ABORT)
        return self._final_output(request, [], "")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One step, one way: schedule -> run -> update, then detokenise the new tokens."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        try:
            result = self.runner.execute(out, self._seeds)
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, not the engine
            return self._fail_step(out, exc)
        self._num_failed_steps = 0
        # A row that could not be sampled fails alone, before update (which then skips it).
        outputs = [self._error_output(self.scheduler.requests[request_id], ErrorKind.INTERNAL,
                                      f"request failed: {message}")
                   for request_id, message in result.failed.items()]
        progressed = self.scheduler.update(out, result.sampled, self.eos_token_ids)
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

    def _fail_step(self, out: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
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
            num_free_uncached_blocks=s.kv.num_free_uncached_blocks,
            num_total_blocks=s.kv.num_blocks,
            prefix_hit_tokens=s.prefix_hit_tokens,
            prompt_tokens=s.prefilled_tokens,
            generated_tokens=self._generated_tokens,
            num_preemptions=s.num_preemptions,
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
        """Run prompts (token ids) to completion; return output token ids in prompt order."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, params_list):
            self.add_request(rid, prompt, p)
        outputs: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_unfinished_requests():
            for out in self.step():
                outputs[out.request_id].extend(out.new_token_ids)
        return [outputs[rid] for rid in ids]


def num_kv_blocks(config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype) -> int:
    """KV blocks the budget buys (`kv_cache_blocks` when set), counted over all KV heads: a
    tensor-parallel replica has the blocks of a single-device one, each rank holding its heads'
    share of every block."""
    if config.kv_cache_blocks:
        return config.kv_cache_blocks
    return config.kv_cache_bytes // kv_bytes_per_block(model_config, config.block_size, dtype)


def build_model(model_config: ModelConfig, state_dict: dict[str, torch.Tensor], dtype: str, device: str,
                quantization: str = "none", blocks: dict | None = None) -> LlamaForCausalLM:
    """The model in `dtype` on `device`; with quantization "int8" its projections, embeddings and
    head hold int8 weights (models/quantization.py); with "int4" its projections and head also
    hold `blocks`, the GGUF file's Q4 blocks (models/gguf_linear.py), which decode reads."""
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config)
    model = model.to_empty(device=device)
    model.load_weights(state_dict)
    model = model.to(resolve_dtype(dtype, device)).eval().requires_grad_(False)
    model.inv_freq = rope_inv_freq(model_config).to(device)  # RoPE frequencies stay float32
    if normalize_quantization(quantization) == INT4:
        from replica.engine.models.gguf_linear import quantize_int4

        quantize_int4(model, blocks or {})
        model.quantization = INT4
    else:
        quantize_model(model, quantization)
    return model
