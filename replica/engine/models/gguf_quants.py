"""GGML tensor types and their dequantisation to float32 (vectorised numpy).

Every quantised type stores its values in fixed-size blocks laid end to end along the tensor's
fastest dimension (ne[0]); a block is a structured record of scales and packed integers. Each
kernel views the raw bytes as an array of those records (no copy) and returns the values in
order, flat. The arithmetic (which products happen first, all in float32) follows ggml's
reference dequantisers, so results are bit-identical to ggml's and to the `gguf` package's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

QK_K = 256  # values per super-block of the k-quants

_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)


@dataclass(frozen=True)
class GGMLType:
    """One entry of ggml's type table: `block_size` values are stored in `type_size` bytes."""

    type_id: int
    name: str
    block_size: int
    type_size: int
    dequantize: Callable[[np.ndarray], np.ndarray] | None  # raw uint8 bytes -> flat float32

    def num_bytes(self, num_elements: int) -> int:
        if num_elements % self.block_size:
            raise ValueError(f"{self.name}: {num_elements} values is not a whole number of "
                             f"{self.block_size}-value blocks")
        return num_elements // self.block_size * self.type_size


def _records(raw: np.ndarray, fields: list[tuple]) -> np.ndarray:
    """`raw` (uint8, contiguous) viewed as an array of block records."""
    return raw.view(np.dtype(fields))


def _f16(x: np.ndarray) -> np.ndarray:
    # [n] float16 -> [n, 1] float32, to broadcast over a block's values
    return x.astype(np.float32)[:, None]


def _low_high_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, k] packed bytes -> [n, 2k] uint8: all low nibbles first, then all high nibbles."""
    n, k = qs.shape
    return ((qs[:, None, :] >> _NIBBLE_SHIFTS[None, :, None]) & np.uint8(0x0F)).reshape(n, 2 * k)


def _nibbles_f32(qs: np.ndarray, offset: int = 0) -> np.ndarray:
    """As `_low_high_nibbles`, minus `offset`, straight into one float32 array (the only large
    allocation of a kernel: fresh memory costs page faults, which dominate load time)."""
    n, k = qs.shape
    out = np.empty((n, 2 * k), dtype=np.float32)
    out[:, :k] = qs & np.uint8(0x0F)
    out[:, k:] = qs >> np.uint8(4)
    if offset:
        out -= np.float32(offset)  # small integers: exact, same as offsetting before converting
    return out


def _bits(packed: np.ndarray, num_bits: int) -> np.ndarray:
    """[n, k] uint8 -> [n, num_bits, k]: bit b of every byte, as 0/1."""
    shifts = np.arange(num_bits, dtype=np.uint8)[None, :, None]
    return (packed[:, None, :] >> shifts) & np.uint8(1)


def _dequantize_f32(raw: np.ndarray) -> np.ndarray:
    return raw.view(np.float32).copy()


def _dequantize_f16(raw: np.ndarray) -> np.ndarray:
    return raw.view(np.float16).astype(np.float32)


def _dequantize_bf16(raw: np.ndarray) -> np.ndarray:
    # bf16 is the top half of a float32
    return (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _dequantize_f64(raw: np.ndarray) -> np.ndarray:
    return raw.view(np.float64).astype(np.float32)


def _dequantize_q8_0(raw: np.ndarray) -> np.ndarray:
    b = _records(raw, [("d", "<f2"), ("qs", "i1", (32,))])
    q = b["qs"].astype(np.float32)
    q *= _f16(b["d"])
    return q.reshape(-1)


def _dequantize_q4_0(raw: np.ndarray) -> np.ndarray:
    b = _records(raw, [("d", "<f2"), ("qs", "u1", (16,))])
    q = _nibbles_f32(b["qs"], offset=8)
    q *= _f16(b["d"])
    return q.reshape(-1)


def _dequantize_q4_1(raw: np.ndarray) -> np.ndarray:
    b = _records(raw, [("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])
    q = _nibbles_f32(b["qs"])
    q *= _f16(b["d"])
    q += _f16(b["m"])
    return q.reshape(-1)


def _five_bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: value i of a block is nibble i plus bit i of the 32-bit `qh` as bit 4."""
    n = qs.shape[0]
    high = _bits(qh.view(np.uint8).reshape(n, 4), 8).transpose(0, 2, 1).reshape(n, 32)
    return _low_high_nibbles(qs) | (high << np.uint8(4))


