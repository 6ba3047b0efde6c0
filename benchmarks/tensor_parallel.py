"""Tensor-parallel decode steps: one engine per degree N, stepped alternately in one process.

    python -m benchmarks.tensor_parallel [--degrees 1,2,3] [--dtype float32] [--threads 2] \\
        [--batch 16] [--context 128] [--steps 20] [--out FILE.json] [--smoke]

SmolLM2-135M (the bundled GGUF); every engine decodes `--batch` sequences of `--context` random
tokens; the median step time per degree, and its ratio to N=1. `--threads` is the replica's
total: N ranks get threads // N each (replica/engine/parallel/driver.py), set before each of its
steps since torch's thread count is per process. What a CPU can show: the cost of the split
(2 all-reduces a layer, the step broadcast) against the product work shared out; on GPUs the
point is memory (a model that fits no single device), which this does not measure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks.engine import start_decoding
from benchmarks.peer import cpu_model
from replica.engine.config import EngineConfig
from replica.engine.llm_engine import LLMEngine
from replica.engine.models.loader import default_model_path
from replica.engine.parallel.driver import per_rank_threads


def _vector_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degrees", default="1,2,3")
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="")
    parser.add_argument("--smoke", action="store_true", help="tiny: N=1,2, batch 2, context 16, 3 steps")
    args = parser.parse_args()
    if args.smoke:
        args.degrees, args.batch, args.context, args.steps = "1,2", 2, 16, 3
    degrees = [int(d) for d in args.degrees.split(",")]
    engines: dict[int, LLMEngine] = {}
    configs: dict[int, EngineConfig] = {}
    try:
        for degree in degrees:
            print(f"loading N={degree} ...", flush=True)
            configs[degree] = EngineConfig(model_path=default_model_path(), dtype=args.dtype,
                                           kv_cache_bytes=256 << 20, max_num_seqs=args.batch,
                                           max_num_batched_tokens=512, num_threads=args.threads,
                                           tensor_parallel=degree)
            engines[degree] = LLMEngine.from_config(configs[degree])
        for degree, engine in engines.items():
            torch.set_num_threads(per_rank_threads(configs[degree]))
            start_decoding(engine, args.batch, args.context, 0, f"n{degree}-")
        times: dict[int, list[float]] = {d: [] for d in engines}
        for step in range(args.steps):
            for degree, engine in engines.items():
                torch.set_num_threads(per_rank_threads(configs[degree]))
                t = time.perf_counter()
                engine.step()
                times[degree].append((time.perf_counter() - t) * 1e3)
            print(f"step {step + 1}/{args.steps}: " + ", ".join(f"N={d} {t[-1]:.1f} ms" for d, t in times.items()),
                  flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    median = {d: statistics.median(t) for d, t in times.items()}
    result = {
        "cpu": cpu_model(), "cpu_flags": _vector_flags(), "load_average": os.getloadavg(), "dtype": args.dtype, "threads_total": args.threads,
        "batch": args.batch, "context": args.context, "steps": args.steps,
        "step_ms_median": {str(d): round(m, 2) for d, m in median.items()},
        "ratio_to_first_degree": {str(d): round(m / median[degrees[0]], 3) for d, m in median.items()},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
