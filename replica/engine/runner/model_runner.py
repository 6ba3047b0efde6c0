"""Turns a SchedulerOutput into a ModelInput, runs the model, samples: a RunnerOutput.

Owns the KV pool tensors: per layer one K and one V tensor of
`[num_blocks, block_size, num_kv_heads, head_dim]`, allocated once from the memory budget.
The runner knows nothing of scheduling policy: it runs the step it is given, whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from replica.engine.config import ModelConfig
from replica.engine.models.llama import LlamaForCausalLM
from replica.engine.request import Request
from replica.engine.runner import native
from replica.engine.runner.attention import AttentionMetadata, PrefillSeq
from replica.engine.runner.hugepages import huge_zeros
from replica.engine.runner.sampler import SampleError, Sampler
from replica.engine.scheduler import SchedulerOutput


@dataclass
class ModelInput:
    """One step's tensors for the model's forward, built from a SchedulerOutput."""

    input_ids: torch.Tensor  # [T] long: the step's tokens, flat over its sequences
    positions: torch.Tensor  # [T] long
    attention: AttentionMetadata
    logits_idx: torch.Tensor  # [S] long: flat index of the tokens whose next token is sampled
    sampled_requests: list[Request]  # [S]: the requests those tokens belong to


@dataclass
class RunnerOutput:
    """What one step produced, per request that reached the end of its known tokens."""

    sampled: dict[str, int] = field(default_factory=dict)  # request id -> its new token
    # request id -> why its row could not be sampled (the model's fault): it fails alone
    failed: dict[str, str] = field(default_factory=dict)


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        c = model.config
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        self.kv_pools = [  # huge pages on the CPU: a full batch's blocks exceed the TLB's reach in 4 KiB pages
            (huge_zeros(shape, dtype, device), huge_zeros(shape, dtype, device)) for _ in range(c.num_layers)
        ]
        self.sampler = Sampler(native.load_row_argmax())  # logits are on the CPU when sampled
        use_native = device.type == "cpu" and native.NativeAttention.supports(dtype)
        self.native_attention = native.load() if use_native else None

    def _prepare(self, out: SchedulerOutput) -> ModelInput:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []  # decode tokens' slots, in order since the last prefill piece
        slot_pieces: list[torch.Tensor] = []  # the step's slots in order, as tensors
        logits_idx: list[int] = []
        sampled_requests = []
        decode_idx: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSeq] = []
        for request, num_new in out.scheduled:
            start = request.num_computed_tokens
            end = start + num_new
            table = out.block_tables[request.request_id]
            flat_start = len(input_ids)
            input_ids.extend(request.token_slice(start, end))
            positions.extend(range(start, end))
            if num_new == 1 and start > 0:
                slots.append(table[start // bs] * bs + start % bs)
                decode_idx.append(flat_start)
                decode_tables.append(table[: (end + bs - 1) // bs])
                decode_lens.append(end)
            else:
                block_ids = torch.tensor(table[: (end + bs - 1) // bs], dtype=torch.long)
                if slots:
                    slot_pieces.append(torch.tensor(slots, dtype=torch.long))
                    slots = []
                pos = torch.arange(start, end)  # the chunk's slots without a per-token Python loop
                slot_pieces.append(block_ids[pos // bs] * bs + pos % bs)
                prefills.append(
                    PrefillSeq(
                        query_start=flat_start,
                        query_len=num_new,
                        context_len=end,
                        block_ids=block_ids.to(self.device),
                    )
                )
            if end == request.num_tokens:  # reached the frontier: the next token is sampled
                logits_idx.append(len(input_ids) - 1)
                sampled_requests.append(request)
        dev = self.device
        if slots or not slot_pieces:
            slot_pieces.append(torch.tensor(slots, dtype=torch.long))
        slot_mapping = slot_pieces[0] if len(slot_pieces) == 1 else torch.cat(slot_pieces)
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            decode_token_idx=None,
            decode_block_tables=None,
            decode_mask=None,
            decode_context_lens=None,
            prefills=prefills,
            native=self.native_attention,
        )
        if decode_idx:
            max_blocks = max(len(t) for t in decode_tables)
            padded = [t + [0] * (max_blocks - len(t)) for t in decode_tables]
            meta.decode_token_idx = torch.tensor(decode_idx, dtype=torch.long, device=dev)
            meta.decode_block_tables = torch.tensor(padded, dtype=torch.long, device=dev)
            lens = torch.tensor(decode_lens, dtype=torch.long, device=dev)
            meta.decode_context_lens = lens
            if self.native_attention is None:
                cols = torch.arange(max_blocks * bs, device=dev)
                meta.decode_mask = (cols.unsqueeze(0) < lens.unsqueeze(1)).view(len(decode_idx), 1, 1, -1)
        return ModelInput(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            attention=meta,
            logits_idx=torch.tensor(logits_idx, dtype=torch.long, device=dev),
            sampled_requests=sampled_requests,
        )

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, seeds: dict[str, int]) -> RunnerOutput:  # seeds: requests that set one
        """Run one step; sample a token for every request that reached its frontier."""
        step = self._prepare(out)
        logits = self.model(step.input_ids, step.positions, self.kv_pools, step.attention, step.logits_idx)
        result = RunnerOutput()
        if not step.sampled_requests:
            return result
        requests = step.sampled_requests
        tokens = self.sampler.sample(
            logits.cpu(),
            [r.sampling_params for r in requests],
            [seeds.get(r.request_id) for r in requests],  # only requests that set a seed have one
            [r.num_output_tokens for r in requests],
        )
        for request, token in zip(requests, tokens):
            if isinstance(token, SampleError):
                result.failed[request.request_id] = token.message
            else:
                result.sampled[request.request_id] = token
        return result
