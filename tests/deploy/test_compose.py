"""deploy/compose.yaml: the platform on one GPU host.

No `docker compose` on these machines: the file is interpolated the way Compose does it (its
`${VAR}`, `${VAR:-default}` and `${VAR:?error}` forms), its YAML merge keys resolved, and the
result parsed by compose-spec (a strict Compose Specification parser: unknown keys, bad
durations, bad GPU reservations are errors). The rest checks what the file promises.
"""
from __future__ import annotations

import copy
import json
import re

import pytest
import yaml
from compose_spec import PyCompose

from tests.deploy.rendering import DEPLOY, container, find, render_overlay

COMPOSE = DEPLOY / "compose.yaml"
ENV_EXAMPLE = DEPLOY / "compose.env.example"
REQUIRED = {"SECRET_KEY": "s" * 24 + "0123456789abcdef", "POSTGRES_PASSWORD": "pw"}
VARIABLE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)(?:(:?)([-?])([^{}]*))?\}")


class MissingVariable(Exception):
    pass


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation, innermost first (defaults may hold variables)."""
    while True:
        match = VARIABLE.search(text)
        if match is None:
            return text
        name, colon, op, arg = match.groups()
        value = env.get(name)
        unset = value is None or (colon == ":" and value == "")
        if op == "-" and unset:
            value = arg
        elif op == "?" and unset:
            raise MissingVariable(f"{name}: {arg}")
        text = text[:match.start()] + (value or "") + text[match.end():]


def load(env: dict[str, str]) -> dict:
    data = yaml.safe_load(interpolate(COMPOSE.read_text(), env))  # merge keys resolved here
    return {key: value for key, value in data.items() if not key.startswith("x-")}


def parse(data: dict) -> PyCompose:
    return PyCompose.from_json(json.dumps(data))


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(REQUIRED)


def test_the_file_is_a_valid_compose_specification(compose):
    parsed = parse(compose)
    parsed.validate()
    parsed.to_spec()  # the Compose Specification's own schema too (a pydantic model of it)
    assert set(parsed.service_names()) == {"postgres", "redis", "migrate", "web",
                                                  "billing-consumer", "worker", "beat",
                                                  "node-agent"}


def test_references_resolve(compose):
    """What compose-spec's validate() leaves to `docker compose config`."""
    services = compose["services"]
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services), name
        for mount in service.get("volumes", []):
            source = mount.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], (name, source)


def test_the_parser_refuses_what_compose_would():
    """Negative control: an unknown key and a malformed GPU reservation are errors."""
    data = load(REQUIRED)
    unknown = copy.deepcopy(data)
    unknown["services"]["web"]["healthchek"] = {}
    with pytest.raises(ValueError):
        parse(unknown)
    gpus = copy.deepcopy(data)
    gpus["services"]["node-agent"]["deploy"]["resources"]["reservations"]["devices"][0][
        "count"] = "one"
    with pytest.raises(ValueError):
        parse(gpus)


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_secrets_have_no_default(name):
    with pytest.raises(MissingVariable, match=name):
        load({key: value for key, value in REQUIRED.items() if key != name})


def test_every_variable_without_a_default_is_in_the_env_example():
    text = COMPOSE.read_text()
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M))
    for name, _, op, _ in VARIABLE.findall(text):
        if op != "-":
            assert name in documented, name


def test_the_node_agent_holds_a_gpu_and_runs_the_cuda_image(compose):
    agent = compose["services"]["node-agent"]
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert agent["build"]["target"] == "node-cuda"
    assert agent["environment"]["REPLICA_DEVICE"] == "cuda"
    assert agent["command"] == ["/app/deploy/bin/node-agent"]


def test_web_readiness_and_the_shared_outbox(compose):
    services = compose["services"]
    assert "/readyz/web" in " ".join(services["web"]["healthcheck"]["test"])
    outbox = services["web"]["environment"]["BILLING_OUTBOX_DIR"]
    for name in ("web", "billing-consumer"):
        assert f"outbox:{outbox}" in services[name]["volumes"], name


def test_platform_services_start_after_migrations(compose):
    services = compose["services"]
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "billing-consumer", "worker", "beat", "node-agent"):
        condition = services[name]["depends_on"]["migrate"]["condition"]
        assert condition == "service_completed_successfully", name


def test_roles_run_the_same_commands_as_on_kubernetes(compose):
    objects = render_overlay("gpu")
    services = compose["services"]
    pairs = {"web": ("llm-platform-web", "web"), "worker": ("llm-platform-worker", "worker"),
             "beat": ("llm-platform-beat", "beat"),
             "node-agent": ("llm-platform-node-agent", "node-agent")}
    for service, (workload, name) in pairs.items():
        kind = "DaemonSet" if service == "node-agent" else "Deployment"
        assert services[service]["command"] == container(find(objects, kind, workload),
                                                          name)["command"], service