def _dequantize_q5_0(raw: np.ndarray) -> np.ndarray:
    b = _records(raw, [("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
    q = _five_bit(b["qh"].copy(), b["qs"]).astype(np.float32)
    q -= np.float32(16)
    q *= _f16(b["d"])
    return q.reshape(-1)


def _dequantize_q5_1(raw: np.ndarray) -> np.ndarray:
    b = _records(raw, [("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
    q = _five_bit(b["qh"].copy(), b["qs"]).astype(np.float32)
    q *= _f16(b["d"])
    q += _f16(b["m"])
    return q.reshape(-1)


def _k4_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins.

    Bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; scales/mins 4-7 take their low
    4 bits from bytes 8-11 (low/high nibble) and their top 2 bits from bytes 0-3/4-7's bits 6-7.
    """
    lo, mid, top = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=1)
    mins = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=1)
    return scales, mins


def _dequantize_q4_k(raw: np.ndarray) -> np.ndarray:
    b = _records(raw, [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
    n = b.shape[0]
    sc, mn = _k4_scales_mins(b["scales"])
    d = (_f16(b["d"]) * sc.astype(np.float32))[:, :, None]  # [n, 8, 1]
    dm = (_f16(b["dmin"]) * mn.astype(np.float32))[:, :, None]
    # four groups of 32 bytes; each gives 32 low nibbles (sub-block 2j) then 32 high (2j+1)
    q = _nibbles_f32(b["qs"].reshape(n * 4, 32)).reshape(n, 8, 32)
    q *= d
    q -= dm
    return q.reshape(-1)


def _dequantize_q5_k(raw: np.ndarray) -> np.ndarray:
    b = _records(raw, [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)),
                       ("qh", "u1", (32,)), ("qs", "u1", (128,))])
    n = b.shape[0]
    sc, mn = _k4_scales_mins(b["scales"])
    d = (_f16(b["d"]) * sc.astype(np.float32))[:, :, None]
    dm = (_f16(b["dmin"]) * mn.astype(np.float32))[:, :, None]
    low = _low_high_nibbles(b["qs"].reshape(n * 4, 32)).reshape(n, 8, 32)
    high = _bits(b["qh"], 8)  # [n, 8, 32]: bit s of qh[l] is bit 4 of value l of sub-block s
    q = (low | (high << np.uint8(4))).astype(np.float32)
    q *= d
    q -= dm
    return q.reshape(-1)


def _dequantize_q6_k(raw: np.ndarray) -> np.ndarray:
    b = _records(raw, [("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])
    n = b.shape[0]
    d = (_f16(b["d"]) * b["scales"].astype(np.float32))[:, :, None]  # [n, 16, 1]: one per 16 values
    # two halves of 128 values; in each, four runs of 32: low nibbles of ql[0:32], of ql[32:64],
    # high nibbles of ql[0:32], of ql[32:64]; their top 2 bits are bits 0-1, 2-3, 4-5, 6-7 of qh
    ql = b["ql"].reshape(n, 2, 2, 32)
    low = (ql[:, :, None, :, :] >> _NIBBLE_SHIFTS[None, None, :, None, None]) & np.uint8(0x0F)
    low = low.reshape(n, 2, 4, 32)
    qh = b["qh"].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    q = (low | ((qh & np.uint8(0x03)) << np.uint8(4))).reshape(n, 16, 16).astype(np.float32)
    q -= np.float32(32)
    q *= d
    return q.reshape(-1)


GGML_TYPES: dict[int, GGMLType] = {t.type_id: t for t in [
    GGMLType(0, "F32", 1, 4, _dequantize_f32),
    GGMLType(1, "F16", 1, 2, _dequantize_f16),
    GGMLType(2, "Q4_0", 32, 18, _dequantize_q4_0),
    GGMLType(3, "Q4_1", 32, 20, _dequantize_q4_1),
    GGMLType(6, "Q5_0", 32, 22, _dequantize_q5_0),
    GGMLType(7, "Q5_1", 32, 24, _dequantize_q5_1),
    GGMLType(8, "Q8_0", 32, 34, _dequantize_q8_0),
    GGMLType(9, "Q8_1", 32, 36, None),
    GGMLType(10, "Q2_K", QK_K, 84, None),
    GGMLType(11, "Q3_K", QK_K, 110, None),
    GGMLType(12, "Q4_K", QK_K, 144, _dequantize_q4_k),
    GGMLType(13, "Q5_K", QK_K, 176, _dequantize_q5_k),
    GGMLType(14, "Q6_K", QK_K, 210, _dequantize_q6_k),
    GGMLType(15, "Q8_K", QK_K, 292, None),
    GGMLType(16, "IQ2_XXS", QK_K, 66, None),
    GGMLType(17, "IQ2_XS", QK_K, 74, None),
    GGMLType(18, "IQ3_XXS", QK_K, 98, None),
    GGMLType(19, "IQ1_S", QK_K, 50, None),
    GGMLType(20, "IQ4_NL", 32, 18, None),
    GGMLType(21, "IQ3_S", QK_K, 110, None),
    GGMLType(22, "IQ2_S", QK_K, 82, None),
    GGMLType(23, "IQ4_XS", QK_K, 136, None),
    GGMLType(24, "I8", 1, 1, None),
    GGMLType(25, "I16", 1, 2, None),
    GGMLType(26, "I32", 1, 4, None),
    GGMLType(27, "I64", 1, 8, None),
    GGMLType(28, "F64", 1, 8, _dequantize_f64),
    GGMLType(29, "IQ1_M", QK_K, 56, None),
    GGMLType(30, "BF16", 1, 2, _dequantize_bf16),
    GGMLType(34, "TQ1_0", QK_K, 54, None),
    GGMLType(35, "TQ2_0", QK_K, 66, None),
    GGMLType(39, "MXFP4", 32, 17, None),
]}


def ggml_type(type_id: int) -> GGMLType:
    try:
        return GGML_TYPES[type_id]
    except KeyError:
        raise ValueError(f"unknown GGML tensor type id {type_id}") from None


def dequantize(raw: np.ndarray, type_id: int) -> np.ndarray:
    """Raw bytes of a tensor of GGML type `type_id` -> its values, flat float32 (a fresh array)."""
    t = ggml_type(type_id)
    if t.dequantize is None:
        supported = ", ".join(x.name for x in GGML_TYPES.values() if x.dequantize is not None)
        raise ValueError(f"GGML tensor type {t.name} is not supported (supported: {supported})")
    if raw.size % t.type_size:
        raise ValueError(f"{t.name}: {raw.size} bytes is not a whole number of {t.type_size}-byte blocks")
    return t.dequantize(np.ascontiguousarray(raw, dtype=np.uint8))
