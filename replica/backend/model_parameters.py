"""ModelParameters: the `parameters` block of config.pbtxt, written by the launcher and read by
model.py, so that the key names live in one place.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from replica.engine.config import EngineConfig

_DEFAULTS = EngineConfig(model_path="")


@dataclass(frozen=True)
class ModelParameters:
    weights: str = ""  # "" = the bundled default model
    dtype: str = _DEFAULTS.dtype
    device: str = _DEFAULTS.device  # "cpu" or "cuda" (torch device of the engine)
    quantization: str = _DEFAULTS.quantization  # "none" | "int8" (ModelVersion.quantization; "" = none)
    kv_cache_bytes: int = _DEFAULTS.kv_cache_bytes
    kv_cache_blocks: int = _DEFAULTS.kv_cache_blocks  # 0: as many as kv_cache_bytes buys
    max_num_seqs: int = _DEFAULTS.max_num_seqs
    max_num_batched_tokens: int = _DEFAULTS.max_num_batched_tokens
    num_threads: int = 0  # torch intra-op threads; 0 = torch's default
    tensor_parallel: int = _DEFAULTS.tensor_parallel  # ranks one replica runs over (replica/engine/parallel/)
    drain_file: str = ""  # "" = no drain signal
    drain_grace_s: float = 30.0
    engine_dead_file: str = ""  # written (with the reason) when the engine loop dies; "" = none
    fault_file: str = ""  # fault injection (tests, benchmarks): when it appears, the loop dies

    @classmethod
    def from_model_config(cls, model_config: dict[str, Any]) -> "ModelParameters":
        """From the model config JSON Triton hands to `initialize` (unknown keys are ignored)."""
        raw = {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}
        kwargs: dict[str, Any] = {}
        for name, default in cls().__dict__.items():
            if name in raw and raw[name] != "":
                kwargs[name] = type(default)(raw[name])
        return cls(**kwargs)

    def engine_config(self, default_weights: str) -> EngineConfig:
        return EngineConfig(
            model_path=self.weights or default_weights,
            dtype=self.dtype,
            device=self.device,
            quantization=self.quantization,
            kv_cache_bytes=self.kv_cache_bytes,
            kv_cache_blocks=self.kv_cache_blocks,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_threads=self.num_threads or None,
            tensor_parallel=self.tensor_parallel,
        )

    def render_into(self, config_pbtxt: str) -> str:
        """Replace the template's `parameters` entries with these values (keys must exist)."""
        for name, value in self.__dict__.items():
            pattern = re.compile(r'(key:\s*"%s"\s*value:\s*\{\s*string_value:\s*)"[^"]*"' % re.escape(name))
            escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
            config_pbtxt, count = pattern.subn(lambda m: f'{m.group(1)}"{escaped}"', config_pbtxt)
            if count != 1:
                raise ValueError(f"config.pbtxt template has {count} entries for parameter {name!r}")
        return config_pbtxt
