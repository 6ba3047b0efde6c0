"""A tensor-parallel worker (ranks 1..N-1): `python -m replica.engine.parallel.worker --spec JSON`.

Started by rank 0 (driver.py), never by hand. It dies with rank 0: a parent-death signal
(SIGKILL, when rank 0 started it from its main thread: Linux sends it when the starting
*thread* ends) and, always, end-of-file on its stdin, a pipe whose other end only rank 0 holds.
Then: connect to rank 0's store, load the checkpoint, build this rank's shard, allocate its share
of the KV cache (its KV heads, every block), say ready, join the groups, and run each step
rank 0 broadcasts until told to stop. Anything that goes wrong ends the process with a non-zero
code: rank 0 sees the worker exit and its engine dies (docs/engine-faults.md).
"""
from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import threading

import torch

from replica.engine.parallel.group import TensorParallelGroup, install_all_reduce, open_store
from replica.engine.parallel.rank import RankSpec, StepInput, build_rank_model
from replica.engine.parallel.sharding import rank_weights

_log = logging.getLogger("replica.tensor_parallel")
_PR_SET_PDEATHSIG = 1
READY_KEY = "ready/{rank}"


def _die_with_parent(parent_pid: int, death_signal: bool) -> None:
    if death_signal and sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # rank 0 died before the signal was armed
        os._exit(1)

    def watch_stdin() -> None:
        sys.stdin.buffer.read()  # returns at end-of-file: rank 0's end of the pipe closed
        os._exit(1)

    threading.Thread(target=watch_stdin, name="parent-watch", daemon=True).start()


def serve(spec: RankSpec) -> None:
    from replica.engine.models.loader import load_checkpoint
    from replica.engine.runner.model_runner import ModelRunner

    torch.set_num_threads(spec.num_threads)
    device = spec.torch_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = open_store(spec.world_size, spec.store_port)
    checkpoint = load_checkpoint(spec.model_path, shard=rank_weights(spec.world_size, spec.rank))
    model = build_rank_model(checkpoint.config, checkpoint.state_dict, spec)
    del checkpoint
    dtype = next(model.parameters()).dtype
    runner = ModelRunner(model, spec.num_blocks, spec.block_size, dtype, device)  # its KV pools and kernel
    store.set(READY_KEY.format(rank=spec.rank), "1")
    group = TensorParallelGroup(store, spec.rank, spec.world_size, device)
    install_all_reduce(model, group)
    no_logits = torch.empty(0, dtype=torch.long, device=device)  # rank 0 alone runs the head
    _log.info("tensor-parallel rank %d/%d ready (pid %d)", spec.rank, spec.world_size, os.getpid())
    with torch.inference_mode():
        while (payload := group.receive()) is not None:
            step = StepInput.from_bytes(payload, device, runner.native_attention)
            model(step.input_ids, step.positions, runner.kv_pools, step.meta, no_logits)
    _log.info("tensor-parallel rank %d stopped", spec.rank)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m replica.engine.parallel.worker")
    parser.add_argument("--spec", required=True, help="RankSpec as JSON (rank 0 writes it)")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--parent-death-signal", action="store_true")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid, args.parent_death_signal)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    serve(RankSpec.from_json(args.spec))
    logging.shutdown()
    os._exit(0)  # not through interpreter shutdown: the stdin watcher thread holds stdin's lock


if __name__ == "__main__":
    sys.exit(main())
