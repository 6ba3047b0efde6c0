"""LLMEngine: builds the engine from an EngineConfig and is the one object callers drive.

Not thread-safe: one thread owns it (the Triton model's engine loop, or a benchmark)."""
from __future__ import annotations

import time
from typing import Callable

import torch

from replica.engine.config import INT4, EngineConfig, ModelConfig
from replica.engine.dtype import dtype_name, resolve_dtype
from replica.engine.engine_core import EngineCore, EngineStats
from replica.engine.kv.manager import KVCacheManager
from replica.engine.models.llama import LlamaForCausalLM, rope_inv_freq
from replica.engine.models.quantization import normalize_quantization, quantize_model
from replica.engine.request import RequestOutput
from replica.engine.runner.model_runner import ModelRunner, kv_bytes_per_block
from replica.engine.sampling_params import SamplingParams
from replica.engine.scheduler import Scheduler

__all__ = ["LLMEngine", "EngineStats"]


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, model: LlamaForCausalLM, tokenizer,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.model_config = model_config
        self.tokenizer = tokenizer
        device = torch.device(config.device)
        dtype = next(model.parameters()).dtype
        self.dtype = dtype  # the compute dtype (`auto` resolved): KV cache and activations
        num_blocks = num_kv_blocks(config, model_config, dtype)
        if num_blocks < 2:
            raise ValueError(
                f"--kv-cache-bytes {config.kv_cache_bytes} holds {num_blocks} blocks of {config.block_size} tokens; "
                f"give at least {2 * kv_bytes_per_block(model_config, config.block_size, dtype)} bytes"
            )
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)
        kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        scheduler = Scheduler(kv, config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len)
        runner = ModelRunner(model, num_blocks, config.block_size, dtype, device)
        eos = tuple(model_config.eos_token_ids) or tuple(tokenizer.eos_token_ids)
        self.core = EngineCore(scheduler, runner, tokenizer, eos, clock=clock)
        self._model = model

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs) -> "LLMEngine":
        from replica.engine.models.loader import load_checkpoint

        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        normalize_quantization(config.quantization)  # an unknown or unbuilt one fails before the load
        checkpoint = load_checkpoint(config.model_path)
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

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams, *,
                    priority: int = 0, tenant: str = "", cache_salt: str = "") -> None:
        self.core.add_request(request_id, prompt_token_ids, sampling_params,
                              priority=priority, tenant=tenant, cache_salt=cache_salt)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        return self.core.abort_request(request_id)

    def step(self, interrupt: Callable[[], bool] | None = None) -> list[RequestOutput]:
        return self.core.step(interrupt)

    def would_isolate(self, tenant: str, priority: int) -> bool:
        return self.core.would_isolate(tenant, priority)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def stats(self) -> EngineStats:
        return self.core.stats()

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
    """KV blocks the budget buys, counted over all KV heads: a tensor-parallel replica has the
    blocks of a single-device one, each rank holding its heads' share of every block."""
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
