"""A deliberately broken model version for canary tests: a copy of a GGUF file with one tensor
changed, so the model loads and answers, but with garbage."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from replica.engine.models.gguf_reader import GGUFReader


def negate_tensor(src: str | Path, dst: str | Path, tensor: str = "output_norm.weight") -> Path:
    """Copy `src` to `dst` with the F32 tensor `tensor` negated. Negating the final norm of a
    model with tied embeddings negates every logit, so greedy decoding picks the least likely
    token each step: fluent-looking weights, garbage answers."""
    info = GGUFReader(str(src)).tensor_infos[tensor]
    if info.type_name != "F32":
        raise ValueError(f"{tensor} is {info.type_name}; only F32 tensors are negated here")
    dst = Path(dst)
    shutil.copyfile(src, dst)
    data = np.memmap(dst, dtype=np.float32, mode="r+", offset=info.offset, shape=(info.num_elements,))
    data *= -1.0
    data.flush()
    del data
    return dst
