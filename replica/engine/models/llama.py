"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over paged KV.

Parameter names follow Hugging Face's LlamaForCausalLM, so a state dict from the loader (GGUF or
safetensors) loads as is. Shapes: T = tokens in the step (flat over sequences), H = hidden size,
nh / kvh = query / key-value heads, hd = head dim.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from replica.engine.config import ModelConfig
from replica.engine.runner import native
from replica.engine.runner.attention import AttentionMetadata, paged_attention, write_kv


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, kernel: native.RMSNormKernel | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.kernel = kernel  # bfloat16 on the CPU: one C pass (runner/csrc/rms_norm.c)

    def _fused(self, x: torch.Tensor) -> bool:
        return (self.kernel is not None and x.dtype == torch.bfloat16 and x.device.type == "cpu"
                and self.weight.dtype == torch.bfloat16 and x.dim() == 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fused(x):
            return self.kernel(x, self.weight, self.eps)[1]
        if x.dtype == torch.float32:  # one fused kernel; the same arithmetic as below
            return torch.nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, RMSNorm(x + residual)): one C pass in bfloat16 on the CPU."""
        if self._fused(x):
            return self.kernel(x, self.weight, self.eps, residual)
        h = x + residual
        return h, self(h)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope scaling {kind!r}")
    return inv_freq


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _packing_available() -> bool:
    """Whether oneDNN packs bfloat16 weights on this CPU: it needs AVX512 (BW, VL, DQ) or
    AVX-NE-CONVERT, and says so by refusing (an AVX2-only CPU, e.g. AMD Zen 2: measured);
    asked once, with a tiny weight."""
    try:
        if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
            return False
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
        return True
    except (AttributeError, RuntimeError):
        return False


_PACKING = _packing_available()


def packed_linear(x: torch.Tensor, weight: torch.Tensor, holder) -> torch.Tensor:
    """x @ weight^T. bfloat16 on the CPU: through a copy of the weight packed once for oneDNN's
    blocked (AMX) GEMM, kept on `holder._packed` and rebuilt when the weight's storage changes
    (`.to()`, a reload). A plain `F.linear` in bfloat16 re-packs the whole weight on every call
    (oneDNN's brgemm reads its own layout): 1.2-1.8x slower at decode's row counts on this
    machine, the same bits (tested). Anything else (float32, where the packed GEMM is not
    bit-equal to MKL's, other devices, empty inputs, `PackedLinear.enabled` False) is `F.linear`."""
    if not (PackedLinear.enabled and _PACKING and weight.dtype == torch.bfloat16 and x.dtype == torch.bfloat16
            and weight.device.type == "cpu" and x.device.type == "cpu" and x.dim() == 2 and x.shape[0] > 0):
        return nn.functional.linear(x, weight)
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor keeps no version counter
        version = None
    key = (weight.data_ptr(), tuple(weight.shape), version)
    packed = getattr(holder, "_packed", None)
    if packed is None or packed[0] != key:
        packed = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 64))
        holder._packed = packed
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed[1], None, "none", [], "")


