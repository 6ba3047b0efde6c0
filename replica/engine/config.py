"""Configuration of the model (what the weights say) and of the engine (how we serve them)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Weight quantisations (models/quantization.py); the names a ModelVersion.quantization may hold.
NONE = "none"
INT8 = "int8"
INT4 = "int4"
BUILT = (NONE, INT8, INT4)  # int4: a GGUF file's Q4_0/Q4_1 blocks as stored (models/gguf_linear.py)
# A checkpoint's own storage format (GGUF tensor types the loader reads): served as "none", i.e.
# dequantised at load into the engine dtype. The seeded demo version says "Q4_1", its GGUF's type.
CHECKPOINT_FORMATS = frozenset({"F32", "F16", "BF16", "F64", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                "Q4_K", "Q5_K", "Q6_K"})


def normalize_quantization(name: str | None) -> str:
    """"" / "none" / a checkpoint format ("Q4_1") -> "none"; "int8" -> "int8"; "int4" -> "int4";
    anything else -> ValueError."""
    value = (name or "").strip().lower()
    if value in ("", NONE) or value.upper() in CHECKPOINT_FORMATS:
        return NONE
    if value == INT8:
        return INT8
    if value == INT4:
        return INT4
    raise ValueError(f"unknown quantization {name!r}; use one of {', '.join(BUILT)}, "
                     "or the checkpoint's own GGUF type (served dequantised)")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder, as read from GGUF metadata or a Hugging Face config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = True
    rope_scaling: dict[str, Any] | None = None  # HF-style: {"rope_type": "llama3"|"linear", ...}
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()


@dataclass
class EngineConfig:
    model_path: str  # a GGUF file or a Hugging Face model directory
    dtype: str = "auto"  # bfloat16 | float32 | auto (the faster of the two here; see dtype.py)
    device: str = "cpu"
    quantization: str = "none"  # none | int8 (weights; int4 is not built): models/quantization.py
    block_size: int = 16
    kv_cache_bytes: int = 256 * 1024 * 1024
    # Exactly this many KV blocks instead of what kv_cache_bytes buys (0: by the bytes). The
    # bytes buy half the blocks in float32 that they buy in bfloat16, so a pool declared in
    # bytes holds a different number of prompts on machines where `dtype auto` differs; a
    # benchmark or a test that needs a given number of blocks declares them here.
    kv_cache_blocks: int = 0
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # default: the model's context length
    enable_prefix_caching: bool = True
    num_threads: int | None = None  # torch intra-op threads; None = torch's default
    tensor_parallel: int = 1  # ranks (devices) one replica runs over: replica/engine/parallel/
    extra: dict[str, Any] = field(default_factory=dict)
