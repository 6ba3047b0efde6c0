"""The C kernels (csrc/), compiled once per machine and source: decode attention
(paged_attention.c), the GGUF-block matrix product (gguf_matmul.c), the batch's greedy picks
(row_argmax.c) and bfloat16 RMSNorm with the residual add (rms_norm.c).

Decode attention reads K/V pools of float32, bfloat16 or float16 (`KV_DTYPES`) where they lie and
computes in float32; queries go in as float32 and the output comes back in the query's dtype.

Compiled with the system C compiler into a cache folder keyed by the source hash; loaded with
ctypes (calls release the GIL). Where no compiler is found or the build fails, `load()` returns
None and the runner keeps the PyTorch path, so nothing depends on it being there.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_SOURCE = _CSRC / "paged_attention.c"
# not -ffast-math: it assumes no infinities; these allow vectorised reductions and nothing more
_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
          "-fassociative-math", "-fopenmp", "-shared", "-fPIC"]
KV_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _cache_dir() -> Path:
    root = os.environ.get("LLM_PLATFORM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llm-platform")
    return Path(root) / "native"


def _build(target: Path, flags: list[str], source: Path = _SOURCE) -> bool:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        log.warning("no C compiler found; decode attention uses the PyTorch path")
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_out = Path(tmp) / target.name
        result = subprocess.run([cc, *flags, str(source), "-o", str(tmp_out), "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            log.warning("building %s failed; the PyTorch path runs instead:\n%s", source.name, result.stderr)
            return False
        os.replace(tmp_out, target)  # atomic: concurrent builders never load a half-written file
    return True


class NativeAttention:
    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.paged_decode_attention
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float] + [ctypes.c_int64] * 2
        self._fn = fn
        self._set_bf16_dot = lib.paged_attention_set_bf16_dot
        self._set_bf16_dot.restype = None
        self._set_bf16_dot.argtypes = [ctypes.c_int64]
        has = lib.paged_attention_has_bf16_dot
        has.restype = ctypes.c_int64
        # bfloat16 pools and queries through AVX512-BF16's vdpbf16ps (no widening; probabilities
        # rounded to bfloat16 before the product with V, as PyTorch's CPU attention does)
        self.has_bf16_dot = bool(has())

    def set_bf16_dot(self, on: bool) -> None:
        """Process-wide (the library is loaded once): the vdpbf16ps path for bfloat16 (True, the
        default where the CPU has it) or the widening float32 path (False); for A/B and tests."""
        self._set_bf16_dot(1 if on else 0)

    @staticmethod
    def supports(kv_dtype: torch.dtype) -> bool:
        return kv_dtype in KV_DTYPES

    def decode(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
               block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
        """q: [B, nh, hd]; pools: [num_blocks, bs, kvh, hd] contiguous, one of KV_DTYPES;
        block_tables: [B, max_blocks] int64 (entries past a sequence's blocks are not read);
        context_lens: [B] int64. -> [B, nh, hd] in q's dtype."""
        q32 = q.to(torch.float32).contiguous()
        out = torch.empty_like(q32)
        b, nh, hd = q.shape
        _, bs, kvh, _ = k_pool.shape
        status = self._fn(q32.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), block_tables.data_ptr(),
                          context_lens.data_ptr(), out.data_ptr(), b, nh, kvh, hd, bs, block_tables.shape[1],
                          scale, KV_DTYPES[k_pool.dtype], torch.get_num_threads())
        if status != 0:
            raise ValueError(f"paged_decode_attention: shape out of the kernel's limits (nh={nh}, kvh={kvh}, "
                             f"hd={hd}, block_size={bs})")
        return out.to(q.dtype)


def _library(source: Path, portable: bool) -> ctypes.CDLL | None:
    if os.environ.get("LLM_PLATFORM_NO_NATIVE"):
        return None
    flags = _FLAGS + (["-DNATIVE_PORTABLE"] if portable else [])
    key = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{source.stem}-{key}.so"
    if not target.exists() and not _build(target, flags, source):
        return None
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        log.warning("loading %s failed (%s); the PyTorch path runs instead", target, exc)
        return None


def load(portable: bool = False) -> NativeAttention | None:
    """The decode-attention kernel, built on first use; None where it cannot be built (or
    LLM_PLATFORM_NO_NATIVE is set). `portable`: without the AVX-512 code path (tests compare both)."""
    lib = _library(_SOURCE, portable)
    return None if lib is None else NativeAttention(lib)


