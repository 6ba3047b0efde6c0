"""A llama.cpp GGUF checkpoint adapted to our model: config from `llama.*` metadata, weights
dequantised to float32 under Hugging Face LlamaForCausalLM names, in Hugging Face's layout.

llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute) reorders the rows of q_proj
and k_proj (weights and biases) within every head: HF's rotary pairs element i with i + d/2
("rotate half"), ggml's pairs 2i with 2i+1 (interleaved). Per head, rows were reshaped
[2, d/2] -> transposed -> [d/2, 2]; we apply the inverse so the weights work with HF's rotary.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np
import torch

from replica.engine.config import ModelConfig
from replica.engine.models.gguf_reader import GGUFReader

SUPPORTED_ARCHITECTURES = ("llama",)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_ROPE_FREQS = "rope_freqs.weight"  # llama-3 rope factors, one per rotary pair: part of the config
DEFAULT_LLAMA3_ORIGINAL_CONTEXT = 8192


def gguf_model_config(reader: GGUFReader) -> ModelConfig:
    """ModelConfig from the `<arch>.*` keys; ValueError for an unsupported architecture."""
    md = reader.metadata
    arch = md.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{reader.path}: architecture {arch!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def key(name: str, default: Any = None) -> Any:
        value = md.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"{reader.path}: missing metadata key {arch}.{name}")
        if isinstance(value, list):  # per-layer values (e.g. OpenELM): only uniform ones
            if len(set(value)) != 1:
                raise ValueError(f"{reader.path}: per-layer {arch}.{name} is not supported")
            value = value[0]
        return value

    hidden_size, num_heads = key("embedding_length"), key("attention.head_count")
    embed = reader.tensor_infos.get("token_embd.weight")
    vocab_size = md.get(f"{arch}.vocab_size") or len(md.get("tokenizer.ggml.tokens", [])) \
        or (embed.shape[0] if embed else None)
    rope_theta = float(key("rope.freq_base", 10000.0))
    head_dim = key("attention.key_length", hidden_size // num_heads)
    return ModelConfig(
        vocab_size=int(vocab_size),
        hidden_size=int(hidden_size),
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=int(num_heads),
        num_kv_heads=int(key("attention.head_count_kv", num_heads)),
        head_dim=int(head_dim),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=rope_theta,
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in reader.tensor_infos,
        rope_scaling=_rope_scaling(reader, arch, rope_theta, int(key("rope.dimension_count", head_dim))),
        bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(md[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
                            if md.get(k) is not None),
    )


def _rope_scaling(reader: GGUFReader, arch: str, rope_theta: float, rotary_dim: int) -> dict | None:
    md = reader.metadata
    kind = md.get(f"{arch}.rope.scaling.type")
    factor = md.get(f"{arch}.rope.scaling.factor") or md.get(f"{arch}.rope.scale_linear")
    original = md.get(f"{arch}.rope.scaling.original_context_length")
    if _ROPE_FREQS in reader.tensor_infos:
        return _llama3_rope_scaling(reader.load(_ROPE_FREQS), rope_theta, rotary_dim,
                                    original or DEFAULT_LLAMA3_ORIGINAL_CONTEXT)
    if kind in (None, "none") and factor in (None, 1.0):
        return None
    kind = kind or "linear"  # older files: only rope.scale_linear
    if kind not in ("linear", "yarn"):
        raise ValueError(f"{reader.path}: rope scaling {kind!r} is not supported")
    scaling = {"rope_type": kind, "factor": float(factor)}
    if original:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _llama3_rope_scaling(factors: np.ndarray, rope_theta: float, rotary_dim: int,
                         original_context: int) -> dict | None:
    """HF's llama3 rope parameters back from llama.cpp's per-pair divisors.

    The converter wrote, per rotary frequency f (wavelength w = 2*pi/f): 1 where w is short,
    `factor` where it is long, and 1 / ((1 - s) / factor + s) between, where
    s = (original_context / w - low_freq_factor) / (high_freq_factor - low_freq_factor).
    s is linear in 1/w, so two in-between points give low/high_freq_factor once the original
    context is fixed (the file may say; 8192, Llama 3.1's, otherwise). Only the product of
    those matters to the frequencies, so any consistent choice reproduces them.
    """
    factors = factors.astype(np.float64).reshape(-1)
    factor = float(factors.max())
    if factor <= 1.0:
        return None
    inv_wavelen = rope_theta ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim) / (2 * math.pi)
    between = (factors > 1.0 + 1e-6) & (factors < factor * (1 - 1e-6))
    if between.sum() < 2:
        raise ValueError("rope_freqs.weight: cannot recover llama3 rope parameters "
                         "(fewer than two smoothed frequencies)")
    smooth = (1.0 / factors[between] - 1.0 / factor) / (1.0 - 1.0 / factor)
    slope, intercept = np.polyfit(inv_wavelen[between], smooth, 1)  # s = slope / w + intercept
    span = original_context / slope  # high_freq_factor - low_freq_factor
    low = -intercept * span
    return {"rope_type": "llama3", "factor": round(factor, 6), "low_freq_factor": round(low, 4),
            "high_freq_factor": round(low + span, 4), "original_max_position_embeddings": original_context}


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k permutation: per head, rows [d/2, 2] -> [2, d/2].

    Numpy on purpose: a gather of whole rows, single-threaded; torch's multi-threaded copy is
    ~40x slower on a busy two-core machine.
    """
    rows = weight.shape[0]
    # source row of each HF row: [num_heads, d/2, 2] row ids read as [num_heads, 2, d/2]
    source = np.arange(rows).reshape(num_heads, rows // num_heads // 2, 2).transpose(0, 2, 1).reshape(-1)
    return weight[source]


def hf_name(gguf_name: str) -> str:
    """HF LlamaForCausalLM name of a llama GGUF tensor; ValueError for one we do not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_TENSOR.fullmatch(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise ValueError(f"unexpected tensor {gguf_name!r} in a llama GGUF file")
    layer, part, kind = m.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def gguf_state_dict(reader: GGUFReader, config: ModelConfig,
                    slicer: Callable[[str], tuple[int, int, int] | None] | None = None) -> dict[str, torch.Tensor]:
    """Every weight, float32, under HF names and in HF's row order. With `slicer`, only the
    (axis, start, stop) part of the weights it names is read and dequantised (`reader.load_part`).
    llama.cpp's q/k row permutation stays inside each head, so a run of whole heads is the same
    rows in either order."""
    state_dict: dict[str, torch.Tensor] = {}
    for gguf_name in reader.tensor_infos:
        if gguf_name == _ROPE_FREQS:
            continue
        name = hf_name(gguf_name)
        part = slicer(name) if slicer else None
        values = reader.load(gguf_name) if part is None else reader.load_part(gguf_name, *part)
        if ".q_proj." in name or ".k_proj." in name:
            values = unpermute_rotary_rows(values, values.shape[0] // config.head_dim)
        state_dict[name] = torch.from_numpy(values)
    return state_dict
