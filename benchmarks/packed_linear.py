"""Full-batch decode with the bfloat16 projections on pre-packed weights (PackedLinear) vs plain
F.linear (which re-packs each weight for oneDNN's AMX GEMM on every call), stepped alternately
in one engine, with the roofline passes between steps.

    python -m benchmarks.packed_linear [--threads 1] [--steps 16] [--batch 64] [--context 256] [--out FILE.json]

- `packed` / `plain`: median engine step (SmolLM2, bfloat16, `--batch` sequences of `--context`
  tokens, all decoding), `PackedLinear.enabled` True / False;
- `roof_plain`: benchmarks.engine's roofline pass (every projection and the head through plain
  F.linear on `--batch` rows: the definition `roofline_fraction` uses, unchanged);
  `roof_packed`: the same products through the packed weights (what the step now spends on them).
`roofline_fraction_*` = median roof_plain / median step of that variant.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.engine import build_model, roofline_pass, start_decoding
from benchmarks.peer import cpu_model
from replica.engine.config import EngineConfig
from replica.engine.llm_engine import LLMEngine
from replica.engine.models.llama import PackedLinear, packed_linear
from replica.engine.models.loader import default_model_path, load_checkpoint
from benchmarks.output import emit, load_average


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(default_model_path())
    model = build_model(ckpt.config, ckpt.state_dict, "bfloat16", "cpu")
    config = EngineConfig(model_path=default_model_path(), dtype="bfloat16", device="cpu", kv_cache_bytes=2 << 30,
                          max_num_seqs=args.batch)
    engine = LLMEngine(config, ckpt.config, model, ckpt.tokenizer)
    start_decoding(engine, args.batch, args.context, 0, "full")
    roof, _, _ = roofline_pass(model, args.batch)
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights.append(model.model.embed_tokens.weight if model.config.tie_word_embeddings else model.lm_head.weight)
    holders = [type("Holder", (), {})() for _ in weights]
    xs = {w.shape[1]: torch.randn(args.batch, w.shape[1], dtype=torch.bfloat16) for w in weights}

    def roof_packed() -> float:
        with torch.inference_mode():
            t = time.perf_counter()
            for w, h in zip(weights, holders):
                packed_linear(xs[w.shape[1]], w, h)
            return time.perf_counter() - t

    roof_packed()  # packs once
    load_before = load_average()
    times: dict[str, list[float]] = {"packed": [], "plain": [], "roof_plain": [], "roof_packed": []}
    for _ in range(args.steps):
        for name in ("packed", "plain"):
            PackedLinear.enabled = name == "packed"
            t = time.perf_counter()
            engine.step()
            times[name].append(time.perf_counter() - t)
        PackedLinear.enabled = True
        times["roof_plain"].append(roof())
        times["roof_packed"].append(roof_packed())
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    out = {"cpu": cpu_model(), "threads": args.threads, "batch": args.batch, "context": args.context,
           "steps": args.steps, "load_average": [load_before, load_average()],
           "median_ms": {k: round(v, 1) for k, v in med.items()},
           "best_ms": {k: round(min(v) * 1e3, 1) for k, v in times.items()},
           "roofline_fraction_packed": round(med["roof_plain"] / med["packed"], 3),
           "roofline_fraction_plain": round(med["roof_plain"] / med["plain"], 3),
           "packed_products_share_of_step": round(med["roof_packed"] / med["packed"], 3)}
    emit(out, args.out)
    return out


if __name__ == "__main__":
    main()
