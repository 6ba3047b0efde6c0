"""int4: a GGUF checkpoint's Q4_0 / Q4_1 (and Q8_0) weight blocks served as stored.

`gguf_block_weights(reader, config)` reads every projection and the embedding table as raw
blocks (no dequantisation), rows in Hugging Face order (q/k rows un-permuted as whole rows of
blocks). `quantize_int4(model, blocks)` then gives each fused projection (qkv, o, gate_up, down)
and the head a GGUFLinear: for up to `KERNEL_MAX_ROWS` rows (decode) it runs the C block
product (runner/csrc/gguf_matmul.c: 4.5 bits a weight read instead of 16, int8 activations per
32 values as llama.cpp does); for more rows (prefill) the float GEMM on the dequantised weight
the model already holds, which is faster there. The float weights stay (memory: the blocks
are ~30% on top of bfloat16), so int4 changes what decode reads, not the model's footprint.

Blocks exist only for GGUF files whose projections are Q4_0, Q4_1 or Q8_0; anything else makes
int4 a ValueError at load (the launcher reports it).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from replica.engine.config import ModelConfig
from replica.engine.models.gguf_checkpoint import _ROPE_FREQS, hf_name
from replica.engine.models.gguf_reader import GGUFReader
from replica.engine.runner import native

BLOCK_TYPES = ("Q4_0", "Q4_1", "Q8_0")
KERNEL_MAX_ROWS = 8  # rows up to which the block product beats the float GEMM (decode)


class BlockWeight:
    """One matrix as GGUF blocks: `blocks` uint8 [rows, row bytes], `type_name` in BLOCK_TYPES."""

    def __init__(self, type_name: str, blocks: torch.Tensor) -> None:
        self.type_name, self.blocks = type_name, blocks

    @staticmethod
    def cat(parts: list["BlockWeight"]) -> "BlockWeight":
        types = {p.type_name for p in parts}
        if len(types) != 1:
            raise ValueError(f"fused projection of mixed block types {sorted(types)}")
        return BlockWeight(parts[0].type_name, torch.cat([p.blocks for p in parts]))


def _rotary_rows(num_rows: int, num_heads: int) -> np.ndarray:
    # the same row order as gguf_checkpoint.unpermute_rotary_rows
    return np.arange(num_rows).reshape(num_heads, num_rows // num_heads // 2, 2).transpose(0, 2, 1).reshape(-1)


def gguf_block_weights(reader: GGUFReader, config: ModelConfig) -> dict[str, BlockWeight]:
    """HF name -> BlockWeight for every 2-D tensor stored in one of BLOCK_TYPES."""
    out: dict[str, BlockWeight] = {}
    for gguf_name, info in reader.tensor_infos.items():
        if gguf_name == _ROPE_FREQS or info.type_name not in BLOCK_TYPES or len(info.shape) != 2:
            continue
        name = hf_name(gguf_name)
        rows = np.array(reader.raw(gguf_name)).reshape(info.shape[0], -1)  # a copy: the map may close
        if ".q_proj." in name:
            rows = rows[_rotary_rows(rows.shape[0], config.num_heads)]
        elif ".k_proj." in name:
            rows = rows[_rotary_rows(rows.shape[0], config.num_kv_heads)]
        out[name] = BlockWeight(info.type_name, torch.from_numpy(np.ascontiguousarray(rows)))
    return out


def load_block_weights(path: str, config: ModelConfig) -> dict[str, BlockWeight]:
    """The block weights of the checkpoint at `path`; ValueError unless it is a GGUF file."""
    if not str(path).endswith(".gguf"):
        raise ValueError(f"int4 serves a GGUF file's Q4_0/Q4_1 blocks; {path} is not a .gguf file")
    return gguf_block_weights(GGUFReader(path), config)


KERNEL_MAX_ROWS_BLOCKS_ONLY = 64  # without a float copy the block product serves a full decode batch too


def q8_0_blocks(weight: torch.Tensor) -> BlockWeight:
    """A float matrix [N, K] (K a multiple of 32) quantised to GGUF's Q8_0 blocks, ggml's way:
    per 32 values d = max|w| / 127 (stored as float16), q = round(w / d) (half away from zero)."""
    n, k = weight.shape
    if k % 32:
        raise ValueError(f"Q8_0 needs rows of a multiple of 32 values, not {k}")
    w = weight.detach().float().cpu().reshape(n, k // 32, 32)
    d = w.abs().amax(dim=-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    v = w * inv.unsqueeze(-1)
    q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).clamp(-127, 127).to(torch.int8)
    rec = np.zeros((n, k // 32), dtype=[("d", "<f2"), ("qs", "i1", (32,))])
    rec["d"] = d.numpy().astype(np.float16)
    rec["qs"] = q.numpy()
    return BlockWeight("Q8_0", torch.from_numpy(rec.view(np.uint8).reshape(n, -1).copy()))


def dequantize_q8_0(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Q8_0 blocks uint8 [N, nb * 34] (or a selection of rows) -> [N, nb * 32] in `dtype`."""
    rec = blocks.reshape(*blocks.shape[:-1], -1, 34)
    d = rec[..., :2].contiguous().view(torch.float16).float()  # [..., nb, 1]
    q = rec[..., 2:].contiguous().view(torch.int8).float()
    return (q * d).reshape(*blocks.shape[:-1], -1).to(dtype)


