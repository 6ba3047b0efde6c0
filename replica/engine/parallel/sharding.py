"""Which part of the model each tensor-parallel rank holds (pure: tensors in, tensors out).

Attention is split by KV-head group: rank r holds a contiguous run of KV heads and, with each,
the query heads that attend to it (GQA), so every rank's attention is an ordinary smaller GQA
attention with the model's group size, its KV cache holds only its own heads, and no rank
needs another's keys or values. When N does not divide the KV heads, the split is uneven:
SmolLM2-135M (9 query heads, 3 KV heads) at N=2 puts KV heads 2/1 (query heads 6/3) on ranks
0/1; at N=3 one group each. N above the number of KV heads is refused (a rank would hold no
head; replicating KV heads is not built). The MLP's intermediate columns are split as evenly as
N allows (the first ranks one column more when N does not divide them).

Column-parallel (outputs split, no communication): q/k/v rows, gate/up rows. Row-parallel
(inputs split; each rank's product is a partial sum, all-reduced): o_proj and down_proj
columns. Embeddings, norms and the head stay whole on every rank (rank 0 alone runs the head).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from replica.engine.config import ModelConfig


@dataclass(frozen=True)
class RankShard:
    rank: int
    world_size: int
    kv_heads: range  # the KV heads this rank holds
    heads: range  # their query heads
    intermediate: range  # MLP intermediate columns


def split_evenly(total: int, parts: int) -> list[range]:
    """[0, total) in `parts` contiguous runs, sizes differing by at most one, larger first."""
    base, extra = divmod(total, parts)
    runs, start = [], 0
    for part in range(parts):
        size = base + (1 if part < extra else 0)
        runs.append(range(start, start + size))
        start += size
    return runs


def plan_shards(config: ModelConfig, world_size: int) -> list[RankShard]:
    """One RankShard per rank; ValueError with the reason when the model cannot be split N ways."""
    if world_size < 1:
        raise ValueError(f"tensor-parallel degree must be at least 1, not {world_size}")
    if config.num_heads % config.num_kv_heads:
        raise ValueError(f"{config.num_heads} query heads do not form groups over {config.num_kv_heads} KV heads")
    if world_size > config.num_kv_heads:
        raise ValueError(
            f"tensor-parallel degree {world_size} exceeds the model's {config.num_kv_heads} KV heads "
            f"(attention is split by KV-head group); use at most {config.num_kv_heads}")
    group = config.num_heads // config.num_kv_heads
    kv_runs = split_evenly(config.num_kv_heads, world_size)
    mlp_runs = split_evenly(config.intermediate_size, world_size)
    return [
        RankShard(rank=rank, world_size=world_size, kv_heads=kv,
                  heads=range(kv.start * group, kv.stop * group), intermediate=mlp)
        for rank, (kv, mlp) in enumerate(zip(kv_runs, mlp_runs))
    ]


def shard_config(config: ModelConfig, shard: RankShard) -> ModelConfig:
    """The config of the model one rank builds: its heads and columns only."""
    return dataclasses.replace(config, num_heads=len(shard.heads), num_kv_heads=len(shard.kv_heads),
                               intermediate_size=len(shard.intermediate))


def weight_slice(name: str, config: ModelConfig, shard: RankShard) -> tuple[int, int, int] | None:
    """The part of weight `name` (Hugging Face name and layout) that `shard` holds, as
    (axis, start, stop); None when every rank holds it whole (embeddings, norms, head)."""
    hd = config.head_dim
    if name.endswith("self_attn.q_proj.weight"):
        return 0, shard.heads.start * hd, shard.heads.stop * hd
    if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
        return 0, shard.kv_heads.start * hd, shard.kv_heads.stop * hd
    if name.endswith("self_attn.o_proj.weight"):
        return 1, shard.heads.start * hd, shard.heads.stop * hd
    if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
        return 0, shard.intermediate.start, shard.intermediate.stop
    if name.endswith("mlp.down_proj.weight"):
        return 1, shard.intermediate.start, shard.intermediate.stop
    return None


def rank_weights(world_size: int, rank: int):
    """What `load_checkpoint(path, shard=...)` takes: given the model's config, the config the
    loaded weights must match (this rank's) and the slice of each weight to read."""
    def select(config: ModelConfig):
        shard = plan_shards(config, world_size)[rank]
        return shard_config(config, shard), lambda name: weight_slice(name, config, shard)
    return select


def shard_state_dict(state_dict: dict[str, torch.Tensor], config: ModelConfig,
                     shard: RankShard) -> dict[str, torch.Tensor]:
    """The weights of one rank's model (Hugging Face names and layout, before fusing), cut out of
    the whole model's (what a rank reads of the checkpoint is the same: `rank_weights`)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        part = weight_slice(name, config, shard)
        if part is None:
            out[name] = tensor
        else:
            axis, start, stop = part
            out[name] = tensor.narrow(axis, start, stop - start).contiguous()
    return out
