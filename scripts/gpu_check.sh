#!/usr/bin/env bash
# The GPU checks of issue #16, in one go on a machine with one NVIDIA GPU (about 8 minutes of
# work; the step time limits add up to ~14 minutes for a slow pip install):
#   1. greedy parity with transformers on CUDA (float32 / bfloat16 / float16; both models on
#      the GPU): tests/replica/test_engine_vs_hf.py's -cuda variants;
#   2. python -m benchmarks.engine --device cuda (our engine vs transformers' static batches,
#      and the full-batch step against the matrix-product roofline), JSON under
#      benchmarks/results/engine-cuda.json;
#   3. where `pip install vllm` works there (it needs the package index; into a venv of its own,
#      $VLLM_VENV), vLLM's offline engine on the same workload: benchmarks.engine --vllm-only,
#      benchmarks/results/engine-vllm-cuda.json, and the ratio ours / vLLM.
# Run from anywhere:  bash scripts/gpu_check.sh   (PYTHON=... to choose the interpreter;
# GPU_CHECK_SKIP_VLLM=1 skips step 3). Exits non-zero when a step fails, naming it.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
OUT_DIR=benchmarks/results
mkdir -p "$OUT_DIR"
failed=()
started=$SECONDS

step() {  # step NAME TIMEOUT_S COMMAND...: run one step under a deadline, record a failure
    local name=$1 limit=$2
    shift 2
    echo "== [$((SECONDS - started)) s] $name (at most ${limit} s)"
    if ! timeout --kill-after=10 "$limit" "$@"; then
        echo "!! $name failed or ran past ${limit} s"
        failed+=("$name")
    fi
}

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "no CUDA device visible to $PYTHON's torch (a CPU-only wheel, or no driver): nothing to check here" >&2
    exit 2
fi
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))'

# The replica tests touch no database; the settings module still wants these names.
export SECRET_KEY="${SECRET_KEY:-gpu-check-not-secret}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/llm_gpu_check}"

step "parity on CUDA" 180 "$PYTHON" -m pytest tests/replica/test_engine_vs_hf.py -k cuda -q -p no:cacheprovider

step "benchmarks.engine --device cuda" 240 "$PYTHON" -m benchmarks.engine --device cuda \
    --baseline-batches 2 --out "$OUT_DIR/engine-cuda.json"

# vLLM goes into a venv of its own (it pins its own torch), seeing the project's packages below it.
VLLM_VENV="${VLLM_VENV:-${HOME}/.cache/llm-platform/vllm-venv}"
if [[ -n "${GPU_CHECK_SKIP_VLLM:-}" ]]; then
    echo "== vLLM skipped (GPU_CHECK_SKIP_VLLM is set)"
elif { [[ -x "$VLLM_VENV/bin/python" ]] && "$VLLM_VENV/bin/python" -c 'import vllm' 2>/dev/null; } \
        || { "$PYTHON" -m venv --system-site-packages "$VLLM_VENV" \
             && timeout 240 "$VLLM_VENV/bin/python" -m pip install --quiet vllm; }; then
    step "vLLM on the same workload" 180 "$VLLM_VENV/bin/python" -m benchmarks.engine --device cuda --vllm-only \
        --out "$OUT_DIR/engine-vllm-cuda.json"
    "$PYTHON" - "$OUT_DIR/engine-cuda.json" "$OUT_DIR/engine-vllm-cuda.json" <<'PY' || true
import json, sys
ours, vllm = (json.load(open(p)) for p in sys.argv[1:3])
print(f"ours {ours['ours_tokens_per_s']:.0f} tok/s, vLLM {vllm['vllm_tokens_per_s']:.0f} tok/s: "
      f"ratio {ours['ours_tokens_per_s'] / vllm['vllm_tokens_per_s']:.2f}")
PY
else
    echo "== vLLM not installable here (pip install vllm failed: no package index, or no wheel for this platform); no ratio"
fi

echo "== done in $((SECONDS - started)) s; results in $OUT_DIR/engine-cuda.json${failed[*]:+; FAILED: ${failed[*]}}"
[[ ${#failed[@]} -eq 0 ]]
