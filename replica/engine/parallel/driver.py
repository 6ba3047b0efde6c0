"""Rank 0 of a tensor-parallel replica: starts the workers, then drives every step.

`start_tensor_parallel` spawns ranks 1..N-1 (`python -m replica.engine.parallel.worker`), builds
rank 0's own shard while they load, waits (named deadline, watching each worker's exit) until
all say ready, and joins the groups. It returns a `TensorParallelModel`, which the ModelRunner
drives like the plain model: each call broadcasts the step's model input to the workers, then
runs rank 0's shard; the workers run theirs and join the all-reduces; rank 0 alone computes the
logits and samples. One scheduler (rank 0's) decides everything; the block tables are the same
on all ranks, each rank's KV pools hold its own KV heads.

A dead worker is a dead engine: a thread per worker waits for its exit and, unless the model is
closing, marks the model broken and calls the failure callbacks (the Triton model kills its
engine loop through one: docs/engine-faults.md). A step that fails on rank 0 after the broadcast
leaves the workers inside a collective, so it breaks the model too. A broken model refuses every
later step at once.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from replica.engine.config import INT4, EngineConfig, normalize_quantization
from replica.engine.models.loader import LoadedCheckpoint
from replica.engine.parallel.group import TensorParallelGroup, install_all_reduce, open_store
from replica.engine.parallel.rank import RankSpec, StepInput, build_rank_model
from replica.engine.parallel.sharding import plan_shards
from replica.engine.parallel.worker import READY_KEY

_log = logging.getLogger("replica.tensor_parallel")
_REPO_ROOT = Path(__file__).resolve().parents[3]
FailureCallback = Callable[[str], None]


class TensorParallelError(RuntimeError):
    """The tensor-parallel group cannot go on (a worker died, or a step broke the lockstep)."""


class TensorParallelModel(nn.Module):
    """Rank 0's model: the same call as LlamaForCausalLM, run on all ranks."""

    def __init__(self, shard: nn.Module, group: TensorParallelGroup, workers: list[subprocess.Popen]) -> None:
        super().__init__()
        self.shard = shard
        self.config = shard.config  # this rank's heads: the runner sizes its KV pools by it
        self.quantization = shard.quantization
        self.world_size = group.world_size
        self._group = group
        self._workers = workers
        self._lock = threading.Lock()
        self._closing = False
        self._broken: str | None = None
        self._callbacks: list[FailureCallback] = []
        for rank, worker in enumerate(workers, start=1):
            threading.Thread(target=self._watch, args=(rank, worker), name=f"tp-watch-{rank}", daemon=True).start()

    def forward(self, input_ids, positions, kv_pools, meta, logits_idx) -> torch.Tensor:
        if self._broken is not None:
            raise TensorParallelError(self._broken)
        self._group.send_step(StepInput(input_ids, positions, meta).to_bytes())
        try:
            return self.shard(input_ids, positions, kv_pools, meta, logits_idx)
        except BaseException as exc:
            self._fail(f"a tensor-parallel step failed on rank 0, the ranks are out of step: {exc!r}")
            raise

    @property
    def worker_pids(self) -> list[int]:
        return [worker.pid for worker in self._workers]

    def on_failure(self, callback: FailureCallback) -> None:
        """Call `callback(reason)` once when the group breaks (at once if it already has)."""
        with self._lock:
            if self._broken is None:
                self._callbacks.append(callback)
                return
            reason = self._broken
        callback(reason)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers (told to stop; killed after `timeout_s`)."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            healthy = self._broken is None
        if healthy:
            try:
                self._group.send_stop()
            except RuntimeError:
                _log.warning("could not tell the tensor-parallel workers to stop; killing them")
        for worker in self._workers:
            try:
                worker.wait(timeout_s)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            if worker.stdin is not None:
                worker.stdin.close()

    def _watch(self, rank: int, worker: subprocess.Popen) -> None:
        code = worker.wait()
        if not self._closing:
            self._fail(f"tensor-parallel worker rank {rank} (pid {worker.pid}) exited with code {code}")

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._broken is not None:
                return
            self._broken = reason
            callbacks, self._callbacks = self._callbacks, []
        _log.error("%s; this engine is dead", reason)
        for worker in self._workers:  # out of lockstep: no worker may run on
            if worker.poll() is None:
                worker.kill()
        for callback in callbacks:
            callback(reason)


