"""The platform across hosts: each host is a network namespace (tests/support/netns.py).

- control (the root namespace, on the bridge's first address): PostgreSQL and Redis, published
  on that address by a TCP forwarder (they listen on loopback only), and the control loops
  Celery beat runs (lost-node check, autoscaler), ticked by the test;
- web: daphne, the API, reaching the stores and the replicas by address;
- node-a (zone-a) and node-b (zone-b): one node agent each, whose replicas bind the node's
  address and take ports from REPLICA_PORT_RANGE.

The weights are served over https from the control host (a private CA): registration stores
the tokenizer in the registry, so the web host never has the weights, and each node downloads
them once into its own cache (no host reads another's files).

Requests sent to the web host stream from replicas on both nodes. Then node-a's link is cut
(`ip link set ... down`: packets vanish, nothing is reset): its node is presumed lost, its
replica failed and re-placed on node-b, and no request that had not started streaming is lost.
The re-placement time (cut -> replacement ready) is written to var/test-logs/multihost.json.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import httpx
import pytest
from django.conf import settings
from django.db import connection

from fleet.models import ReplicaTransition
from models_registry.models import Node, Replica, ScalingPolicy, StoredTokenizer
from models_registry.services import ensure_model_version, store_remote_tokenizer
from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import LOG_DIR, SMOLLM2_WEIGHTS, platform_env
from tests.support.billing import priced
from inference.tokenization import resolve_weights
from llm_platform.web_processes import APPLICATION, single_endpoint
from replica.weights_cache import cached_path
from tests.support.fleet import Control, Load, kill_replica_servers
from tests.support.https_files import HttpsFiles
from tests.support.netns import Network, netns_unavailable
from tests.support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
LOST_AFTER_S = 4.0
WEB_PORT = 8000
PORT_RANGE = "20100-20199"


def _successes(replica: Replica) -> int:
    """Requests the replica's Triton answered (its warm-up included), read from its metrics
    port by address."""
    text = httpx.get(f"http://{replica.metrics_address}/metrics", timeout=5).text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("nv_inference_request_success{"))


def _on(address: str, url: str) -> str:
    """`url` (a loopback store URL of this test run) with its host replaced by `address`."""
    return url.replace("127.0.0.1", address).replace("localhost", address)


@pytest.fixture
def network():
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"multi-host test skipped: {reason}")
    net = Network(["web", "node-a", "node-b"])
    try:
        yield net.up()
    finally:
        net.down()  # also what a failed `up` made


@pytest.fixture
def weights_server(network, tmp_path):
    """The SmolLM2 GGUF over https on the control host's address: (URL, SHA-256, CA file)."""
    root, certs = tmp_path / "www", tmp_path / "certs"
    root.mkdir()
    certs.mkdir()
    gguf = resolve_weights(SMOLLM2_WEIGHTS)
    (root / gguf.name).symlink_to(gguf)
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    with HttpsFiles(root, certs, host=network.control_address) as files:
        yield f"{files.base_url}/{gguf.name}", sha, str(files.ca_file), files


