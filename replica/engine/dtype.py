"""Choosing the compute dtype.

`auto` means bfloat16 on CUDA, and on a CPU whichever of bfloat16 and float32 multiplies
matrices faster here: CPUs with AVX512-BF16 or AMX run bf16 ~2-3x faster than fp32, while an
AVX2-only CPU emulates bf16 and runs it ~6x slower (measured on this project's CI machines).
"""
from __future__ import annotations

import time

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _matmul_seconds(dtype: torch.dtype, device: torch.device, reps: int = 3) -> float:
    x = torch.randn(64, 576, dtype=dtype, device=device)
    w = torch.randn(1536, 576, dtype=dtype, device=device)
    torch.nn.functional.linear(x, w)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return best


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    device = torch.device(device)
    if name == "auto":
        if device.type != "cpu":
            return torch.bfloat16
        faster = _matmul_seconds(torch.bfloat16, device) < _matmul_seconds(torch.float32, device)
        return torch.bfloat16 if faster else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; use auto or one of {sorted(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]
