"""Tensor-parallel engines (replica/engine/parallel): the shard plan (pure), and the real
SmolLM2 split over N processes with gloo on this CPU: greedy tokens equal N=1's, a dead worker
is a dead engine, workers die with their rank 0."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import torch

from replica.engine.config import EngineConfig, ModelConfig
from replica.engine.llm_engine import LLMEngine
from replica.engine.models.loader import default_model_path
from replica.engine.parallel.driver import TensorParallelError
from replica.engine.parallel.sharding import plan_shards, shard_config, shard_state_dict, split_evenly
from replica.engine.sampling_params import SamplingParams
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e5, max_position_embeddings=8192)
PROMPTS = ["The three primary colours are", "def fibonacci(n):",
           "Once upon a time in a land far away, there lived a very old dragon who"]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


# --- the plan (pure) --------------------------------------------------------------------------

def test_smollm2_over_two_ranks_splits_whole_kv_groups_unevenly():
    first, second = plan_shards(SMOLLM2, 2)
    assert (first.kv_heads, first.heads) == (range(0, 2), range(0, 6))
    assert (second.kv_heads, second.heads) == (range(2, 3), range(6, 9))
    assert (first.intermediate, second.intermediate) == (range(0, 768), range(768, 1536))


def test_smollm2_over_three_ranks_gives_one_group_each():
    shards = plan_shards(SMOLLM2, 3)
    assert [s.kv_heads for s in shards] == [range(0, 1), range(1, 2), range(2, 3)]
    assert [s.heads for s in shards] == [range(0, 3), range(3, 6), range(6, 9)]
    assert [len(s.intermediate) for s in shards] == [512, 512, 512]


def test_more_ranks_than_kv_heads_is_refused_with_the_limit():
    with pytest.raises(ValueError, match="exceeds the model's 3 KV heads.*at most 3"):
        plan_shards(SMOLLM2, 4)
    with pytest.raises(ValueError, match="at least 1"):
        plan_shards(SMOLLM2, 0)


def test_uneven_splits_cover_everything_once():
    for total in (1, 7, 9, 1536):
        for parts in range(1, min(total, 5) + 1):
            runs = split_evenly(total, parts)
            assert [i for run in runs for i in run] == list(range(total))
            assert max(map(len, runs)) - min(map(len, runs)) <= 1


def test_shards_partition_every_weight_and_their_partial_products_sum_to_the_whole():
    """Column shards concatenate to the full q/k/v/gate/up; row-parallel o/down partial products
    sum to the full product (what the all-reduce computes)."""
    config = dataclasses.replace(SMOLLM2, hidden_size=16, intermediate_size=10, num_layers=1, head_dim=4,
                                 num_heads=6, num_kv_heads=3)
    g = torch.Generator().manual_seed(0)
    p = "model.layers.0."
    shapes = {p + "self_attn.q_proj.weight": (24, 16), p + "self_attn.k_proj.weight": (12, 16),
              p + "self_attn.v_proj.weight": (12, 16), p + "self_attn.o_proj.weight": (16, 24),
              p + "mlp.gate_proj.weight": (10, 16), p + "mlp.up_proj.weight": (10, 16),
              p + "mlp.down_proj.weight": (16, 10), "model.norm.weight": (16,)}
    full = {name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in shapes.items()}
    shards = plan_shards(config, 2)
    parts = [shard_state_dict(full, config, shard) for shard in shards]
    for name in ("q_proj", "k_proj", "v_proj"):
        key = p + f"self_attn.{name}.weight"
        assert torch.equal(torch.cat([part[key] for part in parts]), full[key])
    assert parts[0][p + "self_attn.q_proj.weight"].shape == (16, 16)  # 2 KV groups of 2 heads x 4
    x_attn = torch.randn(5, 24, generator=g, dtype=torch.float64)
    o = p + "self_attn.o_proj.weight"
    partial = [x_attn[:, s.heads.start * 4 : s.heads.stop * 4] @ part[o].T for s, part in zip(shards, parts)]
    torch.testing.assert_close(sum(partial), x_attn @ full[o].T)
    x_mlp = torch.randn(5, 10, generator=g, dtype=torch.float64)
    d = p + "mlp.down_proj.weight"
    partial = [x_mlp[:, s.intermediate.start : s.intermediate.stop] @ part[d].T for s, part in zip(shards, parts)]
    torch.testing.assert_close(sum(partial), x_mlp @ full[d].T)
    assert all(part["model.norm.weight"] is full["model.norm.weight"] for part in parts)
    assert shard_config(config, shards[1]) == dataclasses.replace(config, num_heads=2, num_kv_heads=1,
                                                                  intermediate_size=5)


# --- the real model over N processes ----------------------------------------------------------

def _engine(tensor_parallel: int, **overrides) -> LLMEngine:
    # Small steps: prompts prefill in several chunks, mixed with other sequences' decodes.
    config = EngineConfig(model_path=default_model_path(), dtype="float32", kv_cache_bytes=16 << 20,
                          max_num_batched_tokens=16, num_threads=2, tensor_parallel=tensor_parallel)
    return LLMEngine.from_config(dataclasses.replace(config, **overrides))


def _greedy_runs(engine: LLMEngine) -> list[list[int]]:
    """The prompts batched, then the long one again (a prefix-cache hit on its full blocks)."""
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    first = engine.generate(ids, GREEDY)
    again = engine.generate([ids[2]], GREEDY)
    assert engine.stats().prefix_hit_tokens >= 16
    return first + again


@pytest.fixture(scope="module")
def single_device_tokens() -> list[list[int]]:
    return _greedy_runs(_engine(1))


@pytest.mark.slow
@pytest.mark.parametrize("tensor_parallel", [2, 3])
def test_greedy_tokens_over_n_ranks_equal_one_device(single_device_tokens, tensor_parallel):
    engine = _engine(tensor_parallel)
    try:
        assert engine.runner.model.world_size == tensor_parallel
        assert _greedy_runs(engine) == single_device_tokens
    finally:
        engine.close()
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
               for pid in engine.runner.model.worker_pids)


@pytest.mark.slow
def test_a_dead_worker_is_a_dead_engine():
    engine = _engine(2)
    failed = threading.Event()
    reasons: list[str] = []
    engine.on_failure(lambda reason: (reasons.append(reason), failed.set()))
    try:
        (worker,) = engine.runner.model.worker_pids
        os.kill(worker, signal.SIGKILL)
        assert failed.wait(60), "the engine did not notice its worker's death"
        assert reasons == [f"tensor-parallel worker rank 1 (pid {worker}) exited with code -9"]
        engine.add_request("after", engine.tokenizer.encode("Hello"), GREEDY)
        (output,) = engine.step()  # the step fails its request; the engine counts the failure
        assert output.finished and "tensor-parallel worker rank 1" in output.error
        with pytest.raises(TensorParallelError):
            engine.runner.model(*[None] * 5)
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("started_from", ["main thread", "a thread that ends"])
def test_workers_die_with_rank_0(started_from):
    """From the main thread the parent-death signal is armed; from another thread it is not (Linux
    would fire it when that thread ends: the workers must outlive it), and the stdin pipe alone
    ends them when rank 0 dies."""
    build = ("engine = LLMEngine.from_config(EngineConfig(model_path=default_model_path(), dtype='float32',\n"
             "    kv_cache_bytes=16 << 20, num_threads=2, tensor_parallel=3))\n")
    if started_from != "main thread":
        build = ("import threading\nbox = {}\n"
                 "def start():\n    box['e'] = LLMEngine.from_config(EngineConfig(model_path=default_model_path(),\n"
                 "        dtype='float32', kv_cache_bytes=16 << 20, num_threads=2, tensor_parallel=3))\n"
                 "t = threading.Thread(target=start)\nt.start()\nt.join()\nengine = box['e']\n")
    script = ("import json, sys\n"
              "from replica.engine.config import EngineConfig\n"
              "from replica.engine.sampling_params import SamplingParams\n"
              "from replica.engine.llm_engine import LLMEngine\n"
              "from replica.engine.models.loader import default_model_path\n"
              + build +
              "print(*engine.runner.model.worker_pids, flush=True)\n"
              "sys.stdin.readline()\n"
              "greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)\n"
              "print(json.dumps(engine.generate([[1, 2, 3]], greedy)), flush=True)\n"
              "sys.stdin.read()\n")
    rank0 = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        pids = [int(pid) for pid in rank0.stdout.readline().split()]
        assert len(pids) == 2, "rank 0 did not start its two workers"
        rank0.stdin.write("step\n")
        rank0.stdin.flush()
        assert len(json.loads(rank0.stdout.readline())[0]) == 2  # the workers outlived the thread that started them
        assert all(psutil.pid_exists(pid) for pid in pids)
    finally:
        rank0.kill()
        rank0.wait()

    def gone() -> bool:
        return all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
                   for pid in pids)
    wait_until(gone, 60, "the workers to exit after rank 0 was killed")


def test_int4_is_refused_before_any_worker_starts():
    with pytest.raises(ValueError, match="int4 is not built for tensor-parallel replicas"):
        _engine(2, quantization="int4")


def test_launch_passes_the_degree_to_the_model_config():
    from replica.backend.model_parameters import ModelParameters
    from replica.launch import parse_args, spec_from_args

    ports = ["--model", "m", "--grpc-port", "1", "--http-port", "2", "--metrics-port", "3"]
    assert parse_args(ports).tensor_parallel == 1
    parameters = spec_from_args(parse_args([*ports, "--tensor-parallel-degree", "2"]), env={}).parameters
    template = (REPO_ROOT / "replica/model_repository/smollm2/config.pbtxt").read_text()
    rendered = parameters.render_into(template)
    assert 'key: "tensor_parallel" value: { string_value: "2" }' in rendered
    model_config = {"parameters": {"tensor_parallel": {"string_value": "2"}}}
    assert ModelParameters.from_model_config(model_config).engine_config("w.gguf").tensor_parallel == 2
    with pytest.raises(SystemExit):
        parse_args([*ports, "--tensor-parallel", "0"])


def test_a_step_input_crosses_the_wire_whole_and_without_pickle():
    from replica.engine.parallel.rank import StepInput
    from replica.engine.runner.attention import AttentionMetadata, PrefillSeq

    meta = AttentionMetadata(
        slot_mapping=torch.tensor([40, 41, 7]), decode_token_idx=torch.tensor([2]),
        decode_block_tables=torch.tensor([[0, 3]]), decode_mask=torch.tensor([[True, False]]).view(1, 1, 1, 2),
        decode_context_lens=torch.tensor([18]),
        prefills=[PrefillSeq(query_start=0, query_len=2, context_len=2, block_ids=torch.tensor([2]))],
        native="rank 0's kernel")
    payload = StepInput(torch.tensor([5, 6, 9]), torch.tensor([0, 1, 17]), meta).to_bytes()
    header = json.loads(payload[8 : 8 + int.from_bytes(payload[:8], "little")])  # JSON, then raw bytes
    assert header["meta"]["type"] == "AttentionMetadata" and header["meta"]["fields"]["native"] is None
    step = StepInput.from_bytes(payload, torch.device("cpu"), native="this rank's kernel")
    assert step.input_ids.tolist() == [5, 6, 9] and step.positions.tolist() == [0, 1, 17]
    got = step.meta
    assert got.native == "this rank's kernel"
    for name in ("slot_mapping", "decode_token_idx", "decode_block_tables", "decode_mask", "decode_context_lens"):
        assert torch.equal(getattr(got, name), getattr(meta, name)), name
    (prefill,) = got.prefills
    assert (prefill.query_start, prefill.query_len, prefill.context_len) == (0, 2, 2)
    assert prefill.block_ids.tolist() == [2]

    @dataclasses.dataclass
    class Unknown:
        value: int

    with pytest.raises(TypeError, match="Unknown is not sent to tensor-parallel workers"):
        StepInput(torch.tensor([1]), torch.tensor([0]), dataclasses.replace(meta, prefills=[Unknown(1)])).to_bytes()
    with pytest.raises(TypeError, match="torch.float32 tensor is not sent"):
        StepInput(torch.tensor([1]), torch.tensor([0.5]), meta).to_bytes()
