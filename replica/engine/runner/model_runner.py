"""Turns a SchedulerOutput into a ModelInput, runs the model, samples: a RunnerOutput.

Owns the KV pool tensors: per layer one K and one V tensor of
`[num_blocks, block_size, num_kv_heads, head_dim]`, allocated once from the memory budget.
The runner knows nothing of scheduling policy: it runs the step it is given, whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
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


class StepBuffers:
    """The step's int64 inputs (token ids, positions, slots, block tables, ...), written in place
    into tensors kept from step to step (through numpy views of them) rather than built from
    Python lists each step; a buffer grows (doubling) when a step needs more. The tensors a step
    hands the model are views of these buffers: valid until the next step's `_prepare`, which
    the engine, one step at a time, never overlaps with a running step."""

    def __init__(self) -> None:
        self._tensors: dict[str, torch.Tensor] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, name: str, n: int) -> np.ndarray:
        """The first n elements of buffer `name` as a writable numpy array (grown if needed)."""
        a = self._arrays.get(name)
        if a is None or a.shape[0] < n:
            t = torch.zeros(max(n, 64, 2 * (0 if a is None else a.shape[0])), dtype=torch.long)
            self._tensors[name], self._arrays[name] = t, t.numpy()
        return self._arrays[name][:n]

    def tensor(self, name: str, n: int) -> torch.Tensor:
        """The first n elements of buffer `name` as a tensor (the memory `array` wrote)."""
        if name not in self._tensors:
            self.array(name, n)
        return self._tensors[name][:n]


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
        self.buffers = StepBuffers()

    def _prepare(self, out: SchedulerOutput) -> ModelInput:
        """The step's tensors, written into the runner's persistent buffers (StepBuffers): one
        pass over the scheduled requests, no per-token Python loop (a prefill chunk's positions
        and slots are numpy ranges, its tokens one slice assignment)."""
        bs = self.block_size
        buf = self.buffers
        total = sum(n for _, n in out.scheduled)
        n_seqs = len(out.scheduled)
        ids, pos, slots = buf.array("input_ids", total), buf.array("positions", total), buf.array("slots", total)
        logits_idx = buf.array("logits_idx", n_seqs)
        decode_idx = buf.array("decode_idx", n_seqs)
        decode_lens = buf.array("decode_lens", n_seqs)
        sampled_requests = []
        decode_tables: list[list[int]] = []
        prefills: list[PrefillSeq] = []
        flat = n_sampled = n_decode = 0
        for request, num_new in out.scheduled:
            start = request.num_computed_tokens
            end = start + num_new
            table = out.block_tables[request.request_id]
            if num_new == 1 and start > 0:
                ids[flat] = request.token_slice(start, end)[0]
                pos[flat] = start
                slots[flat] = table[start // bs] * bs + start % bs
                decode_idx[n_decode] = flat
                decode_lens[n_decode] = end
                decode_tables.append(table[: (end + bs - 1) // bs])
                n_decode += 1
            else:
                block_ids = np.asarray(table[: (end + bs - 1) // bs], dtype=np.int64)
                ids[flat : flat + num_new] = request.token_slice(start, end)
                chunk = np.arange(start, end, dtype=np.int64)  # the chunk's slots without a per-token loop
                pos[flat : flat + num_new] = chunk
                slots[flat : flat + num_new] = block_ids[chunk // bs] * bs + chunk % bs
                prefills.append(
                    PrefillSeq(
                        query_start=flat,
                        query_len=num_new,
                        context_len=end,
                        block_ids=torch.from_numpy(block_ids).to(self.device),
                    )
                )
            flat += num_new
            if end == request.num_tokens:  # reached the frontier: the next token is sampled
                logits_idx[n_sampled] = flat - 1
                n_sampled += 1
                sampled_requests.append(request)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=buf.tensor("slots", flat).to(dev),
            decode_token_idx=None,
            decode_block_tables=None,
            decode_mask=None,
            decode_context_lens=None,
            prefills=prefills,
            native=self.native_attention,
        )
        if n_decode:
            max_blocks = max(len(t) for t in decode_tables)
            tables = buf.array("block_tables", n_decode * max_blocks).reshape(n_decode, max_blocks)
            tables.fill(0)  # padding: block 0, never read past a sequence's length
            for row, t in zip(tables, decode_tables):
                row[: len(t)] = t
            meta.decode_token_idx = buf.tensor("decode_idx", n_decode).to(dev)
            meta.decode_block_tables = buf.tensor("block_tables", n_decode * max_blocks).view(n_decode, max_blocks).to(dev)
            lens = buf.tensor("decode_lens", n_decode).to(dev)
            meta.decode_context_lens = lens
            if self.native_attention is None:
                cols = torch.arange(max_blocks * bs, device=dev)
                meta.decode_mask = (cols.unsqueeze(0) < lens.unsqueeze(1)).view(n_decode, 1, 1, -1)
        return ModelInput(
            input_ids=buf.tensor("input_ids", flat).to(dev),
            positions=buf.tensor("positions", flat).to(dev),
            attention=meta,
            logits_idx=buf.tensor("logits_idx", n_sampled).to(dev),
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
