"""What the deploy tests share: rendering the kustomize overlays and walking their objects."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("cpu-demo", "gpu")


def kustomize(path: Path) -> list[dict]:
    """`kubectl kustomize PATH` (offline: kustomize is built into kubectl), as objects."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render deploy/k8s (it is on the dev and CI machines)"
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_overlay(name: str) -> list[dict]:
    return kustomize(DEPLOY / "k8s" / "overlays" / name)


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def generated(objects: list[dict], kind: str, prefix: str) -> dict:
    """A generated ConfigMap or Secret (kustomize appends a content hash to its name)."""
    matches = [o for o in objects if o["kind"] == kind
               and o["metadata"]["name"].startswith(prefix + "-")]
    assert len(matches) == 1, f"{kind}/{prefix}-*: {len(matches)} found"
    return matches[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def workloads(objects: list[dict]) -> Iterator[dict]:
    for obj in objects:
        if obj["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}:
            yield obj


def containers(obj: dict) -> list[dict]:
    spec = pod_spec(obj)
    return spec.get("initContainers", []) + spec["containers"]


def container(obj: dict, name: str) -> dict:
    matches = [c for c in containers(obj) if c["name"] == name]
    assert len(matches) == 1, f"container {name}: {len(matches)} found"
    return matches[0]


def env_value(c: dict, name: str) -> str | None:
    for item in c.get("env", []):
        if item["name"] == name:
            return item.get("value")
    return None