class PackedLinear(nn.Linear):
    """nn.Linear without bias whose bfloat16 CPU product runs on a pre-packed weight
    (`packed_linear`; the packed copy costs the weight's size again in memory)."""

    enabled = True  # class-wide switch: False runs F.linear (benchmarks compare both)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            return super().forward(x)
        return packed_linear(x, self.weight, self)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, ops: native.DecodeOps | None = None) -> None:
        super().__init__()
        self.ops = ops  # RoPE in place in one C pass (float32, bfloat16 on the CPU), else PyTorch
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        h, q_dim, kv_dim = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(h, q_dim, bias=False)
        self.k_proj = nn.Linear(h, kv_dim, bias=False)
        self.v_proj = nn.Linear(h, kv_dim, bias=False)
        self.o_proj = PackedLinear(q_dim, h, bias=False)

    def fuse(self) -> None:
        """One [q; k; v] projection: one bigger matrix product instead of three (after loading)."""
        fused = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        self.qkv_proj = PackedLinear(fused.shape[1], fused.shape[0], bias=False, device=fused.device, dtype=fused.dtype)
        self.qkv_proj.weight = nn.Parameter(fused, requires_grad=False)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, cos, sin, k_pool, v_pool, meta: AttentionMetadata) -> torch.Tensor:
        t, nh, kvh = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(t, nh + 2 * kvh, self.head_dim)  # [T, nh + 2 kvh, hd]
        if self.ops is not None and self.ops.supports(qkv) and qkv.is_contiguous() and cos.dtype == qkv.dtype:
            qk = self.ops.rope_(qkv, nh + kvh, cos, sin)[:, : nh + kvh]  # in place: the output is ours
        else:
            qk = qkv[:, : nh + kvh]
            qk = qk * cos + rotate_half(qk) * sin  # RoPE on q and k at once; cos, sin: [T, 1, hd]
        q, k, v = qk[:, :nh], qk[:, nh:], qkv[:, nh + kvh :]  # [T, nh, hd], [T, kvh, hd] x2
        write_kv(k_pool, v_pool, k, v, meta.slot_mapping)
        o = paged_attention(q, k, v, k_pool, v_pool, meta, self.scale)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: native.DecodeOps | None = None) -> None:
        super().__init__()
        self.ops = ops  # SiLU x mul in one C pass (float32, bfloat16 on the CPU), else PyTorch
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = PackedLinear(config.intermediate_size, config.hidden_size, bias=False)

    def fuse(self) -> None:
        """One [gate; up] projection (after loading)."""
        fused = torch.cat([self.gate_proj.weight, self.up_proj.weight])
        self.gate_up_proj = PackedLinear(fused.shape[1], fused.shape[0], bias=False, device=fused.device, dtype=fused.dtype)
        self.gate_up_proj.weight = nn.Parameter(fused, requires_grad=False)
        self.intermediate_size = self.gate_proj.weight.shape[0]
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 I]
        if self.ops is not None and self.ops.supports(gate_up):
            return self.down_proj(self.ops.silu_mul(gate_up))
        gate, up = gate_up[:, : self.intermediate_size], gate_up[:, self.intermediate_size :]
        return self.down_proj(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, norm_kernel: native.RMSNormKernel | None = None,
                 ops: native.DecodeOps | None = None) -> None:
        super().__init__()
        self.self_attn = Attention(config, ops)
        self.mlp = MLP(config, ops)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, norm_kernel)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, norm_kernel)

    def forward(self, x, cos, sin, k_pool, v_pool, meta):
        attn = self.self_attn(self.input_layernorm(x), cos, sin, k_pool, v_pool, meta)
        x, normed = self.post_attention_layernorm.add_and_norm(x, attn)  # the residual add fused in
        return x + self.mlp(normed)


