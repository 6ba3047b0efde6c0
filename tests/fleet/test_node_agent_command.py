"""The node agent's replica command line carries the version's quantisation, and replica.launch
accepts every value the registry may hold (pure: parses the arguments, starts nothing)."""
import pytest

from fleet.node_agent import launch_command, replica_threads
from replica.launch import quantization_arg


@pytest.mark.parametrize("stored, passed, engine", [
    ("int8", "int8", "int8"),
    ("", "none", "none"),
    ("Q4_1", "Q4_1", "none"),  # the GGUF file's own type: served as stored, no extra step
])
def test_quantization_reaches_the_launcher(stored, passed, engine):
    command = launch_command("chat-small", "/w.gguf", stored, (1, 2, 3), 1, 5.0)
    value = command[command.index("--quantization") + 1]
    assert value == passed
    assert quantization_arg(value) == engine
    assert command[command.index("--grpc-port") + 1] == "1"
    assert command[command.index("--metrics-port") + 1] == "3"


def test_int4_reaches_the_launcher_and_unknown_values_are_refused():
    command = launch_command("chat-small", "/w.gguf", "int4", (1, 2, 3), 1, 5.0)
    assert quantization_arg(command[command.index("--quantization") + 1]) == "int4"
    with pytest.raises(Exception, match="fp8"):
        quantization_arg("fp8")


@pytest.mark.parametrize("configured, cpu_slots, threads", [(0, 2, 2), (0, 1, 1), (0, 0, 1), (3, 1, 3)])
def test_replica_threads_are_its_reserved_cpu_slots_unless_set(configured, cpu_slots, threads):
    assert replica_threads(configured, cpu_slots) == threads
    command = launch_command("chat-small", "/w.gguf", "", (1, 2, 3), replica_threads(configured, cpu_slots), 5.0)
    assert command[command.index("--num-threads") + 1] == str(threads)
