"""Engine throughput: our engine vs transformers `generate` with static batches, side by side.

    python -m benchmarks.engine [--out FILE.json] [--num-requests 256] [--device cpu|cuda] [--vllm-only]

One process, one run, the same model (the bundled SmolLM2), the same dtype and the same
workload: long-tailed prompt and output lengths (fixed seed), half the requests starting with
one shared ~300-token system prompt. Every request asks for exactly its output length
(ignore_eos), so both sides produce the same useful tokens; a static batch also computes the
steps its shorter members no longer need, which is the waste continuous batching removes.

Also measured in the same run: the roofline, i.e. the time of the model's matrix products
alone for a full batch (FLOP/s of this machine in this dtype / (2 x parameters)), and what
fraction of it our engine reaches while its batch is full: `roofline_fraction` = median time of
the matrix products alone / median full-batch step, the two timed alternately (one after each
step) so that load from other processes shifts both alike (`roofline_fraction_separate`: the
older figure, best-of-5 roofline before the steps' mean).

`--vllm-only` (a GPU machine where vLLM is installed: scripts/gpu_check.sh) runs vLLM's offline
engine on the same workload instead, the same weights saved as a Hugging Face folder, prompts
as token ids, greedy, `ignore_eos`, the same `--max-num-seqs`; compare its `vllm_tokens_per_s`
with `ours_tokens_per_s` of a `--device cuda` run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import torch

from replica.engine.config import EngineConfig
from replica.engine.dtype import dtype_name, resolve_dtype
from replica.engine.llm_engine import LLMEngine, build_model
from replica.engine.models.loader import default_model_path, load_checkpoint
from replica.engine.sampling_params import SamplingParams

SYSTEM_WORDS = ("policy", "customer", "answer", "briefly", "politely", "refund", "order", "account",
                "support", "shipping", "invoice", "warranty", "product", "service", "help")


def make_workload(tokenizer, num_requests: int, seed: int, max_output: int):
    rng = random.Random(seed)
    system = " ".join(rng.choice(SYSTEM_WORDS) for _ in range(400))
    system_ids = tokenizer.encode(system)[:300]
    requests = []
    for i in range(num_requests):
        user_len = int(min(max(rng.lognormvariate(math.log(48), 0.9), 4), 600))
        output_len = int(min(max(rng.lognormvariate(math.log(40), 0.8), 4), max_output))
        user = [rng.randrange(100, tokenizer.vocab_size - 100) for _ in range(user_len)]
        prompt = (system_ids + user) if i % 2 == 0 else user
        requests.append((prompt, output_len))
    return requests


def run_ours(engine: LLMEngine, workload) -> dict:
    for i, (prompt, out_len) in enumerate(workload):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True))
    produced = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        produced += sum(len(o.new_token_ids) for o in engine.step())
        print(f"\r  ours: {produced} tokens, {len(engine.scheduler.running)} running, "
              f"{len(engine.scheduler.waiting)} waiting   ", end="", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start
    print(file=sys.stderr)
    stats = engine.stats()
    return {
        "seconds": elapsed,
        "output_tokens": produced,
        "tokens_per_s": produced / elapsed,
        "prefix_hit_tokens": stats.prefix_hit_tokens,
        "preemptions": stats.num_preemptions,
    }


def start_decoding(engine: LLMEngine, batch: int, context_len: int, seed: int,
                   prefix: str) -> list[str]:
    """Add `batch` random prompts of `context_len` tokens and step until every one is past its
    prefill and decoding (those steps are not measured); returns the request ids."""
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    ids = [f"{prefix}{i}" for i in range(batch)]
    for request_id in ids:
        prompt = [rng.randrange(100, vocab - 100) for _ in range(context_len)]
        # long enough that no sequence finishes while the others are still in prefill
        engine.add_request(request_id, prompt,
                           SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True))
    sched = engine.scheduler
    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
        engine.step()
    engine.step()
    return ids


def measure_full_batch(engine: LLMEngine, batch: int, context_len: int, steps: int, seed: int,
                       roofline=None) -> dict:
    """Decode throughput with the batch full: `batch` sequences of `context_len` tokens, all
    decoding, timed over `steps` steps once every prefill is done. With `roofline` (a callable
    timing the matrix products alone, seconds), one roofline pass runs after each step, so
    both see the same load from other processes; their medians are what `roofline_fraction`
    compares."""
    ids = start_decoding(engine, batch, context_len, seed, "full")
    assert len(engine.scheduler.running) == batch, \
        "the full-batch phase needs max_num_seqs sequences resident"
    step_s, roof_s, tokens = [], [], 0
    for _ in range(steps):
        start = time.perf_counter()
        tokens += len(engine.step())
        step_s.append(time.perf_counter() - start)
        if roofline is not None:
            roof_s.append(roofline())
    for request_id in ids:
        engine.abort_request(request_id)
    out = {"batch": batch, "context_len": context_len, "tokens_per_s": tokens / sum(step_s),
           "step_ms": 1000 * sum(step_s) / steps, "step_ms_median": 1000 * statistics.median(step_s)}
    if roof_s:
        out["roofline_ms_median"] = 1000 * statistics.median(roof_s)
        out["roofline_fraction_interleaved"] = statistics.median(roof_s) / statistics.median(step_s)
    return out


def run_vllm(ckpt, workload, dtype: str, max_num_seqs: int) -> dict:
    """vLLM's offline engine on the workload (the same weights, exported as a Hugging Face
    folder; token ids in, token ids out, no tokenizer)."""
    import tempfile

    from vllm import LLM
    from vllm import SamplingParams as VllmSamplingParams

    from replica.engine.models.hf_reference import hf_llama

    with tempfile.TemporaryDirectory() as folder:
        hf_llama(ckpt.config, ckpt.state_dict).to(resolve_dtype(dtype, "cuda")).save_pretrained(folder)
        llm = LLM(model=folder, skip_tokenizer_init=True, dtype=dtype, max_num_seqs=max_num_seqs,
                  gpu_memory_utilization=0.5, seed=0)
        prompts = [{"prompt_token_ids": p} for p, _ in workload]
        params = [VllmSamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
                  for _, n in workload]
        llm.generate(prompts[:4], params[:4])  # warm-up (compilation, CUDA graphs) outside the timing
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"seconds": elapsed, "output_tokens": produced, "tokens_per_s": produced / elapsed}


def run_baseline(hf, workload, batch_size: int, device: str, max_batches: int | None) -> dict:
    useful, computed = 0, 0
    start = time.perf_counter()
    starts = list(range(0, len(workload), batch_size))[:max_batches]
    for b in starts:
        batch = workload[b : b + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (prompt, _) in enumerate(batch):  # left padding, as decoder-only generate wants
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        steps = max(n for _, n in batch)
        with torch.no_grad():
            hf.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=steps, min_new_tokens=steps,
                        do_sample=False, eos_token_id=None, pad_token_id=0)
        useful += sum(n for _, n in batch)
        computed += steps * len(batch)
        print(f"\r  transformers: batch {b // batch_size + 1}/{len(starts)}",
              end="", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start
    print(file=sys.stderr)
    return {"seconds": elapsed, "output_tokens": useful, "computed_tokens": computed,
            "batches_timed": len(starts), "tokens_per_s": useful / elapsed}


def roofline_pass(model, batch: int):
    """A callable timing the model's own matrix products for one full decode batch, alone
    (seconds), and their FLOP count."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights.append(model.model.embed_tokens.weight if model.config.tie_word_embeddings else model.lm_head.weight)
    dtype, device = weights[0].dtype, weights[0].device
    x = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=dtype, device=device) for w in weights}

    def timed() -> float:
        with torch.inference_mode():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for w in weights:
                torch.nn.functional.linear(x[w.shape[1]], w)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t0

    return timed, sum(2 * batch * w.numel() for w in weights), sum(w.numel() for w in weights)


