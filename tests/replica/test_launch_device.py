"""replica.launch's device: --device, else REPLICA_DEVICE (a GPU node's agent sets it, and the
replicas it starts inherit its environment), else cpu."""
import pytest

from replica.launch import parse_args

ARGS = ["--model", "m", "--grpc-port", "1", "--http-port", "2", "--metrics-port", "3"]


def test_cpu_without_flag_or_environment(monkeypatch):
    monkeypatch.delenv("REPLICA_DEVICE", raising=False)
    assert parse_args(ARGS).device == "cpu"


def test_environment_sets_the_default_and_the_flag_wins(monkeypatch):
    monkeypatch.setenv("REPLICA_DEVICE", "cuda")
    assert parse_args(ARGS).device == "cuda"
    assert parse_args([*ARGS, "--device", "cpu"]).device == "cpu"


def test_an_unknown_device_in_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("REPLICA_DEVICE", "gpu")
    with pytest.raises(SystemExit):
        parse_args(ARGS)
