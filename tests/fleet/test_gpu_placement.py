"""GPU nodes: discovery parsing (recorded nvidia-smi output), placement on free GPUs of one node
(pure logic), the agent's launch of a GPU replica, replica port ranges, and placement on the
real PostgreSQL counting GPU slots and memory."""
import socket
from datetime import datetime, timezone

import pytest

from fleet.gpus import Gpu, parse_nvidia_smi, visible
from fleet.node_agent import AgentConfig, parse_port_range, pick_ports, replica_launch
from replica.launch import parse_args
from fleet.placement import NodeRoom, ReplicaNeed, choose_node, fit, place_replicas
from models_registry.models import Replica
from fleet.nodes import register_node
from models_registry.services import ensure_model_version
from tests.fakes.dispatcher import RecordingDispatcher
from tests.support.billing import priced

T0 = datetime(2026, 11, 2, 0, 0, tzinfo=timezone.utc)
# `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits` on a
# 4-GPU node (recorded).
NVIDIA_SMI_4 = """0, GPU-6c1a1f3e-1b5d-8f4c-2a0e-91d1b7f3c001, NVIDIA H100 80GB HBM3, 81559
1, GPU-6c1a1f3e-1b5d-8f4c-2a0e-91d1b7f3c002, NVIDIA H100 80GB HBM3, 81559
2, GPU-6c1a1f3e-1b5d-8f4c-2a0e-91d1b7f3c003, NVIDIA H100 80GB HBM3, 81559
3, GPU-6c1a1f3e-1b5d-8f4c-2a0e-91d1b7f3c004, NVIDIA H100 80GB HBM3, 81559
"""


def test_nvidia_smi_output_parses_into_gpus():
    gpus = parse_nvidia_smi(NVIDIA_SMI_4)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[2] == Gpu(2, "GPU-6c1a1f3e-1b5d-8f4c-2a0e-91d1b7f3c003", "NVIDIA H100 80GB HBM3", 81559)
    assert parse_nvidia_smi("") == []
    with pytest.raises(ValueError):
        parse_nvidia_smi("No devices were found, sorry")


def test_cuda_visible_devices_limits_the_agents_gpus():
    gpus = parse_nvidia_smi(NVIDIA_SMI_4)
    assert [g.index for g in visible(gpus, "1,3")] == [1, 3]
    assert [g.index for g in visible(gpus, gpus[2].uuid)] == [2]
    assert visible(gpus, "") == [] and visible(gpus, None) == gpus


def test_agent_reports_discovered_gpus_and_calls_itself_a_gpu_node():
    gpus = parse_nvidia_smi(NVIDIA_SMI_4)
    config = AgentConfig.from_env({"NODE_NAME": "g1", "NODE_ADDRESS": "10.0.0.7"}, gpus=gpus)
    assert config.accelerator == "gpu" and len(config.gpus) == 4
    cpu = AgentConfig.from_env({"NODE_NAME": "c1", "NODE_GPUS": "none"})
    assert cpu.accelerator == "cpu" and cpu.gpus == ()


def room(name, zone="z", gpus=(), slots=0, memory=65536, mine=0):
    return NodeRoom(node_id=hash(name) % 1000, name=name, zone=zone, free_cpu_slots=slots,
                    free_memory_mib=memory, num_version_replicas=mine, free_gpus=tuple(gpus),
                    has_gpus=bool(gpus))


def test_a_replica_takes_that_many_free_gpus_of_one_node_each_holding_its_share():
    need = ReplicaNeed(devices=2, device_memory_mib=40000)
    # g1 has 3 free GPUs but only one big enough; g2 has two that fit.
    g1 = room("g1", gpus=[(0, 81559), (1, 24000), (2, 24000)])
    g2 = room("g2", gpus=[(1, 81559), (3, 81559)])
    assert fit(g1, need) is None
    chosen = choose_node([g1, g2], need, {})
    assert chosen.room.name == "g2" and chosen.gpu_indices == (1, 3) and chosen.cpu_slots == 0
    # Two GPUs never come from two nodes: one free GPU on each is no room.
    assert choose_node([room("h1", gpus=[(0, 81559)]), room("h2", gpus=[(0, 81559)])], need, {}) is None


def test_gpu_and_cpu_versions_go_to_their_kind_of_node():
    gpu_node = room("g", gpus=[(0, 81559)])
    cpu_node = room("c", slots=4)
    assert choose_node([gpu_node, cpu_node], ReplicaNeed(accelerator="gpu"), {}).room.name == "g"
    assert choose_node([gpu_node, cpu_node], ReplicaNeed(accelerator="cpu"), {}).room.name == "c"
    # A tensor-parallel replica on CPUs is one process per rank: it reserves slots per device.
    tp_cpu = fit(cpu_node, ReplicaNeed(cpu_slots=2, devices=2, accelerator="cpu"))
    assert tp_cpu.cpu_slots == 4 and tp_cpu.gpu_indices == ()
    assert fit(cpu_node, ReplicaNeed(cpu_slots=3, devices=2)) is None
    assert fit(room("small", gpus=[(0, 81559)], memory=512), ReplicaNeed(memory_mib=1024)) is None


