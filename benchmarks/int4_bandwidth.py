"""Batch-1 decode at memory speed? The int4 block product's achieved bandwidth against the
machine's measured memory bandwidth, side by side in one process.

    python -m benchmarks.int4_bandwidth [--threads N] [--rounds 7] [--dtype bfloat16] [--out FILE.json]

- machine: a STREAM-like read (`torch.sum` over a float32 buffer of `--buffer-mb`, far larger
  than the last-level cache), bytes read / best time;
- kernel: every weight matrix of SmolLM2-135M's int4 model (the bundled GGUF's Q4_1 projections
  and Q8_0 tied head) through the block product at 1 row (one decode token) as the engine calls
  it (`GGUFMatmul.bind`, x in `--dtype`, the engine's: Python's per-call cost counts), the
  blocks' bytes / best time of the whole pass (~100 MB, also far beyond the cache; each matrix
  read once).
Rounds alternate the two, so load from other processes shifts both alike; `fraction` =
kernel GB/s / machine GB/s is what counts (issue #16's target: >= 0.7).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from benchmarks.peer import cpu_model
from replica.engine.models.gguf_linear import load_block_weights
from replica.engine.models.loader import default_model_path, load_checkpoint
from replica.engine.runner import native


def measure(threads: int, rounds: int, buffer_mb: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    torch.set_num_threads(threads)
    kernel = native.load_gguf_matmul()
    if kernel is None:
        raise SystemExit("no C compiler: no block product to measure")
    ckpt = load_checkpoint(default_model_path())
    blocks = load_block_weights(default_model_path(), ckpt.config)
    hidden = ckpt.config.hidden_size
    shapes = {name: tuple(ckpt.state_dict[name].shape) for name in blocks}
    xs = {k: torch.randn(1, k).to(dtype) for k in {s[1] for s in shapes.values()}}
    products = [(kernel.bind(b.blocks, b.type_name, shapes[name][0]), xs[shapes[name][1]])
                for name, b in blocks.items()]
    weight_bytes = sum(b.blocks.numel() for b in blocks.values())
    buffer = torch.ones(buffer_mb << 18, dtype=torch.float32)  # buffer_mb MiB
    stream, block = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        buffer.sum()
        stream.append(time.perf_counter() - t)
        t = time.perf_counter()
        for product, x in products:
            product(x)
        block.append(time.perf_counter() - t)
    machine = buffer.numel() * 4 / min(stream) / 1e9
    ours = weight_bytes / min(block) / 1e9
    return {"cpu": cpu_model(), "threads": threads, "dtype": str(dtype).removeprefix("torch."), "hidden": hidden, "matrices": len(blocks),
            "weight_mb": round(weight_bytes / 1e6, 1), "pass_ms": round(min(block) * 1e3, 2),
            "machine_read_gb_per_s": round(machine, 1), "kernel_gb_per_s": round(ours, 1),
            "fraction": round(ours / machine, 2), "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--buffer-mb", type=int, default=512)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--out")
    args = parser.parse_args()
    result = measure(args.threads, args.rounds, args.buffer_mb, getattr(torch, args.dtype))
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
