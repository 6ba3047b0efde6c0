"""python -m replica.launch: run one tritonserver replica for one model version until SIGTERM.

Prints one `replica ready: ...` line once the model answers ready. On SIGTERM/SIGINT it drains
(new requests refused, in-flight streams finish within --drain-grace-s, then are aborted), stops
the server and exits 0. A missing weights file or a model that fails to load exits non-zero with
the reason on stderr. If the model's engine loop dies (the model writes its engine-dead file), it
prints `replica failed: the engine died: <reason>`, stops the server at once (Triton's model
readiness turns false as the server stops) and exits 3, so the node agent records the replica
failed and the fleet replaces it.

Access: the server listens on --bind-address (loopback by default). The access token comes from
the environment variable REPLICA_ACCESS_TOKEN (never a flag: this command line is visible in
`ps`); with it, every call but a health check needs the token (replica/access.py). Without it
the launcher refuses a non-loopback bind address.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from replica.access import LOOPBACK, TOKEN_ENV
from replica.backend.model_parameters import ModelParameters
from replica.engine.config import normalize_quantization
from replica.replica_process import LaunchError, ReplicaProcess, ReplicaSpec


def quantization_arg(value: str) -> str:
    try:
        return normalize_quantization(value)
    except ValueError as exc:  # argparse prints it and exits 2
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = ModelParameters()
    parser = argparse.ArgumentParser(prog="python -m replica.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model name in Triton (one model version)")
    parser.add_argument("--weights", default="", help="GGUF file or Hugging Face directory (default: bundled SmolLM2)")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default=defaults.dtype,
                        help="auto: bfloat16 on CUDA; on a CPU the faster of bfloat16 and float32 (measured at load)")
    # A node agent's replicas inherit its environment: REPLICA_DEVICE=cuda on a GPU node.
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default=os.environ.get("REPLICA_DEVICE") or defaults.device,
                        help="default: $REPLICA_DEVICE, else cpu")
    parser.add_argument("--quantization", type=quantization_arg, default=defaults.quantization,
                        help="weights: none (the dtype above) | int8 (per output channel, quantised at load) | "
                             "int4 (a GGUF file's Q4_0/Q4_1 blocks as stored, read by decode); "
                             "a ModelVersion.quantization value, '' meaning none")
    parser.add_argument("--kv-cache-bytes", type=int, default=defaults.kv_cache_bytes)
    parser.add_argument("--kv-cache-blocks", type=int, default=defaults.kv_cache_blocks,
                        help="exactly this many KV blocks, whatever the dtype (0: what --kv-cache-bytes buys)")
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
    parser.add_argument("--num-threads", type=int, default=0,
                        help="torch threads in the engine (0: torch default); shared out among tensor-parallel ranks")
    # --tensor-parallel-degree: the name of the version's field (ModelVersion.tensor_parallel_degree)
    parser.add_argument("--tensor-parallel", "--tensor-parallel-degree", dest="tensor_parallel", type=int,
                        default=defaults.tensor_parallel,
                        help="ranks (devices) this one replica runs over: attention heads and MLP columns sharded, "
                             "rank 0 in tritonserver drives N-1 worker processes (CUDA: N visible devices)")
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--bind-address", default=LOOPBACK,
                        help=f"gRPC and metrics listen here only (default {LOOPBACK}); anything "
                             f"but loopback needs {TOKEN_ENV} in the environment")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--drain-grace-s", type=float, default=defaults.drain_grace_s)
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.tensor_parallel < 1:
        parser.error(f"--tensor-parallel must be at least 1, not {args.tensor_parallel}")
    if args.kv_cache_blocks == 1 or args.kv_cache_blocks < 0:
        parser.error(f"--kv-cache-blocks must be 0 (by the bytes) or at least 2, not {args.kv_cache_blocks}")
    if args.device not in ("cpu", "cuda"):  # argparse does not check a default against choices
        parser.error(f"REPLICA_DEVICE must be cpu or cuda, not {args.device!r}")
    return args


def spec_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> ReplicaSpec:
    env = os.environ if env is None else env
    return ReplicaSpec(
        model_name=args.model,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        parameters=ModelParameters(
            weights=args.weights,
            dtype=args.dtype,
            device=args.device,
            quantization=args.quantization,
            kv_cache_bytes=args.kv_cache_bytes,
            kv_cache_blocks=args.kv_cache_blocks,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            num_threads=args.num_threads,
            tensor_parallel=args.tensor_parallel,
        ),
        workdir=args.workdir,
        drain_grace_s=args.drain_grace_s,
        bind_address=args.bind_address,
        access_token=env.get(TOKEN_ENV, "").strip(),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_requested = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop_requested.set())
    replica = ReplicaProcess(spec_from_args(args))
    started = time.monotonic()
    try:
        replica.start()
        replica.wait_ready(timeout_s=args.ready_timeout_s, interrupted=stop_requested)
    except (LaunchError, ValueError, FileNotFoundError) as exc:
        print(f"replica launch failed: {exc}", file=sys.stderr, flush=True)
        if replica.pid is not None:
            replica.stop(grace_s=0.0, unload_timeout_s=5.0)
        return 2
    print(
        f"replica ready: model={args.model} grpc={args.grpc_port} http={args.http_port} "
        f"metrics={args.metrics_port} pid={replica.pid} weights={replica.weights_path} "
        f"quantization={args.quantization} tensor_parallel={args.tensor_parallel} bind={args.bind_address} "
        f"access={'token' if replica.spec.access_token else 'open'} "
        f"in {time.monotonic() - started:.1f}s (log: {replica.log_path})",
        flush=True,
    )
    while not stop_requested.wait(0.2):
        dead = replica.engine_dead_reason()
        if dead is not None:
            print(f"replica failed: the engine died: {dead}", file=sys.stderr, flush=True)
            replica.stop(grace_s=0.0, unload_timeout_s=10.0)
            return 3
        if replica.poll() is not None:
            print(f"replica failed: tritonserver exited with code {replica.poll()}\n{replica.log_tail()}",
                  file=sys.stderr, flush=True)
            replica.stop(grace_s=0.0, unload_timeout_s=5.0)
            return 1
    print(f"replica draining: grace {args.drain_grace_s:.1f}s", flush=True)
    code = replica.stop()
    if replica.killed:
        print("replica: tritonserver did not finish unloading the model after the drain; killed it",
              file=sys.stderr, flush=True)
    print(f"replica stopped: drained={replica.drained} tritonserver exit code {code}", flush=True)
    return 0 if replica.drained else 1


if __name__ == "__main__":
    sys.exit(main())
