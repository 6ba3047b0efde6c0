"""Run as a script (no pytest, no test settings): does the web/worker role work without the engine?

`python tests/deploy/web_role_probe.py [--weights GGUF] [--also MODULE ...]` with the repository
root as the working directory. Makes the engine's packages unimportable (a meta-path finder that refuses them, so a
venv that has them behaves like the `web` image that lacks them), then imports what the web and
worker processes import: the ASGI application (Django, Channels, every URL's view module), the
Celery app with every app's tasks, and every module of the platform's Django apps. With --weights
it also loads the prompt tokenizer the way a request does; --also imports more modules (the
tests' negative control imports an engine module through it). Prints one JSON object:
{"failed": [[module, error], ...], "engine_imported": [...], "tokens": [...]}; exits 1 unless
nothing failed and no engine package was imported.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.abc
import json
import os
import pkgutil
import sys

# What only the `node` image has: the engine (torch and what it pulls in), the tritonserver wheel,
# the weight formats and reference models. tritonclient (a different top-level name) is allowed.
ENGINE_PACKAGES = ("torch", "triton", "pytriton", "safetensors", "transformers", "gguf")
PLATFORM_PACKAGES = ("llm_platform", "common", "tenants", "models_registry", "billing", "inference", "fleet",
                     "rollouts",
                     "consoles", "dashboard")


class RefuseEnginePackages(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ENGINE_PACKAGES:
            raise ModuleNotFoundError(f"{name} is not in the web role", name=name)
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", default="")
    parser.add_argument("--also", action="append", default=[])
    args = parser.parse_args(argv)
    sys.meta_path.insert(0, RefuseEnginePackages())
    sys.path.insert(0, os.getcwd())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")
    failed: list[list[str]] = []

    def load(name: str) -> None:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - every failure is reported
            failed.append([name, repr(exc)])

    load("llm_platform.asgi")  # what daphne loads: django.setup() and every view module
    if not failed:
        from llm_platform.celery import app  # noqa: PLC0415

        app.loader.import_default_modules()  # what a Celery worker or beat loads
        for package in PLATFORM_PACKAGES:
            for info in pkgutil.walk_packages(importlib.import_module(package).__path__,
                                              package + "."):
                load(info.name)
        for name in args.also:
            load(name)
    tokens: list[int] = []
    if args.weights and not failed:
        from inference.tokenization import load_weights_tokenizer  # noqa: PLC0415

        try:
            tokens = load_weights_tokenizer(args.weights).encode("Hello, world")
        except Exception as exc:  # noqa: BLE001
            failed.append(["inference.tokenization.load_weights_tokenizer", repr(exc)])
    engine = sorted(m for m in sys.modules if m.partition(".")[0] in ENGINE_PACKAGES)
    print(json.dumps({"failed": failed, "engine_imported": engine, "tokens": tokens}))
    return 0 if not failed and not engine else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
