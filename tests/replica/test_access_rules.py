"""Replica access rules without a server: the token, Triton's flags, what a launcher refuses,
and what a node agent passes to its replicas (pure: nothing is started)."""
import os

import pytest

from fleet.node_agent import (
    AgentConfig,
    default_bind_address,
    launch_command,
    replica_environment,
)
from replica.access import (
    GRPC_HEADER,
    RESTRICTED_GROUPS,
    TOKEN_ENV,
    access_token,
    check_bind,
    grpc_headers,
    server_flags,
)
from replica.launch import parse_args, spec_from_args
from replica.replica_process import ReplicaProcess, ReplicaSpec


def test_the_token_is_derived_hex_and_never_the_secret():
    token = access_token("platform secret")
    assert token == access_token("platform secret") != access_token("another secret")
    assert len(token) == 64 and int(token, 16) >= 0
    assert "platform secret" not in token
    assert access_token("") == ""


def test_server_flags_restrict_every_group_but_health():
    assert "health" not in RESTRICTED_GROUPS and "inference" in RESTRICTED_GROUPS
    grpc_flag, http_flag = server_flags("ab12")
    assert grpc_flag == f"--grpc-restricted-protocol={','.join(RESTRICTED_GROUPS)}:llmp-replica-token=ab12"
    assert http_flag.startswith("--http-restricted-api=") and http_flag.endswith(":llmp-replica-token=ab12")
    assert server_flags("") == []
    with pytest.raises(ValueError):
        server_flags("a,b=c")


def test_grpc_headers_carry_the_token():
    assert grpc_headers("ab12") == {GRPC_HEADER: "ab12"}
    assert GRPC_HEADER == GRPC_HEADER.lower()  # HTTP/2 metadata keys are lowercase
    assert grpc_headers("") is None


@pytest.mark.parametrize("address", ["0.0.0.0", "10.1.2.3", "::", "replica.example.com"])
def test_no_token_binds_loopback_only(address):
    with pytest.raises(ValueError, match="without a replica access token"):
        check_bind(address, "")
    check_bind(address, "ab12")
    check_bind("127.0.0.1", "")
    check_bind("::1", "")


def test_a_replica_without_a_token_refuses_to_listen_beyond_this_host():
    replica = ReplicaProcess(ReplicaSpec("m", 1, 2, 3, bind_address="0.0.0.0"))
    with pytest.raises(ValueError):
        replica.start()
    assert replica.pid is None  # nothing was spawned


def test_the_launcher_takes_the_token_from_its_environment_only():
    args = parse_args(["--model", "m", "--grpc-port", "1", "--http-port", "2",
                       "--metrics-port", "3", "--bind-address", "10.0.0.7"])
    spec = spec_from_args(args, {TOKEN_ENV: "ab12"})
    assert spec.bind_address == "10.0.0.7" and spec.access_token == "ab12"
    assert "ab12" not in repr(spec)
    assert spec_from_args(parse_args(["--model", "m", "--grpc-port", "1", "--http-port", "2",
                                      "--metrics-port", "3"]), {}).bind_address == "127.0.0.1"


def test_the_agent_binds_its_ip_address_or_loopback():
    assert default_bind_address("10.0.0.7") == "10.0.0.7"
    assert default_bind_address("127.0.0.1") == "127.0.0.1"
    assert default_bind_address("node-a.internal") == "127.0.0.1"
    config = AgentConfig.from_env({"NODE_NAME": "a", "NODE_ADDRESS": "node-a",
                                   "NODE_BIND_ADDRESS": "0.0.0.0"}, access_token="ab12")
    assert config.bind_address == "0.0.0.0" and "ab12" not in repr(config)


def test_the_agent_passes_the_token_in_the_environment_not_the_command_line():
    command = launch_command("m", "/w.gguf", "", (1, 2, 3), 1, 5.0, "10.0.0.7")
    assert command[command.index("--bind-address") + 1] == "10.0.0.7"
    env = replica_environment({"PATH": os.environ.get("PATH", ""), "SECRET_KEY": "s",
                               "REPLICA_SECRET": "r", "DATABASE_URL": "postgres://u:p@h/d",
                               TOKEN_ENV: "stale"}, "ab12")
    assert env[TOKEN_ENV] == "ab12"
    assert not {"SECRET_KEY", "REPLICA_SECRET", "DATABASE_URL"} & set(env)
    assert "ab12" not in " ".join(command)
    assert TOKEN_ENV not in replica_environment({}, "")


def test_replicatoken_prints_the_platform_token(settings, capsys):
    from django.core.management import call_command

    call_command("replicatoken")
    assert capsys.readouterr().out.strip() == settings.REPLICA_ACCESS_TOKEN == access_token(
        settings.REPLICA_SECRET)
