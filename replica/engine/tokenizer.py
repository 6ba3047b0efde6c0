"""The model's tokenizer: text <-> token ids, and chat messages -> prompt.

A thin wrapper over a `tokenizers.Tokenizer` (the Rust backend), built either from a Hugging Face
directory's tokenizer.json or from the vocabulary a GGUF file carries (see gguf_vocab.py).

Invariants:
- `encode(text)` adds special tokens only where the model says so (a GGUF's add_bos_token, a
  tokenizer.json's post-processor); special-token text in `text` (e.g. "<|im_end|>") is matched
  as that special token, as Hugging Face does by default.
- `encode_chat(messages)` never adds BOS/EOS itself: the chat template writes what it needs.
- `eos_token_ids` holds every id that ends generation: the model's EOS id(s) first, then any
  end-of-turn token (`<|im_end|>`, `<|eot_id|>`, ...) that the chat template writes.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

from tokenizers import Tokenizer as BackendTokenizer

from replica.engine.chat_template import ChatTemplate
from replica.engine.gguf_vocab import backend_from_gguf_metadata

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                      "<|end_of_turn|>", "<|END_OF_TURN_TOKEN|>")


class Tokenizer:
    def __init__(self, backend: BackendTokenizer, chat_template: str | None = None,
                 bos_token_id: int | None = None, eos_token_ids: Sequence[int] = ()) -> None:
        self._backend = backend
        self._bos_token_id = bos_token_id
        eos = [i for i in eos_token_ids if i is not None]
        if chat_template:
            for token in END_OF_TURN_TOKENS:
                token_id = backend.token_to_id(token)
                if token_id is not None and token in chat_template:
                    eos.append(token_id)
        self._eos_token_ids = tuple(dict.fromkeys(eos))  # ordered, unique
        specials = {"bos_token": self._token_or_empty(bos_token_id),
                    "eos_token": self._token_or_empty(eos[0] if eos else None)}
        self._chat_template = ChatTemplate(chat_template, specials) if chat_template else None

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, Any]) -> Tokenizer:
        """From a GGUF file's metadata (`GGUFReader(path).metadata`)."""
        eos_keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        return cls(backend_from_gguf_metadata(metadata),
                   chat_template=metadata.get("tokenizer.chat_template"),
                   bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
                   eos_token_ids=[metadata.get(k) for k in eos_keys])

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike) -> Tokenizer:
        """From a Hugging Face model directory: tokenizer.json, plus tokenizer_config.json,
        chat_template.jinja, generation_config.json and config.json where present."""
        path = os.fspath(path)
        tokenizer_file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tokenizer_file):
            raise FileNotFoundError(f"no tokenizer.json in {path} (only fast tokenizers are supported)")
        try:
            backend = BackendTokenizer.from_file(tokenizer_file)
        except Exception as e:  # the Rust side raises a bare Exception on bad JSON
            raise ValueError(f"{tokenizer_file}: cannot read tokenizer ({e})") from e
        tok_config = _read_json(os.path.join(path, "tokenizer_config.json"))
        gen_config = _read_json(os.path.join(path, "generation_config.json"))
        model_config = _read_json(os.path.join(path, "config.json"))

        bos_token = _token_content(tok_config.get("bos_token"))
        bos_token_id = backend.token_to_id(bos_token) if bos_token else model_config.get("bos_token_id")
        eos_token = _token_content(tok_config.get("eos_token"))
        eos_token_ids = ([backend.token_to_id(eos_token)] if eos_token else []) \
            + _ids(gen_config.get("eos_token_id")) + _ids(model_config.get("eos_token_id"))
        return cls(backend, chat_template=_hf_chat_template(path, tok_config),
                   bos_token_id=bos_token_id, eos_token_ids=eos_token_ids)

    def _token_or_empty(self, token_id: int | None) -> str:
        return "" if token_id is None else (self._backend.id_to_token(token_id) or "")

    # -- properties --------------------------------------------------------------------------

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template(self) -> str | None:
        return self._chat_template.source if self._chat_template else None

    @property
    def backend(self) -> BackendTokenizer:
        return self._backend

    # -- text <-> ids ------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        return [self._backend.id_to_token(i) for i in ids]

    # -- chat --------------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]). `extra` goes to
        the template as variables (`tools`, ...). ValueError when the model has no template or the
        template rejects the messages."""
        if self._chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        return self._chat_template.render(messages, add_generation_prompt=add_generation_prompt, **extra)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **extra: Any) -> list[int]:
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra)
        return self._backend.encode(text, add_special_tokens=False).ids


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read JSON ({e})") from e


def _token_content(token: str | dict | None) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    return token.get("content") if isinstance(token, dict) else token


def _ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _hf_chat_template(path: str, tok_config: dict[str, Any]) -> str | None:
    """chat_template.jinja (transformers >= 4.47 writes it) wins over tokenizer_config.json's."""
    jinja_file = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            return f.read()
    template = _read_json(os.path.join(path, "chat_template.json")).get("chat_template") \
        or tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template
