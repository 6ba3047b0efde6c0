"""The tensor-parallel process group: the all-reduce of partial sums and the step broadcast.

Two process groups over one TCP store on loopback (all ranks of a replica share a host):
- `control` (gloo, always): rank 0 broadcasts each step's model input as bytes, a header
  `[kind, length]` then the payload. Workers wait in it while the replica is idle, so its
  timeout is long; a dead peer breaks it at once (the TCP connection closes).
- `reduce`: the all-reduce after o_proj and down_proj; gloo on CPUs (summed in float32: one
  rounding into the engine dtype, as the unsplit product rounds once), NCCL on CUDA devices.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch import nn

HOST = "127.0.0.1"
_STEP, _STOP = 1, 2
IDLE_TIMEOUT = datetime.timedelta(days=365)  # workers wait for the next step as long as the replica idles
REDUCE_TIMEOUT = datetime.timedelta(minutes=10)  # one step's collective; a lost peer fails sooner


def open_store(world_size: int, port: int = 0, is_master: bool = False) -> dist.TCPStore:
    """Rank 0: `open_store(N, is_master=True)` listens on a free loopback port (`.port`);
    workers connect with that port."""
    return dist.TCPStore(HOST, port, world_size, is_master, timeout=datetime.timedelta(minutes=10),
                         wait_for_workers=False)


def _gloo(store: dist.Store, prefix: str, rank: int, world_size: int,
          timeout: datetime.timedelta) -> dist.ProcessGroupGloo:
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=HOST)]
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, world_size, options)


class TensorParallelGroup:
    """One rank's end of the replica's groups (no global torch.distributed state)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, device: torch.device) -> None:
        self.rank = rank
        self.world_size = world_size
        self._control = _gloo(store, "control", rank, world_size, IDLE_TIMEOUT)
        if device.type == "cuda":
            self._reduce = dist.ProcessGroupNCCL(dist.PrefixStore("reduce", store), rank, world_size)
            self._reduce_float32 = False
        else:
            self._reduce = _gloo(store, "reduce", rank, world_size, REDUCE_TIMEOUT)
            self._reduce_float32 = True

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of each rank's `partial` (same shape and dtype on every rank)."""
        if self._reduce_float32 and partial.dtype != torch.float32:
            total = partial.float()
            self._reduce.allreduce([total]).wait()
            return total.to(partial.dtype)
        self._reduce.allreduce([partial]).wait()
        return partial

    # --- the step broadcast (rank 0 sends, the workers receive) ------------------------------

    def send_step(self, payload: bytes) -> None:
        self._broadcast_header(_STEP, len(payload))
        self._control.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), 0).wait()

    def send_stop(self) -> None:
        self._broadcast_header(_STOP, 0)

    def receive(self) -> bytes | None:
        """A worker's next step payload; None when rank 0 says stop."""
        header = torch.zeros(2, dtype=torch.int64)
        self._control.broadcast(header, 0).wait()
        kind, length = int(header[0]), int(header[1])
        if kind == _STOP:
            return None
        payload = torch.empty(length, dtype=torch.uint8)
        self._control.broadcast(payload, 0).wait()
        return payload.numpy().tobytes()

    def _broadcast_header(self, kind: int, length: int) -> None:
        self._control.broadcast(torch.tensor([kind, length], dtype=torch.int64), 0).wait()


class AllReduceOutput(nn.Module):
    """A row-parallel projection: this rank's partial product, summed over the ranks."""

    def __init__(self, inner: nn.Module, group: TensorParallelGroup) -> None:
        super().__init__()
        self.inner = inner
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.inner(x))


def install_all_reduce(model: nn.Module, group: TensorParallelGroup) -> None:
    """Wrap every layer's o_proj and down_proj (after loading and quantisation)."""
    for layer in model.model.layers:
        layer.self_attn.o_proj = AllReduceOutput(layer.self_attn.o_proj, group)
        layer.mlp.down_proj = AllReduceOutput(layer.mlp.down_proj, group)
