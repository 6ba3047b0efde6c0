"""Weight quantisation at load: int8, symmetric, weight-only.

`quantize_model(model, "int8")`, after the fused projections exist:
- on a CPU where the C block product builds (`_int8_as_blocks`): every projection of the decoder
  layers (qkv, o, gate_up, down) and the head become GGUF Q8_0 blocks (models/gguf_linear.py:
  one float16 scale per 32 values) in block-only GGUFLinears, multiplied against the float
  activations as they are ("Q8_0_FX"), the tied embedding a lookup into the head's blocks; the
  decode step runs as one C call as int4's does (docs/engine.md);
- elsewhere (no compiler, other devices): Int8Linear, one float32 scale per output channel, and
  one int8 table that both the lookup (Int8Embedding) and the head read.
Norms, RoPE, attention and the KV cache stay in the engine dtype.

Weight-only: activations are not quantised. Measured on SmolLM2 (docs/replica.md, "Quantised
versions"), int8 activations quantised per tensor (PyTorch's fbgemm `quantized::linear_dynamic`)
agreed with the float model on the top-1 token only ~58% of the time; int8 weights alone ~98%.

Int8Linear on a CPU runs PyTorch's int8-weight kernel (`torch._weight_int8pack_mm`: activations
in bfloat16 (a float32 engine passes each as two bfloat16 parts), weights dequantised in
registers) for up to `KERNEL_MAX_ROWS` rows; with more rows (prefill) the weight is dequantised
into the engine dtype for the call and the float GEMM runs. On other devices it always
dequantises per call: the memory saving stays, the speed-up does not. int4 is a GGUF file's own
Q4 blocks (models/gguf_linear.py), not a quantisation done here.
"""
from __future__ import annotations

import torch
from torch import nn

from replica.engine.config import INT8, NONE, normalize_quantization  # noqa: F401

# rows up to which the int8 kernel beats dequantise + float GEMM (measured, README): bfloat16's
# GEMM is fast on CPUs with AVX512-BF16, float32's is slower, so the crossover comes later
KERNEL_MAX_ROWS = {torch.bfloat16: 32, torch.float32: 64}  # float32: rows count twice (hi/lo)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel (row): weight ~= q * scale[:, None], q in [-127, 127]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def int8_kernel_available(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(torch, "_weight_int8pack_mm")


