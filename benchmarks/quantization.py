"""Quantised versions: float (the default dtype) vs int8 weights, side by side in one process.

    python -m benchmarks.quantization [--out FILE.json] [--batch 32] [--dtype auto]

For each version of the bundled SmolLM2-135M-Instruct it reports:
- weight memory: bytes the weights take at rest (models/quantization.weight_bytes);
- decode tokens/s at batch 1 and at `--batch` (every sequence decoding, prefills done);
- prefill tokens/s (`--prefill-prompts` prompts of `--prefill-len` tokens, no prefix cache);
- the quality probe against the float version: a fixed set of chat prompts answered greedily
  (one at a time), the share of answers identical to the float version's, the mean length of
  the common prefix; and teacher-forced on the float version's answers, the mean absolute logit
  difference and the top-1 agreement per token.
It also times the kernels alone on this model's matrix shapes (float32, bfloat16, the int8
kernel, and PyTorch's int4 CPU kernel), which is why int4 is not built (README).
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
import warnings

import torch

from benchmarks.engine import start_decoding
from replica.engine.config import EngineConfig
from replica.engine.dtype import dtype_name, resolve_dtype
from replica.engine.llm_engine import LLMEngine, build_model
from replica.engine.models.loader import default_model_path, load_checkpoint
from replica.engine.models.quantization import quantize_int8, weight_bytes
from replica.engine.models.scoring import answer_logits
from replica.engine.sampling_params import SamplingParams

PROBE_CHATS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Explain in one sentence what a CPU does.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Give me two tips for a job interview.",
    "Translate 'good morning' into Spanish.",
    "What is photosynthesis?",
    "List the first five prime numbers.",
    "Who wrote Romeo and Juliet?",
    "Summarise the water cycle in two sentences.",
    "Suggest a name for a pet turtle.",
    "How many days are there in a leap year?",
    "What does HTTP stand for?",
    "Describe the colour blue to someone who cannot see.",
    "Why is the sky blue?",
]


def probe_prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode_chat([{"role": "user", "content": c}]) for c in PROBE_CHATS]


def make_engine(ckpt, dtype: str, quantization: str, max_num_seqs: int, prefix_caching: bool = True) -> LLMEngine:
    config = EngineConfig(model_path=default_model_path(), dtype=dtype, quantization=quantization,
                          kv_cache_bytes=512 * 1024**2, max_num_seqs=max_num_seqs, max_num_batched_tokens=512,
                          enable_prefix_caching=prefix_caching)
    model = build_model(ckpt.config, ckpt.state_dict, dtype, "cpu", quantization=quantization)
    return LLMEngine(config, ckpt.config, model, ckpt.tokenizer)


def decode_tokens_per_s(engine: LLMEngine, batch: int, context_len: int, steps: int, seed: int) -> dict:
    """All `batch` sequences decoding (prefills done first, not timed)."""
    ids = start_decoding(engine, batch, context_len, seed, "d")
    best_step = float("inf")
    tokens, start = 0, time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        tokens += len(engine.step())
        best_step = min(best_step, time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    for request_id in ids:
        engine.abort_request(request_id)
    return {"batch": batch, "context_len": context_len, "steps": steps, "tokens_per_s": tokens / elapsed,
            "step_ms": 1000 * elapsed / steps, "best_step_ms": 1000 * best_step}


def prefill_tokens_per_s(engine: LLMEngine, num_prompts: int, length: int, seed: int) -> dict:
    rng = random.Random(seed + 1)
    vocab = engine.model_config.vocab_size
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(num_prompts + 1)]
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:1], params)  # warm-up: oneDNN builds its kernels for these shapes once
    prompts = prompts[1:]
    times = []
    for prompt in prompts:  # one at a time: the best one is the least disturbed by other jobs
        start = time.perf_counter()
        engine.generate([prompt], params)
        times.append(time.perf_counter() - start)
    return {"prompts": num_prompts, "prompt_len": length, "tokens_per_s": num_prompts * length / sum(times),
            "best_tokens_per_s": length / min(times), "seconds": sum(times)}


def quality_probe(engine: LLMEngine, prompts, reference: dict | None, max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    answers = [engine.generate([p], params)[0] for p in prompts]  # one at a time: batch 1
    result: dict = {"answers": answers}
    if reference is None:
        return result
    ref_answers, ref_logits = reference["answers"], reference["logits"]
    same, prefix, diffs, top1, counted = 0, 0.0, [], 0, 0
    for prompt, ours, theirs, logits_ref in zip(prompts, answers, ref_answers, ref_logits):
        same += ours == theirs
        common = 0
        while common < min(len(ours), len(theirs)) and ours[common] == theirs[common]:
            common += 1
        prefix += common / max(len(theirs), 1)
        # teacher-forced on the reference answer: the logits that predict each answer token
        logits = answer_logits(engine.runner.model, prompt, theirs)
        diffs.append((logits - logits_ref).abs().mean().item())
        top1 += (logits.argmax(-1) == logits_ref.argmax(-1)).sum().item()
        counted += len(theirs)
    result.update({
        "answers_identical": same / len(prompts),
        "mean_common_prefix": prefix / len(prompts),
        "mean_abs_logit_diff": sum(diffs) / len(diffs),
        "top1_agreement_per_token": top1 / counted,
        "tokens_compared": counted,
    })
    return result


def reference_logits(engine: LLMEngine, prompts, answers) -> list[torch.Tensor]:
    return [answer_logits(engine.runner.model, p, a) for p, a in zip(prompts, answers)]


def _best_time(fn, calls: int = 30, budget_s: float = 1.0) -> float:
    """Best of up to `calls` calls (fewer once `budget_s` is spent): the least disturbed by others."""
    fn()
    best, spent = float("inf"), 0.0
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


@torch.inference_mode()
def kernel_table(config) -> list[dict]:
    """Best-of-N time of one matrix product per kernel, on this model's weight shapes."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    shapes = {"qkv": (qkv, h), "gate_up": (2 * i, h), "down": (h, i), "lm_head": (v, h)}
    rows = []
    gen = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (n, k) in shapes.items():
            w = torch.randn(n, k, generator=gen) * 0.02
            wb = w.bfloat16()
            q, scale = quantize_int8(w)
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros(n, dtype=torch.long), 0)
            packed = torch.ops.quantized.linear_prepack(qw, None)
            group = 32
            wg = w.view(n, k // group, group)
            s4 = wg.abs().amax(-1).clamp(min=1e-12) / 7
            q4 = (torch.round(wg / s4[..., None]).clamp(-8, 7) + 8).to(torch.int32).view(n, k)
            packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, 1)
            sz = torch.stack([s4.t(), torch.zeros_like(s4.t())], -1).contiguous()  # zero point 8 in q4
            for m in (1, 32, 256):
                x = torch.randn(m, k, generator=gen)
                xb = x.bfloat16()
                flops = 2 * m * n * k
                t = {
                    "float32": _best_time(lambda: torch.nn.functional.linear(x, w)),
                    "bfloat16": _best_time(lambda: torch.nn.functional.linear(xb, wb)),
                    "int8_dynamic": _best_time(lambda: torch.ops.quantized.linear_dynamic(x, packed, False)),
                    "int8_weight_only_bf16": _best_time(lambda: torch._weight_int8pack_mm(xb, q, scale.bfloat16())),
                    "int4_g32_bf16": _best_time(
                        lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed4, group, sz.bfloat16())),
                }
                rows.append({"matrix": name, "shape": [n, k], "rows": m,
                             **{f"{kname}_us": round(sec * 1e6, 1) for kname, sec in t.items()},
                             **{f"{kname}_gflops": round(flops / sec / 1e9, 1) for kname, sec in t.items()}})
                print(f"  kernel {name} {n}x{k} rows={m}: "
                      + ", ".join(f"{kname} {sec * 1e6:.0f}us" for kname, sec in t.items()), file=sys.stderr)
    return rows