class GGUFMatmul:
    """y = x @ W^T with W in GGUF Q4_0 / Q4_1 / Q8_0 blocks (csrc/gguf_matmul.c). x and y in
    float32 or bfloat16 go straight through (the kernel reads and writes them); other dtypes
    through float32."""

    # "Q8_0_FX": Q8_0 blocks against the float activations themselves (int8 weight-only), the
    # others quantise the activations to int8 per 32 values as llama.cpp does
    TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q8_0_FX": 108}
    IO_DTYPES = {torch.float32: 0, torch.bfloat16: 1}

    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.gguf_matmul
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 5
        self._fn = fn

    def __call__(self, blocks: torch.Tensor, type_name: str, x: torch.Tensor, out_features: int) -> torch.Tensor:
        """blocks: uint8 [N, row bytes] contiguous; x: [M, K] (any float dtype) -> [M, N] in x's dtype."""
        return self.bind(blocks, type_name, out_features)(x)

    def bind(self, blocks: torch.Tensor, type_name: str, out_features: int):
        """The product with these blocks as a one-argument function of x (decode's hot path: the
        per-call work is one output allocation and one C call)."""
        fn, w, type_id = self._fn, blocks.data_ptr(), self.TYPES[type_name]

        def matmul(x: torch.Tensor) -> torch.Tensor:
            io = self.IO_DTYPES.get(x.dtype)
            if io is None:  # e.g. float16: through float32
                return matmul(x.to(torch.float32)).to(x.dtype)
            if not x.is_contiguous():
                x = x.contiguous()
            y = torch.empty(x.shape[0], out_features, dtype=x.dtype)
            if fn(w, type_id, x.data_ptr(), y.data_ptr(), x.shape[0], out_features, x.shape[1],
                  torch.get_num_threads(), io) != 0:
                raise ValueError(f"gguf_matmul: unsupported {type_name} or shape {tuple(x.shape)}")
            return y

        matmul.blocks = blocks  # the closure reads blocks' memory: keep it alive with it
        return matmul


def load_gguf_matmul(portable: bool = False) -> GGUFMatmul | None:
    lib = _library(_CSRC / "gguf_matmul.c", portable)
    return None if lib is None else GGUFMatmul(lib)


class RowArgmax:
    """Greedy picks for a batch in one pass (csrc/row_argmax.c): per row of float32 logits, the
    first index of the maximum (as torch.argmax) and whether the row is fit to sample from (no
    NaN, no +inf, not all -inf)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.row_argmax
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self._fn = fn

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits: [rows, n] float32 -> (index [rows] int64, fit [rows] bool)."""
        x = logits.to(torch.float32).contiguous()
        rows, n = x.shape
        index = torch.empty(rows, dtype=torch.int64)
        fit = torch.empty(rows, dtype=torch.uint8)
        if self._fn(x.data_ptr(), rows, n, index.data_ptr(), fit.data_ptr(), torch.get_num_threads()) != 0:
            raise ValueError(f"row_argmax: unsupported shape {tuple(x.shape)}")
        return index, fit.bool()


def load_row_argmax(portable: bool = False) -> RowArgmax | None:
    lib = _library(_CSRC / "row_argmax.c", portable)
    return None if lib is None else RowArgmax(lib)


class RMSNormKernel:
    """bfloat16 RMSNorm, optionally after the residual add, in one pass (csrc/rms_norm.c): the
    same roundings as the model's PyTorch path."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.rms_norm_bf16
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_float]
        self._fn = fn

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [rows, hidden] bfloat16; weight: [hidden] bfloat16 -> (h, normed): h = x +
        residual (x itself without residual), normed = RMSNorm(h)."""
        x = x.contiguous()
        out = torch.empty_like(x)
        h = x
        if residual is not None:
            residual = residual.contiguous()
            h = torch.empty_like(x)
        rows, hidden = x.shape
        if self._fn(x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(),
                    None if residual is None else h.data_ptr(), out.data_ptr(), rows, hidden, eps) != 0:
            raise ValueError(f"rms_norm_bf16: hidden size {hidden} beyond the kernel's limit")
        return h, out


def load_rms_norm(portable: bool = False) -> RMSNormKernel | None:
    lib = _library(_CSRC / "rms_norm.c", portable)
    return None if lib is None else RMSNormKernel(lib)


