"""torch.compile trial of the decode step (issue #16): is a compiled step faster than ours?

    python -m benchmarks.compile_trial [--batch 64] [--context 256] [--steps 12] [--threads 1] [--freezing]

Three engines on SmolLM2 in bfloat16, each with `--batch` sequences of `--context` tokens
decoding, stepped alternately (other load shifts all alike), medians of `--steps` steps:
  eager_c:        the engine as built (eager PyTorch + the C kernels: attention, norms,
                  SiLU x mul, RoPE);
  eager_torch:    the PyTorch-only model (LLM_PLATFORM_NO_NATIVE: what Inductor can see whole;
                  the C kernels are ctypes calls, graph breaks for it);
  compiled_torch: that model's forward through `torch.compile` (Inductor, C++ backend,
                  dynamic=False) for decode steps; prefill steps run eagerly (their shapes
                  differ every step). `--freezing` sets Inductor's weight freezing (packed GEMMs).
Artifacts go to Inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR): the first run compiles, later
runs load. Prints JSON: median step ms of each, the load average.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.decode_paths import engine as make_engine
from benchmarks.engine import start_decoding
from replica.engine.models.loader import default_model_path, load_checkpoint
from benchmarks.output import emit, load_average


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--freezing", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.freezing:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
    ckpt = load_checkpoint(default_model_path())
    engines = {"eager_c": make_engine(ckpt, "bfloat16", args.batch),
               "eager_torch": make_engine(ckpt, "bfloat16", args.batch, native=False),
               "compiled_torch": make_engine(ckpt, "bfloat16", args.batch, native=False)}
    model = engines["compiled_torch"].runner.model
    eager_forward = model.forward
    compiled = torch.compile(eager_forward, dynamic=False)

    def forward(input_ids, positions, kv_pools, meta, logits_idx):  # decode steps through the compiled graph
        return (eager_forward if meta.prefills else compiled)(input_ids, positions, kv_pools, meta, logits_idx)

    model.forward = forward
    result: dict = {"batch": args.batch, "context": args.context, "threads": args.threads, "freezing": args.freezing,
                    "load_average_start": load_average()}
    for name, e in engines.items():
        t = time.perf_counter()
        start_decoding(e, args.batch, args.context, 0, name)  # the compiled one compiles its first decode here
        result[f"{name}_start_s"] = round(time.perf_counter() - t, 1)
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.steps):
        for name, e in engines.items():
            t = time.perf_counter()
            e.step()
            times[name].append((time.perf_counter() - t) * 1e3)
    for name, t in times.items():
        result[f"{name}_step_ms"] = round(statistics.median(t), 1)
    result["load_average_end"] = load_average()
    emit(result, args.out)


if __name__ == "__main__":
    main()