class LlamaBody(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        norm_kernel = native.load_rms_norm()  # None: no compiler, or LLM_PLATFORM_NO_NATIVE
        self.ops = native.load_decode_ops()  # SiLU x mul, RoPE, and whole decode steps (int4)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, norm_kernel, self.ops) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, norm_kernel)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        if not config.tie_word_embeddings:
            self.lm_head = PackedLinear(config.hidden_size, config.vocab_size, bias=False)
        self.quantization = "none"
        self.quantized_head: nn.Module | None = None  # set by models/quantization.py
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        # decode steps of up to 8 sequences through decode_layers (one C call for all layers) where
        # the model allows it (int4 blocks, bfloat16, the C kernels): False keeps the module path
        self.fused_decode = True
        self._fused_layers = None  # (kv pools key, the bound call or None), built on first use

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        if self.config.tie_word_embeddings:  # HF state dicts list the tied head too
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        missing, unexpected = self.load_state_dict(state_dict, strict=False)
        missing = [m for m in missing if m != "inv_freq"]
        if missing or unexpected:
            raise ValueError(f"checkpoint does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def _apply(self, fn, *args, **kwargs):  # moved or cast weights: rebind the fused call to them
        self._fused_layers = None
        return super()._apply(fn, *args, **kwargs)

    def _bind_fused_layers(self, kv_pools):
        """decode_layers bound to this model's weights and these pools, or None where some piece
        is not what the C step computes (float weights, int8, a wrapped projection, no kernel)."""
        from replica.engine.models.gguf_linear import GGUFLinear  # gguf_linear imports nothing of ours

        ops = self.model.ops
        if ops is None or not self.model.layers or len(kv_pools) != len(self.model.layers):
            return None
        layers, kernels = [], set()
        for layer, (k_pool, v_pool) in zip(self.model.layers, kv_pools):
            attn, mlp = layer.self_attn, layer.mlp
            projs = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if not all(type(p) is GGUFLinear and p.kernel is not None and p.kernel_max_rows >= 1 for p in projs):
                return None
            if not all(n.kernel is not None and n.weight.dtype == torch.bfloat16 for n in norms):
                return None
            if k_pool.dtype != torch.bfloat16 or not (k_pool.is_contiguous() and v_pool.is_contiguous()):
                return None
            kernels |= {id(p.kernel) for p in projs}
            types = [p.kernel.TYPES[p.kernel_type] for p in projs]
            layers.append(native.DecodeLayer(
                layer.input_layernorm.weight.data_ptr(), layer.post_attention_layernorm.weight.data_ptr(),
                *(p.blocks.data_ptr() for p in projs), *types, k_pool.data_ptr(), v_pool.data_ptr()))
        first = self.model.layers[0]
        attention = native.load()
        if len(kernels) != 1 or attention is None:
            return None
        c = self.config
        bound = ops.bind_layers(
            layers,
            native.DecodeKernels(native.function_address(first.self_attn.qkv_proj.kernel._fn),
                                 native.function_address(attention._fn),
                                 native.function_address(first.input_layernorm.kernel._fn)),
            c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, first.mlp.intermediate_size,
            first.input_layernorm.eps, first.self_attn.scale)
        bound.max_rows = min(ops.MAX_DECODE_ROWS, *(p.kernel_max_rows for layer in self.model.layers
                                                    for p in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                              layer.mlp.gate_up_proj, layer.mlp.down_proj)))
        bound.keep_attention = attention
        return bound

    def _fused_step(self, x: torch.Tensor, kv_pools, meta: AttentionMetadata):
        """The bound decode_layers for this step, or None: a pure decode step (one token a
        sequence, the C attention) of few enough rows in bfloat16 on the CPU."""
        if not (self.fused_decode and x.dtype == torch.bfloat16 and x.device.type == "cpu" and meta.native is not None
                and not meta.prefills and meta.decode_token_idx is not None):
            return None
        key = (id(kv_pools), kv_pools[0][0].data_ptr()) if kv_pools else None
        if self._fused_layers is None or self._fused_layers[0] != key:
            self._fused_layers = (key, self._bind_fused_layers(kv_pools))
        bound = self._fused_layers[1]
        return bound if bound is not None and x.shape[0] <= bound.max_rows else None

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
        return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)  # [T, 1, hd]

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_pools: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_idx: torch.Tensor,  # [S]: flat index of the tokens whose next token we sample
    ) -> torch.Tensor:  # [S, vocab] float32
        x = self.model.embed_tokens(input_ids)  # [T, H]
        cos, sin = self.rope(positions, x.dtype)
        fused = self._fused_step(x, kv_pools, meta)
        if fused is not None:  # every layer in one C call; x is the embedding's fresh output
            x = x.contiguous()
            fused(x, cos, sin, meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens,
                  kv_pools[0][0].shape[1])
        else:
            for layer, (k_pool, v_pool) in zip(self.model.layers, kv_pools):
                x = layer(x, cos, sin, k_pool, v_pool, meta)
        x = self.model.norm(x[logits_idx])  # [S, H]
        if self.quantized_head is not None:
            return self.quantized_head(x).float()
        head = self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight
        return packed_linear(x, head, self).float()  # the tied head's packed copy lives on the model