class DecodeLayer(ctypes.Structure):
    """csrc/decode_ops.c's `decode_layer`: one decoder layer's weights and KV pools."""

    _fields_ = [("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p),
                ("qkv", ctypes.c_void_p), ("o", ctypes.c_void_p), ("gate_up", ctypes.c_void_p),
                ("down", ctypes.c_void_p), ("qkv_type", ctypes.c_int64), ("o_type", ctypes.c_int64),
                ("gate_up_type", ctypes.c_int64), ("down_type", ctypes.c_int64),
                ("k_pool", ctypes.c_void_p), ("v_pool", ctypes.c_void_p)]


class DecodeKernels(ctypes.Structure):
    _fields_ = [("matmul", ctypes.c_void_p), ("attention", ctypes.c_void_p), ("rms_norm", ctypes.c_void_p)]


class DecodeOps:
    """Element-wise ops in one C pass each (csrc/decode_ops.c): SiLU x mul of the fused gate_up
    output and RoPE in place, float32 or bfloat16; and `decode_layers`, a whole decode step's
    decoder layers (GGUF-block projections, bfloat16) in one call."""

    DTYPES = {torch.float32: 0, torch.bfloat16: 1}
    MAX_DECODE_ROWS = 8

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        self._silu_mul = lib.silu_mul
        self._silu_mul.restype = ctypes.c_int
        self._silu_mul.argtypes = [vp, vp, i64, i64, i64, i64]
        self._rope = lib.rope
        self._rope.restype = ctypes.c_int
        self._rope.argtypes = [vp, i64, i64, i64, i64, vp, vp, i64, i64]
        self._layers = lib.decode_layers
        self._layers.restype = ctypes.c_int
        self._layers.argtypes = ([vp, i64, vp, vp, i64, vp, vp, vp, vp, i64, vp] + [i64] * 6
                                 + [ctypes.c_float, ctypes.c_float, i64])
        self._set_team = lib.decode_layers_set_team
        self._set_team.restype = None
        self._set_team.argtypes = [i64]

    TEAM_DEFAULT = True

    def set_team(self, on: bool) -> None:
        """decode_layers at more than one thread: one thread team for the whole call (True, the
        default: TEAM_DEFAULT) or a parallel region per kernel call (False); for A/B measurements
        and tests."""
        self._set_team(1 if on else 0)

    @classmethod
    def supports(cls, x: torch.Tensor) -> bool:
        return x.dtype in cls.DTYPES and x.device.type == "cpu"

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [rows, 2 I] (gate first), float32 or bfloat16 -> silu(gate) * up [rows, I]."""
        gate_up = gate_up.contiguous()
        rows, two_i = gate_up.shape
        out = torch.empty(rows, two_i // 2, dtype=gate_up.dtype)
        if self._silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, two_i // 2, self.DTYPES[gate_up.dtype],
                          torch.get_num_threads()) != 0:
            raise ValueError(f"silu_mul: unsupported {gate_up.dtype} or shape {tuple(gate_up.shape)}")
        return out

    def rope_(self, x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [rows, H, hd] contiguous (e.g. the fused qkv output); its first `heads` heads rotated
        in place. cos, sin: [rows, hd] (or [rows, 1, hd]) in x's dtype."""
        rows, total, hd = x.shape
        if not x.is_contiguous():
            raise ValueError("rope_: x must be contiguous")
        cos, sin = cos.reshape(rows, hd).contiguous(), sin.reshape(rows, hd).contiguous()
        if self._rope(x.data_ptr(), rows, total * hd, heads, hd, cos.data_ptr(), sin.data_ptr(),
                      self.DTYPES[x.dtype], torch.get_num_threads()) != 0:
            raise ValueError(f"rope: unsupported {x.dtype} or shape {tuple(x.shape)}")
        return x

    def bind_layers(self, layers: list[DecodeLayer], kernels: DecodeKernels, hidden: int, num_heads: int,
                    num_kv_heads: int, head_dim: int, intermediate: int, eps: float, scale: float):
        """The decoder layers as one function (x, cos, sin, slots, block_tables, context_lens,
        block_size) -> None: x [M, hidden] bfloat16 contiguous is replaced in place by the last
        layer's output. `layers` hold pointers: the caller keeps the tensors alive."""
        array = (DecodeLayer * len(layers))(*layers)
        fn, n, kref = self._layers, len(layers), ctypes.byref(kernels)

        def run(x, cos, sin, slots, block_tables, context_lens, block_size: int) -> None:
            status = fn(array, n, kref, x.data_ptr(), x.shape[0], cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
                        block_tables.data_ptr(), block_tables.shape[1], context_lens.data_ptr(), hidden,
                        num_heads, num_kv_heads, head_dim, intermediate, block_size, eps, scale,
                        torch.get_num_threads())
            if status != 0:
                raise ValueError(f"decode_layers failed ({status}) at {x.shape[0]} rows")

        run.keep = (array, kernels)  # ctypes memory the closure points into
        return run


def load_decode_ops(portable: bool = False) -> DecodeOps | None:
    lib = _library(_CSRC / "decode_ops.c", portable)
    return None if lib is None else DecodeOps(lib)


def function_address(fn) -> int:
    """The address of a loaded C function (a ctypes function pointer), for C callers."""
    return ctypes.cast(fn, ctypes.c_void_p).value
