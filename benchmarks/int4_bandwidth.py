"""Batch-1 decode at memory speed? The int4 block product's achieved bandwidth against the
machine's measured memory bandwidth, side by side in one process.

    python -m benchmarks.int4_bandwidth [--threads N] [--rounds 7] [--dtype bfloat16] [--steps 40]
        [--quantization int4|int8] [--out FILE.json]

- machine: a STREAM-like read (`torch.sum` over a float32 buffer of `--buffer-mb`, far larger
  than the last-level cache), bytes read / best time;
- kernel: every weight matrix of SmolLM2-135M's int4 model (the bundled GGUF's Q4_1 projections
  and Q8_0 tied head) through the block product at 1 row (one decode token) as the engine calls
  it (`GGUFMatmul.bind`, x in `--dtype`, the engine's: Python's per-call cost counts), the
  blocks' bytes / best time of the whole pass (~100 MB, also far beyond the cache; each matrix
  read once).
- step: the engine's whole batch-1 decode step (one sequence of `--context` tokens, int4 in
  `--dtype`, sampling included), the int4 model's blocks read per step (the same ~96 MB: the 121
  fused products qkv / o / gate_up / down and the head) / median step time. Two ways, stepped
  alternately: `fused` (decode_layers: every decoder layer in one C call; at more than one thread
  with a parallel region per kernel call) and `modules` (the Python module path: 4 product calls
  and ~20 torch ops a layer); at more than one thread also `fused_team` (decode_layers with one
  thread team for the whole call, meeting at barriers: the engine's default there). bfloat16
  only (the fused step's dtype); skipped with --steps 0.
`--quantization int8` measures the int8 model instead: Q8_0 blocks quantised from the float
weights at load, multiplied against the activations as they are (~157 MB: the 121 fused products
and the head, 34 bytes per 32 values), both in the kernel pass (the engine's own 121 products)
and in the step.
Rounds alternate the two, so load from other processes shifts both alike; `fraction` =
kernel GB/s / machine GB/s is what counts (issue #16's target: >= 0.7); `step.fraction` is the
same for the whole step against the machine's best read of the same run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.peer import cpu_model
from replica.engine.models.gguf_linear import load_block_weights
from replica.engine.models.loader import default_model_path, load_checkpoint
from replica.engine.runner import native
from benchmarks.output import emit, load_average


def measure_step(ckpt, steps: int, context: int, buffer: torch.Tensor, dtype: torch.dtype,
                 quantization: str = "int4") -> dict:
    """Median batch-1 decode step of the int4 engine, fused vs module path, stepped alternately;
    one STREAM-like read after each pair (the machine's rate at the same moments)."""
    from benchmarks.engine import start_decoding
    from replica.engine.config import EngineConfig
    from replica.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_config(EngineConfig(model_path=default_model_path(), dtype=str(dtype).removeprefix("torch."),
                                                quantization=quantization, kv_cache_bytes=64 << 20))
    model = engine.runner.model
    start_decoding(engine, 1, context, 0, "step")
    times: dict[str, list[float]] = {"fused": [], "modules": []}
    ops = native.load_decode_ops()
    if torch.get_num_threads() > 1 and ops is not None:
        times["fused_team"] = []  # decode_layers with one thread team for the call (opt-in)
    stream = []
    for _ in range(steps):
        for name in times:
            model.fused_decode = name != "modules"
            if ops is not None:
                ops.set_team(name == "fused_team")
            t = time.perf_counter()
            engine.step()
            times[name].append(time.perf_counter() - t)
        t = time.perf_counter()
        buffer.sum()
        stream.append(time.perf_counter() - t)
    model.fused_decode = True
    if ops is not None:
        ops.set_team(ops.TEAM_DEFAULT)
    blocks = [m.blocks for m in model.modules() if hasattr(m, "blocks") and isinstance(m.blocks, torch.Tensor)]
    weight_bytes = sum(b.numel() for b in blocks)
    machine = buffer.numel() * 4 / min(stream) / 1e9
    out = {"context": context, "steps": steps, "weight_mb": round(weight_bytes / 1e6, 1), "products": len(blocks),
           "fused_active": model._fused_layers is not None and model._fused_layers[1] is not None,
           "machine_read_gb_per_s": round(machine, 1)}
    for name, t in times.items():
        med = statistics.median(t)
        out[name] = {"step_ms": round(med * 1e3, 2), "best_step_ms": round(min(t) * 1e3, 2),
                     "tokens_per_s": round(1 / med, 1), "gb_per_s": round(weight_bytes / med / 1e9, 1),
                     "fraction": round(weight_bytes / med / 1e9 / machine, 2)}
    out["speedup"] = round(out["modules"]["step_ms"] / out["fused"]["step_ms"], 2)
    return out


def measure(threads: int, rounds: int, buffer_mb: int, dtype: torch.dtype = torch.bfloat16, steps: int = 40,
            context: int = 128, quantization: str = "int4") -> dict:
    torch.set_num_threads(threads)
    kernel = native.load_gguf_matmul()
    if kernel is None:
        raise SystemExit("no C compiler: no block product to measure")
    ckpt = load_checkpoint(default_model_path())
    hidden = ckpt.config.hidden_size
    if quantization == "int8":  # the int8 model's own products (Q8_0 blocks, float activations)
        from replica.engine.llm_engine import build_model
        from replica.engine.models.gguf_linear import GGUFLinear

        model = build_model(ckpt.config, ckpt.state_dict, str(dtype).removeprefix("torch."), "cpu", quantization="int8")
        mods = [m for m in model.modules() if isinstance(m, GGUFLinear)]
        products = [(kernel.bind(m.blocks, m.kernel_type, m.out_features), torch.randn(1, m.in_features).to(dtype))
                    for m in mods]
        weight_bytes = sum(m.blocks.numel() for m in mods)
        matrices = len(mods)
    else:
        blocks = load_block_weights(default_model_path(), ckpt.config)
        shapes = {name: tuple(ckpt.state_dict[name].shape) for name in blocks}
        xs = {k: torch.randn(1, k).to(dtype) for k in {s[1] for s in shapes.values()}}
        products = [(kernel.bind(b.blocks, b.type_name, shapes[name][0]), xs[shapes[name][1]])
                    for name, b in blocks.items()]
        weight_bytes = sum(b.blocks.numel() for b in blocks.values())
        matrices = len(blocks)
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
    result = {"cpu": cpu_model(), "threads": threads, "dtype": str(dtype).removeprefix("torch."), "hidden": hidden,
              "quantization": quantization, "matrices": matrices, "weight_mb": round(weight_bytes / 1e6, 1), "pass_ms": round(min(block) * 1e3, 2),
              "machine_read_gb_per_s": round(machine, 1), "kernel_gb_per_s": round(ours, 1),
              "fraction": round(ours / machine, 2), "load_average_before_step": load_average()}
    if steps and dtype == torch.bfloat16:
        result["step"] = measure_step(ckpt, steps, context, buffer, dtype, quantization)
    result["load_average"] = load_average()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--buffer-mb", type=int, default=512)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--steps", type=int, default=40, help="engine decode steps per path (0: no step measurement)")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--quantization", choices=("int4", "int8"), default="int4")
    parser.add_argument("--out")
    args = parser.parse_args()
    result = measure(args.threads, args.rounds, args.buffer_mb, getattr(torch, args.dtype), args.steps, args.context,
                     args.quantization)
    emit(result, args.out)


if __name__ == "__main__":
    main()
