"""What every rank does alike: build its shard of the model, and ship a step's model input.

`RankSpec` is what rank 0 tells a worker (one JSON argument); `build_rank_model` builds a rank's
shard from the full checkpoint; `StepInput` is one step's model input as rank 0 broadcasts it
(token ids, positions and the attention metadata: slot mapping, block tables, context lengths,
prefill chunks), every tensor moved to the CPU for the trip and to the rank's device after.
"""
from __future__ import annotations

import dataclasses
import json
import pickle
from dataclasses import dataclass
from typing import Any

import torch

from replica.engine.config import ModelConfig
from replica.engine.parallel.sharding import plan_shards, shard_config, shard_state_dict


@dataclass(frozen=True)
class RankSpec:
    rank: int
    world_size: int
    store_port: int
    model_path: str
    dtype: str  # resolved: bfloat16 | float32 | float16 (rank 0 measured `auto` once for all)
    device: str  # cpu | cuda (rank r uses cuda:r)
    quantization: str
    num_blocks: int
    block_size: int
    num_threads: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RankSpec":
        return cls(**json.loads(text))

    def torch_device(self) -> torch.device:
        return torch.device(f"cuda:{self.rank}") if self.device == "cuda" else torch.device(self.device)


def build_rank_model(config: ModelConfig, state_dict: dict[str, torch.Tensor], spec: RankSpec):
    """This rank's LlamaForCausalLM: its heads and MLP columns, in the engine dtype, quantised as
    asked (after sharding: int8 scales are per output channel of the shard)."""
    from replica.engine.llm_engine import build_model

    shard = plan_shards(config, spec.world_size)[spec.rank]
    return build_model(shard_config(config, shard), shard_state_dict(state_dict, config, shard), spec.dtype,
                       str(spec.torch_device()), quantization=spec.quantization)


@dataclass
class StepInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: Any  # runner.attention.AttentionMetadata without its `native` kernel (each rank has its own)

    def to_bytes(self) -> bytes:
        meta = dataclasses.replace(self.meta, native=None)
        return pickle.dumps(_moved(StepInput(self.input_ids, self.positions, meta), torch.device("cpu")),
                            protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def from_bytes(payload: bytes, device: torch.device, native: Any) -> "StepInput":
        step = _moved(pickle.loads(payload), device)
        step.meta.native = native
        return step


def _moved(value: Any, device: torch.device) -> Any:
    """`value` with every tensor in it (dataclass fields, lists) on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_moved(v, device) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _moved(getattr(value, f.name), device)
                                             for f in dataclasses.fields(value) if f.init})
    return value
