"""Engine decode steps, each speed-up of issue #16 against the path it replaces, in one process.

    python -m benchmarks.decode_paths [--dtype bfloat16] [--threads N] [--only batch,single,elementwise]
                                      [--out FILE.json]

SmolLM2-135M (the bundled Q4_1 GGUF). Two comparisons, each pair of engines stepped alternately
(other load on the machine shifts both alike; the ratios are what count):
  batch:  `--batch` (64) sequences of `--context` (256) tokens decoding, decode attention by the C
          kernel vs the PyTorch path (gather + SDPA), weights in the dtype;
  single: one sequence decoding, int4 (the file's Q4_1 blocks, block-product kernel) vs the
          dequantised weights in the dtype.
  elementwise: `--batch` x `--context` decoding (C attention in both), SiLU x mul and RoPE in
          one C pass each (csrc/decode_ops.c) vs PyTorch's ops for them.
Prints and writes step times, tokens/s and ratios, with the CPU and thread count.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.engine import start_decoding
from benchmarks.peer import cpu_model
from replica.engine.config import EngineConfig
from replica.engine.llm_engine import LLMEngine, build_model
from replica.engine.models.gguf_linear import load_block_weights
from replica.engine.models.loader import default_model_path, load_checkpoint
from benchmarks.output import emit, load_average


def engine(ckpt, dtype: str, batch: int, quantization: str = "none", blocks=None, native: bool = True) -> LLMEngine:
    if not native:
        os.environ["LLM_PLATFORM_NO_NATIVE"] = "1"
    try:
        model = build_model(ckpt.config, ckpt.state_dict, dtype, "cpu", quantization=quantization, blocks=blocks)
        config = EngineConfig(model_path=default_model_path(), dtype=dtype, quantization=quantization,
                              kv_cache_bytes=1 << 30, max_num_seqs=max(batch, 1), max_num_batched_tokens=512)
        return LLMEngine(config, ckpt.config, model, ckpt.tokenizer)
    finally:
        os.environ.pop("LLM_PLATFORM_NO_NATIVE", None)


def without_elementwise_ops(e: LLMEngine) -> LLMEngine:
    """The engine's model with PyTorch's SiLU x mul and RoPE (the C ops unset)."""
    for layer in e.runner.model.model.layers:
        layer.mlp.ops = layer.self_attn.ops = None
    return e


def alternate(engines: dict[str, LLMEngine], batch: int, context: int, steps: int) -> dict[str, float]:
    """Median step ms of each engine, stepped in turn once all are decoding."""
    for name, e in engines.items():
        start_decoding(e, batch, context, 0, name)
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(steps):
        for name, e in engines.items():
            t = time.perf_counter()
            e.step()
            times[name].append((time.perf_counter() - t) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--only", default="batch,single,elementwise", help="comma-separated comparisons to run")
    parser.add_argument("--out")
    args = parser.parse_args()
    only = set(args.only.split(","))
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(default_model_path())
    result = {"cpu": cpu_model(), "threads": args.threads, "dtype": args.dtype,
              "load_average_start": load_average()}
    if "batch" in only:
        batch = alternate({"kernel": engine(ckpt, args.dtype, args.batch),
                           "torch": engine(ckpt, args.dtype, args.batch, native=False)}, args.batch, args.context,
                          args.steps)
        result["batch"] = {"batch": args.batch, "context": args.context,
                           "kernel_step_ms": round(batch["kernel"], 1), "torch_step_ms": round(batch["torch"], 1),
                           "kernel_tokens_per_s": round(args.batch * 1e3 / batch["kernel"], 1),
                           "speedup": round(batch["torch"] / batch["kernel"], 2)}
    if "single" in only:
        blocks = load_block_weights(default_model_path(), ckpt.config)
        single = alternate({"int4": engine(ckpt, args.dtype, 1, "int4", blocks),
                            "none": engine(ckpt, args.dtype, 1)}, 1, 128, 3 * args.steps)
        result["single"] = {"int4_step_ms": round(single["int4"], 2), "none_step_ms": round(single["none"], 2),
                            "int4_tokens_per_s": round(1e3 / single["int4"], 1),
                            "none_tokens_per_s": round(1e3 / single["none"], 1),
                            "speedup": round(single["none"] / single["int4"], 2)}
    if "elementwise" in only:
        ew = alternate({"c_ops": engine(ckpt, args.dtype, args.batch),
                        "torch_ops": without_elementwise_ops(engine(ckpt, args.dtype, args.batch))},
                       args.batch, args.context, args.steps)
        result["elementwise"] = {"batch": args.batch, "context": args.context,
                                 "c_ops_step_ms": round(ew["c_ops"], 1), "torch_ops_step_ms": round(ew["torch_ops"], 1),
                                 "saved_ms": round(ew["torch_ops"] - ew["c_ops"], 1),
                                 "speedup": round(ew["torch_ops"] / ew["c_ops"], 3)}
    result["load_average_end"] = load_average()
    emit(result, args.out)


if __name__ == "__main__":
    main()