def compare(ckpt, prompts, dtype: str, args) -> dict:
    """float vs int8 in one dtype: the same measurements for both, one after the other."""
    versions: dict[str, dict] = {}
    reference = None
    for name, quantization in (("float", "none"), ("int8", "int8")):
        engine = make_engine(ckpt, dtype, quantization, max(args.batch, 1))
        row: dict = {"quantization": quantization, "dtype": dtype,
                     "weight_bytes": weight_bytes(engine.runner.model)}
        print(f"{dtype} {name}: weights {row['weight_bytes'] / 2**20:.1f} MiB", file=sys.stderr)
        row["decode_batch1"] = decode_tokens_per_s(engine, 1, args.context, args.decode_steps * 2, args.seed)
        row["decode_batch"] = decode_tokens_per_s(engine, args.batch, args.context, args.decode_steps, args.seed)
        print(f"{dtype} {name}: decode b=1 {row['decode_batch1']['tokens_per_s']:.1f} tok/s, "
              f"b={args.batch} {row['decode_batch']['tokens_per_s']:.1f} tok/s", file=sys.stderr)
        prefill_engine = make_engine(ckpt, dtype, quantization, 8, prefix_caching=False)
        row["prefill"] = prefill_tokens_per_s(prefill_engine, args.prefill_prompts, args.prefill_len, args.seed)
        del prefill_engine
        print(f"{dtype} {name}: prefill {row['prefill']['tokens_per_s']:.0f} tok/s", file=sys.stderr)
        probe = quality_probe(engine, prompts, reference, args.probe_tokens)
        if reference is None:
            reference = {"answers": probe["answers"], "logits": reference_logits(engine, prompts, probe["answers"])}
        probe["answers"] = [ckpt.tokenizer.decode(a) for a in probe["answers"]]
        row["quality"] = probe
        versions[name] = row
        del engine
    f, q = versions["float"], versions["int8"]
    return {
        "dtype": dtype,
        "versions": versions,
        "ratios_int8_over_float": {
            "weight_bytes": q["weight_bytes"] / f["weight_bytes"],
            "decode_batch1_tokens_per_s": q["decode_batch1"]["tokens_per_s"] / f["decode_batch1"]["tokens_per_s"],
            "decode_batch_tokens_per_s": q["decode_batch"]["tokens_per_s"] / f["decode_batch"]["tokens_per_s"],
            "prefill_tokens_per_s": q["prefill"]["tokens_per_s"] / f["prefill"]["tokens_per_s"],
            # from the fastest step / prompt of each: less moved by other jobs on shared cores
            "decode_batch1_best_step": f["decode_batch1"]["best_step_ms"] / q["decode_batch1"]["best_step_ms"],
            "decode_batch_best_step": f["decode_batch"]["best_step_ms"] / q["decode_batch"]["best_step_ms"],
            "prefill_best_prompt": q["prefill"]["best_tokens_per_s"] / f["prefill"]["best_tokens_per_s"],
        },
        "quality_int8_vs_float": {k: v for k, v in q["quality"].items() if k != "answers"},
    }


