"""A tensor-parallel rank reads only its shard of the checkpoint (`load_checkpoint(path,
shard=rank_weights(N, r))`): GGUF rows and blocks sliced in the memory map before dequantising,
safetensors through `get_slice`. What it loads equals the slice of the whole load, exactly, and
its parameter bytes are its share (the replicated embeddings, norms and head plus its heads'
and columns' part of the rest)."""
from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch

from replica.engine.models.gguf_reader import GGUFReader
from replica.engine.models.loader import default_model_path, expected_weight_shapes, load_checkpoint
from replica.engine.parallel.sharding import plan_shards, rank_weights, shard_config, shard_state_dict
from tests.replica.test_gguf_loader import _tiny_hf_model, _write_gguf, _write_tokenizer

Q = gguf.GGMLQuantizationType


def _nbytes(state_dict: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state_dict.values())


def _assert_ranks_load_their_slices(path: str, world_size: int) -> list[int]:
    """Each rank's load equals the slice of the full load; returns each rank's parameter bytes."""
    full = load_checkpoint(path)
    sizes = []
    for rank, shard in enumerate(plan_shards(full.config, world_size)):
        part = load_checkpoint(path, shard=rank_weights(world_size, rank))
        assert part.config == full.config  # the whole model's; build_rank_model narrows it
        expected = shard_state_dict(full.state_dict, full.config, shard)
        assert set(part.state_dict) == set(expected)
        for name, tensor in expected.items():
            assert torch.equal(part.state_dict[name], tensor), (rank, name)
        # rank r's parameters are exactly its shard's shapes, float32
        shapes = expected_weight_shapes(shard_config(full.config, shard))
        assert _nbytes(part.state_dict) == 4 * sum(int(np.prod(s)) for s in shapes.values())
        sizes.append(_nbytes(part.state_dict))
    return sizes


@pytest.fixture(scope="module")
def model_path() -> str:
    try:
        return default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("world_size", [2, 3])
def test_smollm2_ranks_read_exactly_their_slices(model_path, world_size, capsys):
    sizes = _assert_ranks_load_their_slices(model_path, world_size)
    whole = _nbytes(load_checkpoint(model_path).state_dict)
    assert all(size < whole for size in sizes)
    with capsys.disabled():
        print(f"\nSmolLM2 float32 parameter bytes: N=1 {whole / 2**20:.1f} MiB; N={world_size} ranks "
              + ", ".join(f"{s / 2**20:.1f}" for s in sizes) + " MiB")


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q4_1, Q.Q8_0])
def test_synthetic_gguf_slices_inside_and_across_blocks(tmp_path, qtype):
    """The tiny model's o_proj columns split 16/16 inside 32-value blocks (Q4_1, Q8_0): the rank
    reads the blocks that hold its columns and trims them."""
    _write_gguf(tmp_path / "tiny.gguf", _tiny_hf_model(seed=3), qtype=qtype)
    _assert_ranks_load_their_slices(str(tmp_path / "tiny.gguf"), 2)


def test_a_column_part_that_starts_and_ends_mid_block(model_path):
    reader = GGUFReader(model_path)
    name = "blk.0.ffn_down.weight"
    assert reader.tensor_infos[name].type_name not in ("F32", "F16")  # blocks of 32 values
    whole = reader.load(name)
    assert np.array_equal(reader.load_part(name, 1, 5, 70), whole[:, 5:70])
    assert np.array_equal(reader.load_part(name, 0, 7, 300), whole[7:300])
    with pytest.raises(ValueError, match="has no part"):
        reader.load_part(name, 1, 70, 5)


@pytest.mark.parametrize("sharded_files", [False, True])
def test_hf_directory_ranks_read_exactly_their_slices(tmp_path, sharded_files):
    _tiny_hf_model(seed=4).save_pretrained(tmp_path, max_shard_size="20KB" if sharded_files else "5GB")
    _write_tokenizer(tmp_path)
    _assert_ranks_load_their_slices(str(tmp_path), 2)


_PEAK_RSS = """
import json, sys
from replica.engine.models.loader import load_checkpoint
from replica.engine.parallel.sharding import rank_weights
path, n, r = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ck = load_checkpoint(path, shard=rank_weights(n, r) if n > 1 else None)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent (pytest, big)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"peak_rss_kib": int(hwm.split()[1]),
                  "param_bytes": sum(t.numel() * t.element_size() for t in ck.state_dict.values())}))
"""


@pytest.mark.slow
def test_peak_rss_of_a_rank_loading_smollm2(model_path, capsys):
    """Measured, printed, and only the materialised bytes asserted (RSS depends on the allocator)."""
    def measure(n: int, r: int) -> dict:
        out = subprocess.run([sys.executable, "-c", _PEAK_RSS, model_path, str(n), str(r)],
                             check=True, capture_output=True, text=True, timeout=300).stdout
        return json.loads(out.strip().splitlines()[-1])
    runs = {(1, 0): measure(1, 0), (2, 0): measure(2, 0), (2, 1): measure(2, 1)}
    with capsys.disabled():
        for (n, r), m in runs.items():
            print(f"\nN={n} rank {r}: peak RSS {m['peak_rss_kib'] / 1024:.0f} MiB, "
                  f"parameters {m['param_bytes'] / 2**20:.1f} MiB")
    assert runs[(2, 0)]["param_bytes"] + runs[(2, 1)]["param_bytes"] > runs[(1, 0)]["param_bytes"]
    assert max(runs[(2, 0)]["param_bytes"], runs[(2, 1)]["param_bytes"]) < runs[(1, 0)]["param_bytes"]