class GGUFLinear(nn.Module):
    """y = x @ W.T: the block product for up to `kernel_max_rows` rows, else the float GEMM (on
    the float weight the model holds, or, with `weight` None, on the blocks dequantised for the
    call: int8 keeps no float copy)."""

    def __init__(self, weight: torch.Tensor | None, block: BlockWeight, kernel: native.GGUFMatmul | None) -> None:
        super().__init__()
        if weight is None and block.type_name != "Q8_0":
            raise ValueError("only Q8_0 blocks are dequantised per call; keep the float weight")
        self.out_features = block.blocks.shape[0]
        self.in_features = weight.shape[1] if weight is not None else block.blocks.shape[1] // 34 * 32
        if weight is not None and weight.shape[0] != self.out_features:
            raise ValueError(f"blocks hold {block.blocks.shape[0]} rows, the weight {weight.shape[0]}")
        self.weight = nn.Parameter(weight, requires_grad=False) if weight is not None else None
        self.register_buffer("blocks", block.blocks.contiguous())
        self.type_name = block.type_name
        # block-only (int8): the product keeps the activations in float (weight-only error);
        # with a float copy (int4): int8 activations per 32 values, as llama.cpp
        self.kernel_type = "Q8_0_FX" if weight is None else block.type_name
        self.kernel = kernel
        limit = KERNEL_MAX_ROWS if weight is not None else KERNEL_MAX_ROWS_BLOCKS_ONLY
        self.kernel_max_rows = limit if kernel is not None else 0
        self._bind()

    def _bind(self) -> None:
        kernel = self.kernel
        self._product = kernel.bind(self.blocks, self.kernel_type, self.out_features) if kernel is not None else None

    def _apply(self, fn, *args, **kwargs):  # .to() / .cpu() may replace the blocks: bind to the new ones
        out = super()._apply(fn, *args, **kwargs)
        self._bind()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.kernel_max_rows and x.device.type == "cpu":
            return self._product(x)  # in x's dtype
        if self.weight is None:
            return nn.functional.linear(x, dequantize_q8_0(self.blocks, x.dtype).to(x.device))
        return nn.functional.linear(x, self.weight)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.type_name} blocks "
                f"({self.kernel_type} product) up to {self.kernel_max_rows} rows")


def quantize_int4(model: nn.Module, blocks: dict[str, BlockWeight]) -> None:
    """Give a loaded (fused) LlamaForCausalLM's projections and head their GGUF blocks."""
    kernel = native.load_gguf_matmul()
    need = ["model.embed_tokens.weight" if model.config.tie_word_embeddings else "lm_head.weight"]
    for i in range(model.config.num_layers):
        p = f"model.layers.{i}."
        need += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"] + [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    missing = [n for n in need if n not in blocks]
    if missing:
        raise ValueError(f"int4 serves a GGUF file's Q4_0/Q4_1/Q8_0 blocks; these weights have none: {missing[:3]}")
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        qkv = BlockWeight.cat([blocks[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        attn.qkv_proj = GGUFLinear(attn.qkv_proj.weight, qkv, kernel)
        attn.o_proj = GGUFLinear(attn.o_proj.weight, blocks[p + "self_attn.o_proj.weight"], kernel)
        gate_up = BlockWeight.cat([blocks[p + "mlp.gate_proj.weight"], blocks[p + "mlp.up_proj.weight"]])
        mlp.gate_up_proj = GGUFLinear(mlp.gate_up_proj.weight, gate_up, kernel)
        mlp.down_proj = GGUFLinear(mlp.down_proj.weight, blocks[p + "mlp.down_proj.weight"], kernel)
    head = model.model.embed_tokens.weight if model.config.tie_word_embeddings else model.lm_head.weight
    model.quantized_head = GGUFLinear(head, blocks[need[0]], kernel)


class BlockEmbedding(nn.Module):
    """Row lookup into a Q8_0 GGUFLinear's blocks (int8's tied embedding and head: one copy)."""

    def __init__(self, head: GGUFLinear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = (head,)  # a tuple: not a submodule, so its blocks are not listed twice
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_q8_0(self.table[0].blocks[ids.cpu()], self.dtype).to(ids.device)


def set_kernel_max_rows(model: nn.Module, rows: int) -> None:
    """Every GGUFLinear of `model` uses its block product up to `rows` rows (tests: a whole
    teacher-forced sequence through the kernel)."""
    for module in model.modules():
        if isinstance(module, GGUFLinear) and module.kernel is not None:
            module.kernel_max_rows = rows
    if hasattr(model, "_fused_layers"):
        model._fused_layers = None  # the fused decode step reads the rows limit when it binds