def test_requests_stream_from_two_hosts_and_a_cut_node_is_replaced(transactional_db, network,
                                                                    weights_server, tmp_path,
                                                                    monkeypatch):
    run = settings.REDIS_KEY_PREFIX.strip(":").split("-")[-1]
    control_host = network.control_address
    weights_url, sha, ca_file, files = weights_server
    db = connection.settings_dict
    forward = network.start(None, "mh-forward", [
        "-m", "tests.support.tcp_forward",
        f"{control_host}:{db['PORT'] or 5432}={db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}",
        f"{control_host}:6379=127.0.0.1:6379"], {}, LOG_DIR)
    procs = [forward]
    version = priced(ensure_model_version("chat-small", 1, weights_url, weights_sha256=sha,
                                          context_length=8192))
    monkeypatch.setenv("WEIGHTS_CA_FILE", ca_file)  # registration, on the control host
    monkeypatch.setenv("WEIGHTS_CACHE_DIR", str(tmp_path / "cache-control"))
    store_remote_tokenizer(version)
    version.refresh_from_db()  # stored in the registry, not just set on this object
    assert version.tokenizer == "stored" and StoredTokenizer.objects.filter(
        model_version=version).exists()
    ScalingPolicy.objects.create(model_version=version, min_replicas=2, max_replicas=2,
                                 predictive=False, replica_cpu_slots=1, replica_memory_mib=1024)
    api_key = create_api_key(create_tenant("multihost", "interactive")).raw_key
    web = network.addresses["web"]
    local = platform_env()
    env = platform_env(
        DATABASE_URL=_on(control_host, local["DATABASE_URL"]),
        REDIS_URL=_on(control_host, local["REDIS_URL"]),
        CELERY_BROKER_URL=_on(control_host, local["CELERY_BROKER_URL"]),
        ALLOWED_HOSTS=web, REPLICA_PORT_RANGE=PORT_RANGE,
        # a replica behind a cut link never answers: give up on it soon and try another
        TRITON_FIRST_TOKEN_TIMEOUT_SECONDS="20", TRITON_TOKEN_TIMEOUT_SECONDS="20")
    nodes = {"node-a": ("zone-a", f"{run}-a"), "node-b": ("zone-b", f"{run}-b")}
    control = Control(LOST_AFTER_S)
    load = Load(f"http://{web}:{WEB_PORT}", {"Authorization": f"Bearer {api_key}"})
    threads = [threading.Thread(target=load.run, daemon=True) for _ in range(3)]
    try:
        wait_until(lambda: "forwarding" in forward.log_tail(), forward, 30, "forwarding")
        procs.append(network.start("web", "mh-daphne", [
            "-m", "llm_platform.server", "-e", single_endpoint(web, WEB_PORT),
            APPLICATION], env, LOG_DIR))
        for host, (zone, name) in nodes.items():
            procs.append(network.start(host, f"mh-agent-{host}", [
                "manage.py", "nodeagent", "--name", name, "--zone", zone,
                "--address", network.addresses[host], "--cpu-slots", "2", "--memory-mib", "4096",
                "--heartbeat-s", "1", "--drain-grace-s", "10"],
                {**env, "WEIGHTS_CA_FILE": ca_file, "WEIGHTS_CACHE_DIR": str(tmp_path / f"cache-{host}")},
                LOG_DIR))
        wait_until(lambda: httpx.get(f"http://{web}:{WEB_PORT}/healthz", timeout=2).status_code == 200,
                   procs[1], 60, "web healthz")
        agents = procs[2:]
        control.until(lambda: Node.objects.filter(name__in=[n for _, n in nodes.values()]).count() == 2,
                      120, "two registered nodes", agents, tick=False)
        for host, (_, name) in nodes.items():  # each node registered its own address
            assert Node.objects.get(name=name).address == network.addresses[host]

        ready = lambda: Replica.objects.filter(model_version=version, state="ready")  # noqa: E731
        control.until(lambda: ready().count() == 2, 600, "two ready replicas", agents)
        assert sorted(ready().values_list("zone", flat=True)) == ["zone-a", "zone-b"]
        for host in nodes:  # each node fetched the weights itself, over https
            assert cached_path(weights_url, sha, tmp_path / f"cache-{host}").is_file()
        low, high = (int(p) for p in PORT_RANGE.split("-"))
        for replica in ready():
            host, port = replica.grpc_address.rsplit(":", 1)
            assert host == replica.node.address and low <= int(port) <= high, replica.grpc_address

        before = {r.pk: _successes(r) for r in ready()}
        for thread in threads:
            thread.start()
        control.until(lambda: all(_successes(r) > before[r.pk] + 1 for r in ready()), 300,
                      "requests from the web host answered by the replicas of both nodes")
        lost = ready().get(zone="zone-a")
        served_before_cut = len(load.outcomes)
        cut_at = time.monotonic()
        network.cut("node-a")
        marks: dict[str, float] = {}

        def replaced() -> bool:
            lost.refresh_from_db()
            if lost.state == "failed":
                marks.setdefault("failed", time.monotonic() - cut_at)
            if ready().filter(zone="zone-b").count() == 2:
                marks.setdefault("ready", time.monotonic() - cut_at)
                return True
            return False
        control.until(replaced, 600, "a ready replacement on node-b", agents[1:])
        control.until(lambda: len(load.outcomes) >= served_before_cut + 6, 300, "requests after")
        load.stop.set()
        for thread in threads:
            thread.join(150)

        assert "lost" in ReplicaTransition.objects.filter(replica=lost).last().reason
        assert Node.objects.get(pk=lost.node_id).lost_at is not None
        # The weights crossed the network once per host: registration (control), node-a,
        # node-b; the replacement on node-b started from node-b's cache.
        assert sorted(client for client, _ in files.requests) == sorted(
            [control_host, network.addresses["node-a"], network.addresses["node-b"]])
        replacement = ready().exclude(pk=lost.pk).order_by("-pk").first()
        assert replacement.node.name == nodes["node-b"][1]
        assert replacement.grpc_address.startswith(network.addresses["node-b"] + ":")
        # Every request either finished, or failed only after it had started streaming.
        not_started_and_failed = [o for o in load.outcomes if not o[2] and o[1] == 0]
        assert not_started_and_failed == [], load.outcomes
        assert sum(ok for *_, ok in load.outcomes) > served_before_cut
        result = {"failed_after_cut_s": round(marks["failed"], 1),
                  "replacement_ready_after_cut_s": round(marks["ready"], 1),
                  "replacement_load_s": round(replacement.load_seconds or 0.0, 1),
                  "lost_after_s": LOST_AFTER_S, "requests": len(load.outcomes),
                  "loadavg": [round(x, 2) for x in os.getloadavg()]}
        (LOG_DIR / "multihost.json").write_text(json.dumps(result, indent=2) + "\n")
        print("multihost re-placement:", result)
    finally:
        load.stop.set()
        for proc in reversed(procs):  # node-a is cut off: its agent cannot drain, kill it soon
            proc.stop(timeout=5 if proc.name == "mh-agent-node-a" else 40)
        kill_replica_servers()
        for _, name in nodes.values():
            control.redis.delete(f"node.{name}", f"_kombu.binding.node.{name}")
        control.redis.close()
