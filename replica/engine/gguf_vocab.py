"""A `tokenizers.Tokenizer` rebuilt from the vocabulary a GGUF file carries in its metadata.

A GGUF has no tokenizer.json: it stores `tokenizer.ggml.*` keys (model kind, pre-tokenizer name,
tokens, merges, token types, special ids) and llama.cpp re-creates the tokenizer from them. We do
the same with the `tokenizers` library, mirroring llama.cpp (src/llama-vocab.cpp):

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE. Tokens and merges are already spelled in the
  GPT-2 byte alphabet ("Ġ" for a space), so they go into `models.BPE` as they are.
- `tokenizer.ggml.pre` names the pre-tokenizer: a list of regexes applied one after the other,
  each splitting every piece the previous one left (matches and the gaps between them both stay
  pieces). That is `pre_tokenizers.Split(Regex(r), behavior="isolated")` per regex, then
  `ByteLevel(use_regex=False)` for the byte-to-alphabet mapping. A file without the key gets
  llama.cpp's default (GPT-2's regex).
- Token type 3 (control: `<|im_start|>`...) becomes a special added token, type 4 (user-defined)
  a plain added token: both are matched whole in the text before any splitting.
"""
from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_SINGLE_DIGITS = r"\p{N}"  # every digit its own piece, before GPT-2's regex runs

# tokenizer.ggml.pre -> (regexes in order, whether a word found whole in the vocab skips merging)
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {
    **{name: ((_GPT2_SPLIT,), False) for name in ("default", "gpt2", "mpt", "olmo", "jais")},
    **{name: ((_SINGLE_DIGITS, _GPT2_SPLIT), False) for name in (
        "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva")},
    **{name: ((_LLAMA3_SPLIT,), True) for name in (
        "llama3", "llama-bpe", "llama-v3", "smaug-bpe", "dbrx", "falcon3")},
    **{name: ((_QWEN2_SPLIT,), False) for name in ("qwen2", "deepseek-r1-qwen", "stablelm2")},
}


def backend_from_gguf_metadata(metadata: dict[str, Any]) -> BackendTokenizer:
    """The tokenizer `metadata` (a GGUF file's key/values) describes; ValueError if unsupported."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind is None:
        raise ValueError("the GGUF file has no tokenizer (no tokenizer.ggml.model key)")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (supported: 'gpt2', "
                         "byte-level BPE); use a Hugging Face directory with tokenizer.json instead")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported "
                         f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    splits, ignore_merges = PRE_TOKENIZERS[pre]
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    vocab = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)  # a duplicated spelling keeps its first id, like llama.cpp
    try:
        bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges)
    except Exception as e:  # the Rust side raises a bare Exception, e.g. a merge of unknown tokens
        raise ValueError(f"GGUF vocabulary is inconsistent: {e}") from e
    backend = BackendTokenizer(bpe)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    token_types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind in zip(tokens, token_types) if kind == CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind in zip(tokens, token_types) if kind == USER_DEFINED])
    backend.post_processor = _post_processor(metadata, tokens)
    return backend


def _post_processor(metadata: dict[str, Any], tokens: list[str]) -> processors.TemplateProcessing | None:
    """BOS/EOS added by `encode`, when the file asks for them (add_bos_token / add_eos_token)."""
    prefix, suffix, specials = [], [], []
    for flag, id_key, side in (("tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id", prefix),
                               ("tokenizer.ggml.add_eos_token", "tokenizer.ggml.eos_token_id", suffix)):
        token_id = metadata.get(id_key)
        if metadata.get(flag) and token_id is not None:
            side.append(tokens[token_id])
            specials.append((tokens[token_id], token_id))
    if not specials:
        return None
    return processors.TemplateProcessing(single=" ".join(prefix + ["$A"] + suffix),
                                         special_tokens=list(dict(specials).items()))