def test_gpu_placement_spreads_zones_before_packing():
    need = ReplicaNeed(devices=1, device_memory_mib=1000)
    rooms = [room("a", "zone-a", gpus=[(0, 8000), (1, 8000)], mine=1),
             room("b", "zone-b", gpus=[(0, 8000)])]
    assert choose_node(rooms, need, {"zone-a": 1}).room.name == "b"


def test_the_agent_launches_a_gpu_replica_on_its_gpus_with_its_kv_cache():
    command, env = replica_launch(gpu_indices=[2, 3], kv_cache_mib=512, tensor_parallel_degree=2)
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert command[command.index("--device") + 1] == "cuda"
    assert command[command.index("--kv-cache-bytes") + 1] == str(512 * 2**20)
    assert command[command.index("--tensor-parallel-degree") + 1] == "2"
    command, env = replica_launch(gpu_indices=[], kv_cache_mib=0, tensor_parallel_degree=1)
    assert command == [] and env == {}  # a CPU replica: the launcher's own defaults
    # replica.launch takes what a single-device GPU replica is given.
    command, _ = replica_launch(gpu_indices=[0], kv_cache_mib=256, tensor_parallel_degree=1)
    args = parse_args(["--model", "m", "--grpc-port", "1", "--http-port", "2",
                       "--metrics-port", "3", *command])
    assert (args.device, args.kv_cache_bytes) == ("cuda", 256 * 2**20)


def test_replica_ports_come_from_the_configured_range():
    assert parse_port_range("") is None and parse_port_range("20000-20099") == (20000, 20099)
    for bad in ("20000", "20099-20000", "a-b", "0-10", "1-70000"):
        with pytest.raises(ValueError):
            parse_port_range(bad)
    with socket.socket() as held:  # a port in use on this host is never handed out
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        low, high = max(1024, busy - 6), min(65535, busy + 6)
        taken = {low, low + 1}  # the agent's other replicas
        ports = pick_ports(3, "127.0.0.1", (low, high), taken, start=low)
        assert len(set(ports)) == 3 and all(low <= p <= high for p in ports)
        assert not (set(ports) & (taken | {busy})) and ports == sorted(ports)  # from `start` up
        # From `start`, wrapping around: the only two ports left are the top and the bottom.
        rest = set(range(low + 1, high))
        assert pick_ports(2, "127.0.0.1", (low, high), rest, start=high) == [high, low]
        with pytest.raises(OSError, match="REPLICA_PORT_RANGE"):
            pick_ports(1, "127.0.0.1", (busy, busy), set())


def test_off_loopback_the_node_address_is_required():
    with pytest.raises(ValueError, match="NODE_ADDRESS"):
        AgentConfig.from_env({"NODE_NAME": "a", "NODE_BIND_ADDRESS": "0.0.0.0", "NODE_GPUS": "none"})
    config = AgentConfig.from_env({"NODE_NAME": "a", "NODE_ADDRESS": "10.0.0.7", "NODE_GPUS": "none",
                                   "REPLICA_PORT_RANGE": "20000-20999"})
    assert config.bind_address == "10.0.0.7" and config.port_range == (20000, 20999)


@pytest.mark.django_db(transaction=True)
def test_placement_counts_gpu_slots_and_memory_on_the_real_registry():
    version = priced(ensure_model_version("big", 1, "fake", tokenizer="bytes"))
    version.tensor_parallel_degree, version.weights_memory_mib, version.kv_cache_mib = 2, 60000, 20000
    version.hardware = {"accelerator": "gpu"}
    version.save()
    gpus = [g.as_dict() for g in parse_nvidia_smi(NVIDIA_SMI_4)]
    register_node("g1", zone="z", address="10.0.0.7", cpu_slots=2, memory_mib=65536,
                  accelerator="gpu", now=T0, gpus=gpus)
    register_node("c1", zone="z", address="10.0.0.8", cpu_slots=8, memory_mib=65536,
                  accelerator="cpu", now=T0)
    dispatcher = RecordingDispatcher()
    placed = place_replicas(version, 3, now=T0, reason="test", dispatcher=dispatcher, lost_after_s=15)
    # Four GPUs, two per replica: two replicas, 40000 MiB on each of their GPUs; none on the CPU node.
    assert [(r.node.name, r.gpu_indices, r.gpu_memory_mib) for r in placed] == [
        ("g1", [0, 1], 40000), ("g1", [2, 3], 40000)]
    # A stopped replica gives its GPUs back.
    Replica.objects.filter(pk=placed[0].pk).update(state="stopped")
    again = place_replicas(version, 1, now=T0, reason="test", dispatcher=dispatcher, lost_after_s=15)
    assert [r.gpu_indices for r in again] == [[0, 1]]
