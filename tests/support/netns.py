"""Hosts made of network namespaces, for the multi-host test (root only).

`Network` makes one bridge in the root namespace, which is the "control" host (its address on
the bridge is `control_address`), and one namespace per other host, each joined to the bridge
by a veth pair and given its own address. Processes started with `Network.start(host, ...)` see
only their host's interfaces: they reach the others by address, as on separate machines (they
still share the filesystem and the process table, which the test uses only to read logs and
to clean up). `cut(host)` takes the host's link down: its packets are dropped, no reset is sent,
as when a machine or its switch port dies.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scripts.children import spawn
from tests.support.processes import REPO, Proc


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"mhprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(("-n", netns) if netns else ()), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


@dataclass
class Network:
    hosts: list[str]
    subnet: str = ""  # "10.X.Y" (a /24); default derived from the pid
    tag: str = field(default_factory=lambda: f"mh{os.getpid() % 100000}")
    addresses: dict[str, str] = field(default_factory=dict)
    _made: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) to remove

    def __post_init__(self):
        if not self.subnet:
            self.subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250 + 1}"
        self.control_address = f"{self.subnet}.1"
        self.addresses = {host: f"{self.subnet}.{10 + i}" for i, host in enumerate(self.hosts)}

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def _host_veth(self, host: str) -> str:
        return f"{self.tag}v{self.hosts.index(host)}"

    def up(self) -> "Network":
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.control_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            ns, outer, inner = self.namespace(host), self._host_veth(host), self._host_veth(host) + "n"
            _ip("netns", "add", ns)
            self._made.append(("netns", ns))
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._made.append(("link", outer))
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("link", "set", "lo", "up", netns=ns)
            _ip("link", "set", inner, "name", "eth0", netns=ns)
            _ip("addr", "add", f"{self.addresses[host]}/24", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
        return self

    def down(self) -> None:
        for kind, name in reversed(self._made):
            subprocess.run(["ip", kind, "del", name], capture_output=True)
        self._made.clear()

    def cut(self, host: str) -> None:
        """Take the host's link down (from the bridge side): the host drops off the network."""
        _ip("link", "set", self._host_veth(host), "down")

    def start(self, host: str | None, name: str, args: list[str], env: dict[str, str],
              log_dir: Path) -> Proc:
        """`python args...` on `host` (None: the control host), in its own process group."""
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        prefix = ["ip", "netns", "exec", self.namespace(host)] if host else []
        with open(log_path, "wb") as log:
            popen = spawn([*prefix, sys.executable, *args], cwd=REPO, env={**os.environ, **env},
                          stdout=log, stderr=subprocess.STDOUT)
        return Proc(name, popen, log_path)