def per_rank_threads(config: EngineConfig) -> int:
    """Each rank's torch threads on a CPU: the replica's threads shared out (at least one)."""
    return max(1, (config.num_threads or torch.get_num_threads()) // config.tensor_parallel)


def start_tensor_parallel(config: EngineConfig, checkpoint: LoadedCheckpoint, dtype: str, num_blocks: int,
                          ready_timeout_s: float = 600.0) -> TensorParallelModel:
    """Rank 0's model over `config.tensor_parallel` ranks (workers started and ready)."""
    world_size = config.tensor_parallel
    if normalize_quantization(config.quantization) == INT4:
        raise ValueError("int4 is not built for tensor-parallel replicas (its GGUF blocks are not sharded); "
                         "use --quantization none or int8, or --tensor-parallel 1")
    plan_shards(checkpoint.config, world_size)  # refuses a degree the model cannot be split into
    if config.device == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(f"--tensor-parallel {world_size} needs {world_size} CUDA devices; "
                         f"{torch.cuda.device_count()} visible (CUDA_VISIBLE_DEVICES)")
    threads = per_rank_threads(config)
    torch.set_num_threads(threads)
    store = open_store(world_size, is_master=True)
    spec = RankSpec(rank=0, world_size=world_size, store_port=store.port, model_path=config.model_path,
                    dtype=dtype, device=config.device, quantization=config.quantization, num_blocks=num_blocks,
                    block_size=config.block_size, num_threads=threads)
    workers = [_spawn(dataclasses.replace(spec, rank=rank)) for rank in range(1, world_size)]
    try:
        shard = build_rank_model(checkpoint.config, checkpoint.state_dict, spec)
        _wait_ready(store, workers, ready_timeout_s)
        group = TensorParallelGroup(store, 0, world_size, spec.torch_device())
    except BaseException:
        for worker in workers:
            worker.kill()
            worker.wait()
        raise
    install_all_reduce(shard, group)
    model = TensorParallelModel(shard, group, workers)
    _log.info("tensor parallel over %d ranks (workers: pids %s; parent-death signal %s), %d threads each",
              world_size, ", ".join(map(str, model.worker_pids)),
              "armed" if threading.current_thread() is threading.main_thread() else "off, stdin pipe only", threads)
    return model


def _python() -> str:
    """This interpreter; inside Triton's Python-backend stub (not a python), the one on PATH."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    found = shutil.which("python3") or shutil.which("python")
    if found is None:
        raise RuntimeError("no python on PATH to start tensor-parallel workers with")
    return found


def _spawn(spec: RankSpec) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    command = [_python(), "-m", "replica.engine.parallel.worker", "--spec", spec.to_json(),
               "--parent-pid", str(os.getpid())]
    if threading.current_thread() is threading.main_thread():  # the death signal follows the starting thread
        command.append("--parent-death-signal")
    return subprocess.Popen(command, stdin=subprocess.PIPE, env=env, cwd=_REPO_ROOT)


def _wait_ready(store, workers: list[subprocess.Popen], timeout_s: float) -> None:
    """Until every worker has loaded its shard; a worker that exits first, or the deadline, raise."""
    deadline = time.monotonic() + timeout_s
    keys = [READY_KEY.format(rank=rank) for rank in range(1, len(workers) + 1)]
    while not store.check(keys):
        for rank, worker in enumerate(workers, start=1):
            if worker.poll() is not None:
                raise TensorParallelError(f"tensor-parallel worker rank {rank} exited with code {worker.returncode} "
                                          "while loading (its traceback is in this replica's log)")
        if time.monotonic() > deadline:
            raise TensorParallelError(f"tensor-parallel workers not ready after {timeout_s:.0f}s (each loads the whole "
                                      "checkpoint: see their progress in this replica's log)")
        time.sleep(0.1)
