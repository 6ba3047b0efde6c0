"""A Hugging Face model directory: config.json -> ModelConfig, *.safetensors -> float32 weights.

Weights are already in LlamaForCausalLM naming and layout; we only gather the shards (one
model.safetensors, or the files model.safetensors.index.json maps names to), upcast to float32
and drop what is not a weight of the model (old checkpoints' rotary inv_freq buffers, a
duplicated lm_head when the embeddings are tied).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open

from replica.engine.config import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama",)
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def hf_model_config(path: str) -> ModelConfig:
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"no config.json in {path}")
    try:
        with open(config_file, encoding="utf-8") as f:
            cfg: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{config_file}: cannot read ({e})") from e
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{config_file}: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    num_heads = cfg["num_attention_heads"]
    eos = cfg.get("eos_token_id")
    return ModelConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_scaling=_rope_scaling(cfg),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
    )


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """transformers 4 writes `rope_scaling` (with "type" or "rope_type"); 5 writes
    `rope_parameters` (rope_theta included). Both become {"rope_type": ..., ...}, or None."""
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    params.pop("rope_theta", None)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    return None if rope_type == "default" else {"rope_type": rope_type, **params}


def _shard_files(path: str) -> list[str]:
    index_file = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index_file):
        with open(index_file, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        shards = [os.path.join(path, name) for name in dict.fromkeys(weight_map.values())]
        missing = [s for s in shards if not os.path.isfile(s)]
        if missing:
            raise FileNotFoundError(f"{index_file} names missing shard(s): {', '.join(missing)}")
        return shards
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(single):
        return [single]
    others = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if others:
        return [os.path.join(path, f) for f in others]
    raise FileNotFoundError(f"no *.safetensors weights in {path} (pytorch_model.bin is not supported)")


def hf_state_dict(path: str, config: ModelConfig,
                  slicer: Callable[[str], tuple[int, int, int] | None] | None = None) -> dict[str, torch.Tensor]:
    """Every weight, float32; with `slicer`, only the (axis, start, stop) part of the weights it
    names, read through `get_slice` (the rest of the tensor is never copied out of the map)."""
    state_dict: dict[str, torch.Tensor] = {}
    for shard in _shard_files(path):
        try:
            with safe_open(shard, framework="pt") as tensors:
                for name in tensors.keys():
                    if name.endswith("rotary_emb.inv_freq"):
                        continue
                    if name == "lm_head.weight" and config.tie_word_embeddings:
                        continue
                    part = slicer(name) if slicer else None
                    if part is None:
                        tensor = tensors.get_tensor(name)
                    else:
                        axis, start, stop = part
                        view = tensors.get_slice(name)
                        tensor = view[start:stop] if axis == 0 else view[:, start:stop]
                    state_dict[name] = tensor.float()
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{shard}: cannot read safetensors ({e})") from e
    return state_dict