class Int8Linear(nn.Module):
    """y = x @ (q * scale).T with q int8 [out, in] and scale [out]; no bias (Llama has none)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, compute_dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("scale", scale.float())
        self.register_buffer("scale_bf16", scale.to(torch.bfloat16), persistent=False)
        self.register_buffer("scale_fix", self.scale / self.scale_bf16.float(), persistent=False)
        self.use_kernel = int8_kernel_available(q.device)
        self.kernel_max_rows = KERNEL_MAX_ROWS.get(compute_dtype, 0)

    @classmethod
    def from_float(cls, weight: torch.Tensor, compute_dtype: torch.dtype) -> "Int8Linear":
        q, scale = quantize_int8(weight)
        return cls(q.to(weight.device), scale.to(weight.device), compute_dtype)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.qweight.to(dtype).mul_(self.scale.to(dtype)[:, None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in]
        rows = x.shape[0]
        if not (self.use_kernel and rows <= self.kernel_max_rows):
            return nn.functional.linear(x, self.dequantized_weight(x.dtype))
        if x.dtype == torch.bfloat16:
            return torch._weight_int8pack_mm(x.contiguous(), self.qweight, self.scale_bf16)
        # The kernel takes bfloat16 activations and scales. For a float32 engine, split x into a
        # bfloat16 head and the bfloat16 rest (one call, twice the rows: decode is memory-bound)
        # and undo the scales' rounding: top-1 agreement with float32 went from 0.93 to 0.97.
        hi = x.to(torch.bfloat16)
        lo = (x - hi.to(x.dtype)).to(torch.bfloat16)
        y = torch._weight_int8pack_mm(torch.cat([hi, lo]), self.qweight, self.scale_bf16).to(x.dtype)
        return (y[:rows] + y[rows:]) * self.scale_fix.to(x.dtype)

    def extra_repr(self) -> str:
        kernel = f"int8 kernel up to {self.kernel_max_rows} rows" if self.use_kernel else "dequantised per call"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kernel}"


class Int8Embedding(nn.Module):
    """Row lookup into the head's int8 table (one copy of the tied weights)."""

    def __init__(self, head: Int8Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = (head,)  # a tuple: not a submodule, so its buffers are not listed twice
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        head = self.table[0]
        return (head.qweight[ids].float() * head.scale[ids, None]).to(self.dtype)


def _int8_as_blocks(model: nn.Module, dtype: torch.dtype) -> bool:
    """int8 as GGUF Q8_0 blocks (8-bit values, one float16 scale per 32) where the C block product
    exists (a CPU with a compiler): every projection and the head become block-only GGUFLinears
    (no float copy kept; dequantised per call for prefill's many rows), the tied embedding a
    lookup into the head's blocks, and a decode step of up to 8 sequences runs as one C call
    (decode_layers), as int4 does. False (nothing changed) where that cannot be."""
    from replica.engine.models.gguf_linear import BlockEmbedding, GGUFLinear, q8_0_blocks
    from replica.engine.runner import native

    device = next(model.parameters()).device
    kernel = native.load_gguf_matmul() if device.type == "cpu" else None
    mats = [m.weight for layer in model.model.layers
            for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    if kernel is None or any(w.shape[1] % 32 for w in [*mats, model.model.embed_tokens.weight]):
        return False
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = GGUFLinear(None, q8_0_blocks(attn.qkv_proj.weight), kernel)
        attn.o_proj = GGUFLinear(None, q8_0_blocks(attn.o_proj.weight), kernel)
        mlp.gate_up_proj = GGUFLinear(None, q8_0_blocks(mlp.gate_up_proj.weight), kernel)
        mlp.down_proj = GGUFLinear(None, q8_0_blocks(mlp.down_proj.weight), kernel)
    if model.config.tie_word_embeddings:
        model.quantized_head = GGUFLinear(None, q8_0_blocks(model.model.embed_tokens.weight), kernel)
        model.model.embed_tokens = BlockEmbedding(model.quantized_head, dtype)
    else:
        model.quantized_head = GGUFLinear(None, q8_0_blocks(model.lm_head.weight), kernel)
        del model.lm_head
        model.embed_table = GGUFLinear(None, q8_0_blocks(model.model.embed_tokens.weight), kernel)
        model.model.embed_tokens = BlockEmbedding(model.embed_table, dtype)
    return True


def quantize_model(model: nn.Module, method: str) -> None:
    """Quantise a loaded (fused) LlamaForCausalLM in place. method: "none" or "int8"."""
    method = normalize_quantization(method)
    if method == NONE:
        return
    dtype = next(model.parameters()).dtype
    if _int8_as_blocks(model, dtype):
        model.quantization = method
        return
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = Int8Linear.from_float(attn.qkv_proj.weight, dtype)
        attn.o_proj = Int8Linear.from_float(attn.o_proj.weight, dtype)
        mlp.gate_up_proj = Int8Linear.from_float(mlp.gate_up_proj.weight, dtype)
        mlp.down_proj = Int8Linear.from_float(mlp.down_proj.weight, dtype)
    if model.config.tie_word_embeddings:
        model.quantized_head = Int8Linear.from_float(model.model.embed_tokens.weight, dtype)
        model.model.embed_tokens = Int8Embedding(model.quantized_head, dtype)
    else:  # the lookup table and the head are two matrices: both int8
        model.quantized_head = Int8Linear.from_float(model.lm_head.weight, dtype)
        del model.lm_head
        model.embed_table = Int8Linear.from_float(model.model.embed_tokens.weight, dtype)
        model.model.embed_tokens = Int8Embedding(model.embed_table, dtype)
    model.quantization = method


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's weights take at rest: parameters and buffers (int8 tables, scales), each
    tensor counted once; the RoPE frequencies are not weights."""
    seen: set[int] = set()
    total = 0
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if name.endswith("inv_freq") or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