def measure_roofline(model, batch: int, reps: int = 5) -> dict:
    """The model's own matrix products for one full decode batch, timed alone (best of reps)."""
    timed, flops, params = roofline_pass(model, batch)
    best = min(timed() for _ in range(reps))
    return {"matmul_flops_per_s": flops / best, "parameters": params,
            "roofline_tokens_per_s": flops / best / (2 * params)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-output", type=int, default=256, help="cap on one request's output tokens")
    parser.add_argument("--dtype", default="auto", help="auto (the faster here) | float32 | bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--baseline-batch", type=int, default=32)
    parser.add_argument("--baseline-batches", type=int, default=None,
                        help="time transformers on the first N static batches only (default: all; "
                             "it needs about 10x our time)")
    parser.add_argument("--full-batch-context", type=int, default=256,
                        help="context length of the sequences in the full-batch decode measurement")
    parser.add_argument("--full-batch-only", action="store_true",
                        help="measure the roofline and the full-batch decode only (a quick profile)")
    parser.add_argument("--vllm-only", action="store_true",
                        help="run vLLM's offline engine on the workload instead (GPU, vllm installed)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    dtype = dtype_name(resolve_dtype(args.dtype, args.device))
    print(f"loading SmolLM2 ({dtype}, {args.device}) ...", file=sys.stderr)
    ckpt = load_checkpoint(default_model_path())
    workload = make_workload(ckpt.tokenizer, args.num_requests, args.seed, args.max_output)
    prompt_tokens = sum(len(p) for p, _ in workload)
    output_tokens = sum(n for _, n in workload)
    print(f"workload: {len(workload)} requests, {prompt_tokens} prompt tokens, {output_tokens} output tokens",
          file=sys.stderr)

    if args.vllm_only:
        result = {"dtype": dtype, "device": args.device, "num_requests": len(workload),
                  "vllm": run_vllm(ckpt, workload, dtype, args.max_num_seqs), "settings": vars(args)}
        result["vllm_tokens_per_s"] = result["vllm"]["tokens_per_s"]
        print(f"vLLM: {result['vllm_tokens_per_s']:.1f} tok/s", file=sys.stderr)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
        return result
    model = build_model(ckpt.config, ckpt.state_dict, dtype, args.device)
    kv_bytes = 2 * 1024**3 if args.device == "cpu" else 16 * 1024**3
    config = EngineConfig(model_path=default_model_path(), dtype=dtype, device=args.device, kv_cache_bytes=kv_bytes,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    engine = LLMEngine(config, ckpt.config, model, ckpt.tokenizer)
    roofline = measure_roofline(model, args.max_num_seqs)
    full = measure_full_batch(engine, args.max_num_seqs, args.full_batch_context, 16, args.seed,
                              roofline=roofline_pass(model, args.max_num_seqs)[0])
    print(f"full batch: {full['tokens_per_s']:.1f} tok/s ({full['step_ms']:.0f} ms/step); "
          f"roofline {roofline['roofline_tokens_per_s']:.1f} tok/s; interleaved medians: step "
          f"{full['step_ms_median']:.0f} ms, matmuls alone {full['roofline_ms_median']:.0f} ms "
          f"(fraction {full['roofline_fraction_interleaved']:.2f})", file=sys.stderr)
    if args.full_batch_only:
        result = {"roofline": roofline, "full_batch": full, "threads": torch.get_num_threads(),
                  "load_average": [round(x, 2) for x in os.getloadavg()],
                  "roofline_fraction": full["roofline_fraction_interleaved"],
                  "roofline_fraction_separate": full["tokens_per_s"] / roofline["roofline_tokens_per_s"]}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
        return result
    ours = run_ours(engine, workload)
    del engine

    from replica.engine.models.hf_reference import hf_llama

    hf = hf_llama(ckpt.config, ckpt.state_dict)
    hf = hf.to(device=args.device, dtype=resolve_dtype(dtype, args.device))
    baseline = run_baseline(hf, workload, args.baseline_batch, args.device, args.baseline_batches)

    result = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)",
        "dtype": dtype,
        "device": args.device,
        "num_requests": len(workload),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "ours_tokens_per_s": ours["tokens_per_s"],
        "baseline_tokens_per_s": baseline["tokens_per_s"],
        "ratio": ours["tokens_per_s"] / baseline["tokens_per_s"],
        "roofline_tokens_per_s": roofline["roofline_tokens_per_s"],
        "matmul_flops_per_s": roofline["matmul_flops_per_s"],
        "ours_full_batch_tokens_per_s": full["tokens_per_s"],
        "roofline_fraction": full["roofline_fraction_interleaved"],
        "roofline_fraction_separate": full["tokens_per_s"] / roofline["roofline_tokens_per_s"],
        "threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "ours": ours,
        "full_batch": full,
        "baseline": baseline,
        "settings": vars(args),
    }
    rows = [
        ("ours (continuous batching)", f"{ours['tokens_per_s']:.1f} tok/s", f"{ours['seconds']:.1f} s"),
        (f"transformers static batch {args.baseline_batch}", f"{baseline['tokens_per_s']:.1f} tok/s",
         f"{baseline['seconds']:.1f} s"),
        ("ratio", f"{result['ratio']:.2f}x", ""),
        ("roofline (matmuls alone, interleaved)", f"{full['batch'] * 1e3 / full['roofline_ms_median']:.1f} tok/s",
         f"{full['roofline_ms_median']:.0f} ms a batch"),
        (f"ours at full batch ({full['batch']} x {full['context_len']} ctx)",
         f"{full['batch'] * 1e3 / full['step_ms_median']:.1f} tok/s",
         f"{result['roofline_fraction']:.2f} of roofline"),
    ]
    for name, a, b in rows:
        print(f"{name:<40} {a:>16} {b:>24}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
