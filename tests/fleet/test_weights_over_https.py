"""Weights over https (replica/weights_cache.py) from a real local HTTPS server with a private
CA: downloaded once per host into the cache, verified, renamed into place; a wrong hash, an
untrusted server or plain http fail clearly and leave nothing in the cache (a node agent fails
the replica with the reason). Registration stores
the tokenizer in the registry, and the web side's `stored` loader tokenizes with it alone."""
import hashlib
import shutil
import threading

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from fleet.node_agent import AgentConfig, NodeAgent
from fleet.nodes import register_node
from fleet.placement import place_replicas
from tests.fakes.dispatcher import RecordingDispatcher
from tests.support.billing import priced

from inference.tokenization import TokenizerCache, load_weights_tokenizer, resolve_weights
from models_registry.models import ModelVersion, Replica, StoredTokenizer
from models_registry.services import ensure_model_version
from replica.weights_cache import WeightsError, cached_path, fetch
from tests.e2e.conftest import SMOLLM2_WEIGHTS
from tests.support.https_files import HttpsFiles
from tests.support.waiting import wait_until

PAYLOAD = b"GGUF-not-really" * 70000  # ~1 MB: several chunks
SHA = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "model.gguf").write_bytes(PAYLOAD)
    certs = tmp_path / "certs"
    certs.mkdir()
    with HttpsFiles(root, certs) as files:
        yield files, root


def test_fetch_downloads_once_verifies_and_caches(served, tmp_path):
    files, _ = served
    cache = tmp_path / "cache"
    url = f"{files.base_url}/model.gguf"
    seen = []
    path = fetch(url, SHA, root=cache, ca_file=str(files.ca_file),
                 progress=lambda done, total: seen.append((done, total)))
    assert path == cached_path(url, SHA, cache) and path.read_bytes() == PAYLOAD
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD))
    assert fetch(url, SHA, root=cache, ca_file=str(files.ca_file)) == path
    assert files.requests == [("127.0.0.1", "/model.gguf")]  # the second one: from the cache
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]  # no partial left


def test_concurrent_fetchers_on_one_host_download_once(served, tmp_path):
    files, _ = served
    url, cache = f"{files.base_url}/model.gguf", tmp_path / "cache"
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        fetch(url, SHA, root=cache, ca_file=str(files.ca_file)))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(files.requests) == 1


