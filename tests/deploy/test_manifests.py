"""deploy/k8s: each overlay renders offline and every object is valid Kubernetes.

`kubectl kustomize` renders the overlays (no cluster needed); kubernetes-validate checks every
object against the Kubernetes API's JSON schemas in strict mode (an unknown or misspelt field
is an error, not silently dropped), for the oldest Kubernetes the manifests claim (1.29) and the
newest the package knows. The rest checks what the manifests promise: web readiness without
replicas, one beat, node agents on GPU nodes, the images per role, the Secret's keys, and that
every setting they pass is one the platform reads.
"""
from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tests.deploy.rendering import (
    DEPLOY,
    OVERLAYS,
    REPO,
    container,
    containers,
    env_value,
    find,
    generated,
    pod_spec,
    render_overlay,
    workloads,
)

KUBERNETES_VERSIONS = ("1.29.0", latest_version())


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render_overlay(name) for name in OVERLAYS}


def _platform_containers(objects: list[dict]):
    for obj in workloads(objects):
        for c in containers(obj):
            if "llm-platform" in c["image"]:
                yield obj, c


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schema(rendered, overlay, version):
    objects = rendered[overlay]
    assert len(objects) >= 12
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_refuses_a_misspelt_field(rendered):
    """Negative control: the validator does reject what a cluster would reject or drop."""
    web = copy.deepcopy(find(rendered["gpu"], "Deployment", "llm-platform-web"))
    web["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBERNETES_VERSIONS[0], strict=True)
    probe = copy.deepcopy(find(rendered["gpu"], "Deployment", "llm-platform-web"))
    container(probe, "web")["readinessProbe"]["periodSeconds"] = "often"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(probe, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_web_readiness_does_not_depend_on_replicas(rendered, overlay):
    objects = rendered[overlay]
    web = container(find(objects, "Deployment", "llm-platform-web"), "web")
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz/web"
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    allowed = generated(objects, "ConfigMap", "llm-platform-config")["data"]["ALLOWED_HOSTS"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        host = {h["name"]: h["value"] for h in web[probe]["httpGet"]["httpHeaders"]}["Host"]
        assert host in allowed.split(","), f"{probe} sends Host {host}, not in ALLOWED_HOSTS"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_web_is_autoscaled_and_protected_from_disruption(rendered, overlay):
    objects = rendered[overlay]
    web = find(objects, "Deployment", "llm-platform-web")
    pod_labels = web["spec"]["template"]["metadata"]["labels"]
    hpa = find(objects, "HorizontalPodAutoscaler", "llm-platform-web")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "llm-platform-web"}
    assert container(web, "web")["resources"]["requests"]["cpu"]  # CPU utilisation needs it
    pdb = find(objects, "PodDisruptionBudget", "llm-platform-web")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = find(objects, "Service", "llm-platform-web")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) in [p["port"] for p in service["spec"]["ports"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_celery_beat_is_one_replica_never_two(rendered, overlay):
    beat = find(rendered[overlay], "Deployment", "llm-platform-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"
    assert not [o for o in rendered[overlay] if o["kind"] == "HorizontalPodAutoscaler"
                and o["spec"]["scaleTargetRef"]["name"] == "llm-platform-beat"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_web_pod_replays_its_own_usage_outbox(rendered, overlay):
    objects = rendered[overlay]
    web = find(objects, "Deployment", "llm-platform-web")
    outbox = generated(objects, "ConfigMap", "llm-platform-config")["data"]["BILLING_OUTBOX_DIR"]
    consumer = container(web, "billing-consumer")
    assert consumer["command"][:3] == ["python", "manage.py", "billingconsumer"]

    def volume_holding(c: dict) -> str:
        mounts = [m for m in c["volumeMounts"] if outbox.startswith(m["mountPath"] + "/")]
        assert len(mounts) == 1, c["name"]
        return mounts[0]["name"]

    assert volume_holding(container(web, "web")) == volume_holding(consumer)


def test_gpu_node_agents_hold_a_gpu_on_gpu_nodes(rendered):
    agent = find(rendered["gpu"], "DaemonSet", "llm-platform-node-agent")
    spec = pod_spec(agent)
    assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        spec["tolerations"]
    main = container(agent, "node-agent")
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert env_value(main, "REPLICA_DEVICE") == "cuda"
    assert main["image"].rsplit(":", 1)[0].endswith("node-cuda")
    assert spec["terminationGracePeriodSeconds"] >= 60  # the agent drains its replicas
    fields = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
              for e in main["env"]}
    assert fields["NODE_NAME"] == "spec.nodeName"
    assert fields["NODE_ADDRESS"] == "status.podIP"


def test_cpu_demo_node_agents_run_the_engine_on_the_cpu(rendered):
    agent = find(rendered["cpu-demo"], "DaemonSet", "llm-platform-node-agent")
    main = container(agent, "node-agent")
    assert "nvidia.com/gpu" not in main["resources"].get("limits", {})
    assert env_value(main, "REPLICA_DEVICE") in (None, "cpu")
    assert main["image"].rsplit(":", 1)[0] == "llm-platform-node"


IMAGES = {  # overlay -> role -> image name (the last path segment, no tag)
    "cpu-demo": {"web": "llm-platform-web", "worker": "llm-platform-worker",
                 "node": "llm-platform-node"},
    "gpu": {"web": "web", "worker": "worker", "node": "node-cuda"},
}
ROLES = {("llm-platform-web", "web"): "web", ("llm-platform-web", "billing-consumer"): "worker",
         ("llm-platform-worker", "worker"): "worker", ("llm-platform-beat", "beat"): "worker",
         ("llm-platform-migrate", "migrate"): "worker",
         ("llm-platform-node-agent", "node-agent"): "node"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_role_runs_its_own_image(rendered, overlay):
    images = {(obj["metadata"]["name"], c["name"]): c["image"].rsplit(":", 1)[0].rsplit("/", 1)[-1]
              for obj, c in _platform_containers(rendered[overlay])}
    assert set(images) == set(ROLES)
    for key, role in ROLES.items():
        assert images[key] == IMAGES[overlay][role], key


def test_demo_secret_has_every_key_the_pods_require(rendered):
    objects = rendered["cpu-demo"]
    secret = generated(objects, "Secret", "llm-platform-secrets")
    for _, c in _platform_containers(objects):
        for item in c.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == secret["metadata"]["name"]
                assert ref.get("optional") or ref["key"] in secret["data"], ref["key"]


# Read by harden-access's production settings (merged separately from this branch).
PRODUCTION_SETTINGS = {"CSRF_TRUSTED_ORIGINS", "CSRF_COOKIE_SECURE", "SECURE_PROXY_SSL_HEADER",
                       "METRICS_TOKEN", "REPLICA_SECRET"}
READ_PATTERNS = (
    re.compile(r"env_[a-z]+\(\s*\"([A-Z][A-Z0-9_]+)\""),
    re.compile(r"environ(?:\.get\(|\[)\s*\"([A-Z][A-Z0-9_]+)\""),
    re.compile(r"\benv(?:\.get\(|\[)\s*\"([A-Z][A-Z0-9_]+)\""),
    re.compile(r"\$\{([A-Z][A-Z0-9_]+)"),
)


def _names_read_by_the_platform() -> set[str]:
    sources = [REPO / "manage.py", *DEPLOY.joinpath("bin").iterdir()]
    for package in ("llm_platform", "common", "tenants", "models_registry", "billing", "inference", "fleet",
                    "rollouts",
                    "consoles", "dashboard", "replica"):
        sources += (REPO / package).rglob("*.py")
    names = set()
    for path in sources:
        text = path.read_text()
        for pattern in READ_PATTERNS:
            names.update(pattern.findall(text))
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_setting_passed_is_one_the_platform_reads(rendered, overlay):
    """A misspelt name would be silently ignored and the default used instead."""
    objects = rendered[overlay]
    read = _names_read_by_the_platform() | PRODUCTION_SETTINGS
    config = generated(objects, "ConfigMap", "llm-platform-config")["data"]
    assert set(config) - read == set()
    for obj, c in _platform_containers(objects):
        used_by_command = set(re.findall(r"\$\(([A-Z_]+)\)", " ".join(c.get("command", []))))
        passed = {item["name"] for item in c.get("env", [])} - used_by_command
        assert passed - read == set(), (obj["metadata"]["name"], c["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_platform_pods_reach_the_replicas(rendered, overlay):
    objects = rendered[overlay]
    policy = find(objects, "NetworkPolicy", "llm-platform-node-agent")
    agent_labels = find(objects, "DaemonSet", "llm-platform-node-agent")["spec"]["template"][
        "metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= agent_labels.items()
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    for name in ("llm-platform-web", "llm-platform-worker"):
        labels = find(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert allowed.items() <= labels.items(), name


def test_demo_migrate_job_also_seeds_the_demo_fleet(rendered):
    job = find(rendered["cpu-demo"], "Job", "llm-platform-migrate")
    command = " ".join(container(job, "migrate")["command"])
    assert "migrate --noinput" in command and "seeddemo" in command
    gpu_job = find(rendered["gpu"], "Job", "llm-platform-migrate")
    assert container(gpu_job, "migrate")["command"] == ["python", "manage.py", "migrate",
                                                        "--noinput"]
