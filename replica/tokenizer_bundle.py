"""A tokenizer as one JSON document, so the registry can store it: web hosts then tokenize
prompts for weights they do not have (weights over https: only node agents download them).

The bundle holds the Rust backend's own serialization (`tokenizer.json`), the chat template and
the BOS/EOS ids; `from_bundle(to_bundle(t))` encodes, renders and stops exactly as `t`.
"""
from __future__ import annotations

import json

from tokenizers import Tokenizer as BackendTokenizer

from replica.engine.tokenizer import Tokenizer

FORMAT = 1


def to_bundle(tokenizer: Tokenizer) -> str:
    return json.dumps({"format": FORMAT, "tokenizer_json": tokenizer.backend.to_str(),
                       "chat_template": tokenizer.chat_template,
                       "bos_token_id": tokenizer.bos_token_id,
                       "eos_token_ids": list(tokenizer.eos_token_ids)})


def from_bundle(text: str) -> Tokenizer:
    data = json.loads(text)
    if data.get("format") != FORMAT:
        raise ValueError(f"unknown tokenizer bundle format {data.get('format')!r}")
    return Tokenizer(BackendTokenizer.from_str(data["tokenizer_json"]),
                     chat_template=data["chat_template"], bos_token_id=data["bos_token_id"],
                     eos_token_ids=data["eos_token_ids"])
