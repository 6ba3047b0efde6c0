"""Decode attention, C kernel vs the PyTorch path (gather + SDPA), side by side in one process.

`python -m benchmarks.attention_kernel [--dtype bfloat16] [--batch 64] [--context 320]` times one
layer's decode attention of SmolLM2-135M's shape (9 query heads, 3 KV heads, head dim 64,
16-token blocks, random block tables) three ways (the kernel as the engine loads it, its portable
build, PyTorch; in bfloat16 on a CPU with AVX512-BF16 a fourth, `kernel_widening`: the kernel
with its vdpbf16ps path off), interleaved, and prints the median times and
their ratio with the CPU. Other load on the machine shifts both alike; the ratio is what counts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.peer import cpu_model
from replica.engine.runner import native
from replica.engine.runner.attention import AttentionMetadata, paged_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    nh, kvh, hd, bs = 9, 3, 64, 16
    max_blocks = (args.context + bs - 1) // bs
    num_blocks = args.batch * max_blocks + 1
    k_pool = torch.randn(num_blocks, bs, kvh, hd).to(dtype)
    v_pool = torch.randn(num_blocks, bs, kvh, hd).to(dtype)
    tables = torch.randperm(num_blocks)[: args.batch * max_blocks].view(args.batch, max_blocks)
    lens = torch.full((args.batch,), args.context, dtype=torch.long)
    q = torch.randn(args.batch, nh, hd).to(dtype)
    mask = (torch.arange(max_blocks * bs)[None] < lens[:, None]).view(args.batch, 1, 1, -1)
    kernel, portable = native.load(), native.load(portable=True)
    if kernel is None or portable is None:
        raise SystemExit("no C compiler: nothing to compare")
    common = dict(slot_mapping=torch.zeros(0, dtype=torch.long), decode_token_idx=torch.arange(args.batch),
                  decode_block_tables=tables, decode_mask=mask, decode_context_lens=lens, prefills=[])
    metas = {"kernel": AttentionMetadata(**common, native=kernel), "portable": AttentionMetadata(**common, native=portable),
             "torch": AttentionMetadata(**common, native=None)}
    if kernel.has_bf16_dot and dtype == torch.bfloat16:  # the same kernel with its widening float32 path
        metas["kernel_widening"] = AttentionMetadata(**common, native=kernel)
    times: dict[str, list[float]] = {name: [] for name in metas}
    with torch.inference_mode():
        for _ in range(3):
            for meta in metas.values():
                paged_attention(q, None, None, k_pool, v_pool, meta, hd**-0.5)
        for _ in range(args.rounds):
            for name, meta in metas.items():
                kernel.set_bf16_dot(name != "kernel_widening")
                start = time.perf_counter()
                paged_attention(q, None, None, k_pool, v_pool, meta, hd**-0.5)
                times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    kv_bytes = 2 * args.batch * args.context * kvh * hd * k_pool.element_size()
    result = {
        "dtype": args.dtype, "batch": args.batch, "context": args.context, "threads": args.threads,
        "cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_ms": round(med["kernel"], 3), "portable_ms": round(med["portable"], 3), "torch_ms": round(med["torch"], 3),
        "speedup_vs_torch": round(med["torch"] / med["kernel"], 2),
        "speedup_vs_portable": round(med["portable"] / med["kernel"], 2),
        "kernel_kv_gb_per_s": round(kv_bytes / med["kernel"] / 1e6, 1),
        "bf16_dot": "kernel_widening" in med,
    }
    if "kernel_widening" in med:
        result["kernel_widening_ms"] = round(med["kernel_widening"], 3)
        result["speedup_vs_widening"] = round(med["kernel_widening"] / med["kernel"], 2)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
