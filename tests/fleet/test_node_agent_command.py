"""The node agent's replica command line carries the version's quantisation, and replica.launch
accepts every value the registry may hold (pure: parses the arguments, starts nothing)."""
import pytest

from fleet.node_agent import launch_command
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


def test_int4_is_refused_by_the_launcher():
    command = launch_command("chat-small", "/w.gguf", "int4", (1, 2, 3), 1, 5.0)
    with pytest.raises(Exception, match="int4"):
        quantization_arg(command[command.index("--quantization") + 1])
