"""The names of a replica's metrics on its Triton metrics port, defined once.

The replica exports them (`replica/backend/engine_metrics.py`, inside the Triton backend stub);
the platform reads them (`inference/replica_signals.py`: the router's replica signals; the fake
Triton of the tests; benchmarks). Both sides import this module, which imports nothing, so the
platform's web role may import it without torch or Triton. Labels: `model`, `version` (Triton's
model version, always 1; not a model version's number).

Triton's own `nv_inference_*` metrics do not see streaming work, so the router and autoscaler
read ours instead.
"""
from __future__ import annotations

RUNNING_SEQS = "replica_running_seqs"
WAITING_SEQS = "replica_waiting_seqs"
KV_FREE_BLOCKS = "replica_kv_free_blocks"
KV_TOTAL_BLOCKS = "replica_kv_total_blocks"
PREFIX_CACHE_HIT_TOKENS = "replica_prefix_cache_hit_tokens_total"
PROMPT_TOKENS = "replica_prompt_tokens_total"
GENERATED_TOKENS = "replica_generated_tokens_total"
PREEMPTIONS = "replica_preemptions_total"
# Gauge, always 1; its labels (model, version, dtype, quantization) say what the engine runs.
ENGINE_INFO = "replica_engine_info"
# Gauge: 1 while the engine loop runs, 0 once it died (the replica serves nothing).
ENGINE_ALIVE = "replica_engine_alive"

# metric name -> (the EngineStats attribute it exports, help)
GAUGES = {
    RUNNING_SEQS: ("num_running", "Sequences in the running batch"),
    WAITING_SEQS: ("num_waiting", "Sequences waiting to be scheduled"),
    KV_FREE_BLOCKS: ("num_free_blocks", "Free KV cache blocks"),
    KV_TOTAL_BLOCKS: ("num_total_blocks", "Total KV cache blocks"),
}
COUNTERS = {
    PREFIX_CACHE_HIT_TOKENS: ("prefix_hit_tokens", "Prompt tokens served from the prefix cache"),
    PROMPT_TOKENS: ("prompt_tokens",
                    "Prompt tokens prefilled (prefix-cache hits included, "
                    "recompute not counted again): what requests are billed"),
    GENERATED_TOKENS: ("generated_tokens", "Tokens generated"),
    PREEMPTIONS: ("num_preemptions", "Sequences preempted (recompute)"),
}