def _cpu_flags() -> list[str]:
    wanted = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8"}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return sorted(wanted.intersection(line.split()))
    except OSError:
        pass
    return []


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--dtypes", nargs="+", default=["auto"],
                        help="the float versions' dtypes (int8's activations use the same); the first is the "
                             "headline, e.g. --dtypes auto float32")
    parser.add_argument("--batch", type=int, default=32, help="the larger decode batch")
    parser.add_argument("--context", type=int, default=128, help="context length of the decoding sequences")
    parser.add_argument("--decode-steps", type=int, default=24)
    parser.add_argument("--prefill-prompts", type=int, default=4)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--probe-tokens", type=int, default=32, help="greedy tokens per probe answer")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    dtypes = list(dict.fromkeys(dtype_name(resolve_dtype(d, "cpu")) for d in args.dtypes))
    print(f"loading SmolLM2; float versions in {', '.join(dtypes)}", file=sys.stderr)
    ckpt = load_checkpoint(default_model_path())
    prompts = probe_prompts(ckpt.tokenizer)
    comparisons = [compare(ckpt, prompts, dtype, args) for dtype in dtypes]
    headline = comparisons[0]
    result = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised at load)",
        "machine": {"threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "cpu_flags": _cpu_flags(), "processor": platform.processor() or platform.machine(),
                    "torch": torch.__version__},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "float_dtype": headline["dtype"],
        "versions": headline["versions"],
        "ratios_int8_over_float": headline["ratios_int8_over_float"],
        "quality_int8_vs_float": headline["quality_int8_vs_float"],
        "other_dtypes": comparisons[1:],
    }
    if not args.skip_kernels:
        result["kernels"] = kernel_table(ckpt.config)
    summary = [{k: c[k] for k in ("dtype", "ratios_int8_over_float", "quality_int8_vs_float")} for c in comparisons]
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    main()
