"""TritonInstall: the tritonserver that the nvidia-pytriton wheel ships, and how to run it here.

Facts this relies on (see TRITON_NOTES.md): the server finds the Python backend stub at
`<backend-directory>/python/triton_python_backend_stub`; the stub finds Python through PATH and
must load the venv Python's libpython, so PATH starts with the venv's bin and LD_LIBRARY_PATH holds
the wheel's `nvidia_pytriton.libs` and the interpreter's LIBDIR.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TritonInstall:
    server_bin: Path
    python_backend_dir: Path  # libtriton_python.so and triton_python_backend_utils.py
    stub: Path  # the backend stub built for this Python version
    cache_dir: Path
    libs_dir: Path  # the wheel's bundled shared libraries
    python_bin_dir: Path  # first on PATH: the stub runs this Python
    python_lib_dir: Path  # libpython of that Python

    @classmethod
    def from_wheel(cls) -> "TritonInstall":
        spec = importlib.util.find_spec("pytriton")  # located, not imported (keeps launch light)
        if spec is None or spec.origin is None:
            raise FileNotFoundError("nvidia-pytriton is not installed in this environment")
        package = Path(spec.origin).parent
        root = package / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        install = cls(
            server_bin=root / "bin" / "tritonserver",
            python_backend_dir=root / "backends" / "python",
            stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
            cache_dir=root / "caches",
            libs_dir=package.parent / "nvidia_pytriton.libs",
            python_bin_dir=Path(sys.executable).parent,  # not resolved: the venv's bin, not the base's
            python_lib_dir=Path(sysconfig.get_config_var("LIBDIR") or "/usr/lib"),
        )
        for path in (install.server_bin, install.python_backend_dir, install.stub, install.libs_dir):
            if not path.exists():
                raise FileNotFoundError(f"incomplete nvidia-pytriton install: {path} is missing")
        return install

    def build_backend_dir(self, dest: Path) -> Path:
        """A backend directory whose `python/` links the library, utils module and our stub."""
        python_dir = dest / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        links = {
            "libtriton_python.so": self.python_backend_dir / "libtriton_python.so",
            "triton_python_backend_utils.py": self.python_backend_dir / "triton_python_backend_utils.py",
            "triton_python_backend_stub": self.stub,
        }
        for name, target in links.items():
            link = python_dir / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
        return dest

    def environment(self, base: dict[str, str], python_path: list[str]) -> dict[str, str]:
        env = dict(base)
        env["PATH"] = os.pathsep.join([str(self.python_bin_dir), base.get("PATH", "/usr/bin:/bin")])
        libs = [str(self.libs_dir), str(self.python_lib_dir)]
        if base.get("LD_LIBRARY_PATH"):
            libs.append(base["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        paths = list(python_path) + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.pop("VIRTUAL_ENV_PROMPT", None)
        return env