def test_a_wrong_hash_fails_clearly_and_caches_nothing(served, tmp_path):
    files, _ = served
    cache, wrong = tmp_path / "cache", "0" * 64
    with pytest.raises(WeightsError, match=f"SHA-256 is {SHA}, the version declares {wrong}"):
        fetch(f"{files.base_url}/model.gguf", wrong, root=cache, ca_file=str(files.ca_file))
    assert not [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock")]


def test_untrusted_servers_plain_http_and_missing_hashes_are_refused(served, tmp_path):
    files, _ = served
    cache = tmp_path / "cache"
    with pytest.raises(WeightsError, match="failed"):  # the private CA is not trusted by default
        fetch(f"{files.base_url}/model.gguf", SHA, root=cache)
    with pytest.raises(WeightsError, match="HTTP 404"):
        fetch(f"{files.base_url}/missing.gguf", SHA, root=cache, ca_file=str(files.ca_file))
    with pytest.raises(WeightsError, match="plain http"):
        fetch("http://127.0.0.1/model.gguf", SHA, root=cache)
    with pytest.raises(WeightsError, match="SHA-256"):
        fetch(f"{files.base_url}/model.gguf", "abc", root=cache)


@pytest.mark.django_db
def test_registration_refuses_https_weights_without_a_hash():
    with pytest.raises(WeightsError):
        ensure_model_version("remote", 1, "https://weights.example/m.gguf")
    with pytest.raises(CommandError, match="SHA-256"):
        call_command("registermodel", "remote", "--weights", "https://weights.example/m.gguf")
    assert not ModelVersion.objects.exists()


@pytest.mark.django_db
def test_registering_https_weights_stores_the_tokenizer_web_hosts_use(tmp_path, monkeypatch):
    gguf = resolve_weights(SMOLLM2_WEIGHTS)
    root = tmp_path / "www"
    root.mkdir()
    shutil.copy(gguf, root / "smollm2.gguf")
    sha = hashlib.sha256((root / "smollm2.gguf").read_bytes()).hexdigest()
    certs = tmp_path / "certs"
    certs.mkdir()
    with HttpsFiles(root, certs) as files:
        monkeypatch.setenv("WEIGHTS_CA_FILE", str(files.ca_file))
        monkeypatch.setenv("WEIGHTS_CACHE_DIR", str(tmp_path / "cache"))
        url = f"{files.base_url}/smollm2.gguf"
        call_command("registermodel", "remote-smol", "--weights", url, "--sha256", sha.upper())
    version = ModelVersion.objects.get(model__name="remote-smol")
    assert (version.tokenizer, version.weights_sha256) == ("stored", sha)
    assert StoredTokenizer.objects.filter(model_version=version).exists()
    # The web side: the stored tokenizer, by the version's weights URI, tokenizes as the
    # weights' own does (and no file is read for it).
    stored = TokenizerCache().get(version.tokenizer, version.weights_uri)
    messages = [{"role": "user", "content": "Hello wörld 🙂 <|im_end|>"}]
    assert stored.encode_chat(messages) == load_weights_tokenizer(SMOLLM2_WEIGHTS).encode_chat(messages)


@pytest.mark.django_db(transaction=True)
def test_a_node_agent_fails_a_replica_whose_weights_do_not_match(served, tmp_path, monkeypatch):
    files, _ = served
    monkeypatch.setenv("WEIGHTS_CA_FILE", str(files.ca_file))
    monkeypatch.setenv("WEIGHTS_CACHE_DIR", str(tmp_path / "node-cache"))
    version = priced(ensure_model_version("remote", 1, f"{files.base_url}/model.gguf",
                                          weights_sha256="f" * 64))
    register_node("n1", zone="z", address="127.0.0.1", cpu_slots=1, memory_mib=2048,
                  accelerator="cpu", now=timezone.now())
    replica, = place_replicas(version, 1, now=timezone.now(), reason="test",
                              dispatcher=RecordingDispatcher(), lost_after_s=15)
    agent = NodeAgent(AgentConfig(name="n1", log_dir=tmp_path / "logs"), now=timezone.now)
    assert agent.start_replica(replica.pk) is True  # the download runs on its own thread
    wait_until(lambda: _state(replica) == "failed", 60, "the replica to fail on the hash")
    replica.refresh_from_db()
    assert replica.grpc_address == ""  # nothing launched
    assert replica.transitions.last().reason.startswith(f"weights unavailable: {files.base_url}"
                                                        f"/model.gguf: SHA-256 is {SHA}")
    assert agent.replica_ids() == []


@pytest.mark.django_db(transaction=True)
def test_a_slow_download_does_not_hold_up_another_start_on_the_agent(tmp_path, monkeypatch):
    """The first https start downloads on its own thread: the agent's task returns at once, the
    replica stays loading while the bytes trickle, a second start on the same agent launches
    meanwhile, and the first launches once its weights are in (then fails: they are not a
    model, which is beside the point here)."""
    root, certs = tmp_path / "www", tmp_path / "certs"
    root.mkdir()
    certs.mkdir()
    (root / "model.gguf").write_bytes(PAYLOAD)
    local = tmp_path / "local.gguf"
    local.write_bytes(PAYLOAD)
    hold = threading.Event()
    with HttpsFiles(root, certs, hold=hold) as files:
        monkeypatch.setenv("WEIGHTS_CA_FILE", str(files.ca_file))
        monkeypatch.setenv("WEIGHTS_CACHE_DIR", str(tmp_path / "node-cache"))
        slow = priced(ensure_model_version("remote", 1, f"{files.base_url}/model.gguf", weights_sha256=SHA))
        other = priced(ensure_model_version("local", 1, str(local)))
        register_node("n1", zone="z", address="127.0.0.1", cpu_slots=2, memory_mib=4096,
                      accelerator="cpu", now=timezone.now())
        first, = place_replicas(slow, 1, now=timezone.now(), reason="test",
                                dispatcher=RecordingDispatcher(), lost_after_s=15)
        second, = place_replicas(other, 1, now=timezone.now(), reason="test",
                                 dispatcher=RecordingDispatcher(), lost_after_s=15)
        agent = NodeAgent(AgentConfig(name="n1", log_dir=tmp_path / "logs"), now=timezone.now)
        try:
            assert agent.start_replica(first.pk) is True  # returned: the download runs elsewhere
            assert files.trickling.wait(60), "the download never started"
            assert agent.start_replica(second.pk) is True  # launched while the first downloads
            assert second.pk in agent.replica_ids() or _state(second) != "loading"
            first.refresh_from_db()
            assert (first.state, first.grpc_address) == ("loading", "")  # not launched yet
            assert first.pk not in agent.replica_ids()
            assert agent.start_replica(first.pk) is False  # one download per replica
            hold.set()
            wait_until(lambda: _state(first) != "loading" or first.pk in agent.replica_ids(), 60,
                       "the first replica to launch after its download")
            assert cached_path(files.base_url + "/model.gguf", SHA, tmp_path / "node-cache").is_file()
            assert Replica.objects.get(pk=first.pk).grpc_address  # it got ports: it was launched
        finally:
            hold.set()
            agent.shutdown(timeout_s=60)


def _state(replica) -> str:
    return Replica.objects.filter(pk=replica.pk).values_list("state", flat=True).get()
