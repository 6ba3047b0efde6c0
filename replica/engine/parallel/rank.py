"""What every rank does alike: build its shard of the model, and ship a step's model input.

`RankSpec` is what rank 0 tells a worker (one JSON argument); `build_rank_model` builds a rank's
shard from the weights it read (`load_checkpoint(path, shard=rank_weights(N, r))`: its slices only); `StepInput` is one step's model input as rank 0 broadcasts it
(token ids, positions and the attention metadata: slot mapping, block tables, context lengths,
prefill chunks), every tensor moved to the CPU for the trip and to the rank's device after.
On the wire: a JSON header (the structure; a tensor as dtype, shape and where its bytes lie) and
the tensors' raw bytes. Nothing is unpickled on a worker: the two dataclasses it carries are
rebuilt by name from `_WIRE_TYPES` only, tensors only in `_WIRE_DTYPES` (index tensors).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import torch

from replica.engine.config import ModelConfig
from replica.engine.parallel.sharding import plan_shards, shard_config
from replica.engine.runner.attention import AttentionMetadata, PrefillSeq

_WIRE_TYPES = {cls.__name__: cls for cls in (AttentionMetadata, PrefillSeq)}
_WIRE_DTYPES = {"int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


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
    """This rank's LlamaForCausalLM from `state_dict`, its shard's weights (as loaded with
    `rank_weights`): its heads and MLP columns, in the engine dtype, quantised as asked (after
    sharding: int8 scales are per output channel of the shard). `config` is the whole model's."""
    from replica.engine.llm_engine import build_model

    shard = plan_shards(config, spec.world_size)[spec.rank]
    return build_model(shard_config(config, shard), state_dict, spec.dtype,
                       str(spec.torch_device()), quantization=spec.quantization)


@dataclass
class StepInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: Any  # runner.attention.AttentionMetadata without its `native` kernel (each rank has its own)

    def to_bytes(self) -> bytes:
        meta = dataclasses.replace(self.meta, native=None)
        blobs: list[bytes] = []
        header = json.dumps(_to_wire({"input_ids": self.input_ids, "positions": self.positions, "meta": meta},
                                     blobs)).encode()
        return len(header).to_bytes(8, "little") + header + b"".join(blobs)

    @staticmethod
    def from_bytes(payload: bytes, device: torch.device, native: Any) -> "StepInput":
        size = int.from_bytes(payload[:8], "little")
        data = memoryview(payload)[8 + size:]
        wire = json.loads(payload[8 : 8 + size])
        step = StepInput(**{name: _from_wire(value, data, device) for name, value in wire.items()})
        step.meta.native = native
        return step


def _to_wire(value: Any, blobs: list[bytes]) -> Any:
    """JSON-able structure: a tensor is {"tensor": [dtype, shape, offset, nbytes]} into `blobs`
    (its bytes on the CPU), a dataclass {"type": name, "fields": {...}}."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in _WIRE_DTYPES.values():  # refused here, not by a worker mid-step
            raise TypeError(f"a {value.dtype} tensor is not sent to tensor-parallel workers")
        data = value.detach().cpu().contiguous().numpy().tobytes()
        offset = sum(map(len, blobs))
        blobs.append(data)
        return {"tensor": [str(value.dtype).removeprefix("torch."), list(value.shape), offset, len(data)]}
    if isinstance(value, list):
        return [_to_wire(v, blobs) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v, blobs) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if type(value).__name__ not in _WIRE_TYPES:
            raise TypeError(f"{type(value).__name__} is not sent to tensor-parallel workers")
        return {"type": type(value).__name__,
                "fields": {f.name: _to_wire(getattr(value, f.name), blobs) for f in dataclasses.fields(value)}}
    return value


def _from_wire(value: Any, data: memoryview, device: torch.device) -> Any:
    if isinstance(value, list):
        return [_from_wire(v, data, device) for v in value]
    if isinstance(value, dict) and "tensor" in value:
        dtype, shape, offset, nbytes = value["tensor"]
        dtype = _WIRE_DTYPES[dtype]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=device)
        flat = torch.frombuffer(bytearray(data[offset : offset + nbytes]), dtype=dtype)
        return flat.view(shape).to(device)
    if isinstance(value, dict) and set(value) == {"type", "fields"}:
        cls = _WIRE_TYPES[value["type"]]
        return cls(**{k: _from_wire(v, data, device) for k, v in value["fields"].items()})
    return value
