"""GPU discovery for the node agent: which GPUs this node has, reported when it registers.

NVML through `nvidia-ml-py` (module `pynvml`) first; when that is not installed or finds no
driver, `nvidia-smi --query-gpu`; neither -> no GPUs (a CPU node). `NODE_GPUS=none` turns
discovery off (a GPU machine serving on its CPUs); `CUDA_VISIBLE_DEVICES` limits what the agent
may hand out, as it limits the processes it starts.
"""
from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import asdict, dataclass

logger = logging.getLogger(__name__)
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total",
                    "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class Gpu:
    index: int  # as CUDA_VISIBLE_DEVICES names it
    uuid: str
    name: str
    memory_mib: int

    def as_dict(self) -> dict:
        return asdict(self)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, uuid, name, memory = fields
        gpus.append(Gpu(int(index), uuid, name, int(float(memory))))
    return gpus


def visible(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES (indexes or UUIDs) leaves to this agent; unset: all."""
    if cuda_visible_devices is None:
        return gpus
    wanted = [d.strip() for d in cuda_visible_devices.split(",") if d.strip()]
    return [g for g in gpus if str(g.index) in wanted or g.uuid in wanted]


def _from_nvml() -> list[Gpu] | None:
    try:
        import pynvml  # noqa: PLC0415 - optional: nvidia-ml-py, on GPU nodes only
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        logger.info("NVML found no driver (%s)", exc)
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid, name = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
            gpus.append(Gpu(index, uuid.decode() if isinstance(uuid, bytes) else uuid,
                            name.decode() if isinstance(name, bytes) else name,
                            pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _from_nvidia_smi() -> list[Gpu] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        logger.info("nvidia-smi failed: %s", done.stderr.strip()[:200])
        return None
    return parse_nvidia_smi(done.stdout)


def discover(env: dict[str, str]) -> list[Gpu]:
    """This node's GPUs (see the module doc); [] on a CPU node."""
    if env.get("NODE_GPUS", "").lower() == "none":
        return []
    gpus = _from_nvml()
    if gpus is None:
        gpus = _from_nvidia_smi() or []
    return visible(gpus, env.get("CUDA_VISIBLE_DEVICES"))
