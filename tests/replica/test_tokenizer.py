"""The tokenizer: SmolLM2's GGUF vocabulary against transformers' tokenizer for the same file,
round trips, the chat template, and tokenizers built from Hugging Face directories."""
from __future__ import annotations

import json
import os
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from replica.engine.chat_template import ChatTemplate, ChatTemplateError
from replica.engine.models.gguf_reader import GGUFReader
from replica.engine.tokenizer import Tokenizer

SYSTEM_DEFAULT = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. I'm sure you'll see; they'd WE'RE",
    "def f(x):\n    return x**2  # square\n\nclass A:\n\tpass\n",
    "12345 and 3.14159, 1,000,000 or 2024-01-31T12:00:00Z",
    "héllo wörld — 日本語 🙂 Ünïcödé ñ Ελληνικά русский العربية",
    "a   b\t\tc\n\n\nd   ",
    "trailing spaces   ",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>x<repo_name>y",
    "$x_1 + y^2 = z$ // ~!@#%^&*()[]{}<>?",
    "",
]
# whitespace right before a digit: llama.cpp's 'smollm' pre-tokenizer splits digits off first, so
# "a  1" ends in the piece "  " (one token); transformers' GGUF tokenizer uses GPT-2's regex only
# and splits it " " + " 1" (two tokens) -- it disagrees with llama.cpp and SmolLM2's tokenizer.json
WHITESPACE_BEFORE_DIGITS = ["a  1", "x\n\n1", "  12", "ok \t 42", "line\n  7 items"]


@pytest.fixture(scope="module")
def metadata(model_path) -> dict:
    return GGUFReader(model_path).metadata


@pytest.fixture(scope="module")
def tok(metadata) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(metadata)


@pytest.fixture(scope="module")
def hf_tok(model_path):
    """transformers' tokenizer built from the same GGUF (test-only reference)."""
    from transformers import AutoTokenizer

    directory, name = os.path.split(model_path)
    return AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)


@pytest.fixture(scope="module")
def smollm2_reference(hf_tok) -> BackendTokenizer:
    """transformers' vocabulary with SmolLM2's published pre-tokenizer (tokenizer.json on the Hub:
    Digits(individual_digits) then ByteLevel), i.e. what llama.cpp's 'smollm' means."""
    backend = BackendTokenizer.from_str(hf_tok.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return backend


# -- SmolLM2's GGUF vocabulary ---------------------------------------------------------------

@pytest.mark.parametrize("text", TEXTS)
def test_encode_equals_transformers_gguf_tokenizer(tok, hf_tok, text):
    assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=True)


@pytest.mark.parametrize("text", TEXTS + WHITESPACE_BEFORE_DIGITS)
def test_encode_equals_smollm2_published_pre_tokenizer(tok, smollm2_reference, text):
    assert tok.encode(text) == smollm2_reference.encode(text).ids


def test_whitespace_before_digits_follows_llama_cpp(tok):
    assert tok.convert_ids_to_tokens(tok.encode("a  1")) == ["a", "ĠĠ", "1"]
    assert tok.convert_ids_to_tokens(tok.encode("12345")) == ["1", "2", "3", "4", "5"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(list("ab Z09\n\t.,'é日🙂-_") + ["'s", "  ", "12", "<|im_end|>"]),
                max_size=30).map("".join))
def test_encode_matches_reference_on_random_text(tok, smollm2_reference, text):
    ids = tok.encode(text)
    assert ids == smollm2_reference.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("text", TEXTS + WHITESPACE_BEFORE_DIGITS)
def test_decode_round_trips(tok, hf_tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids, skip_special_tokens=False) == hf_tok.decode(ids, skip_special_tokens=False)


def test_special_tokens(tok):
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1 and tok.id_to_token(1) == "<|im_start|>"
    assert tok.eos_token_ids == (2,) and tok.id_to_token(2) == "<|im_end|>"
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert 1 not in tok.encode("hi there")  # add_bos_token is False: no BOS added
    assert tok.decode(tok.encode("<|im_start|>user\nhi<|im_end|>")) == "user\nhi"
    assert tok.token_to_id("<repo_name>") == 3


def test_add_bos_token_from_metadata(metadata):
    with_bos = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.add_bos_token": True})
    assert with_bos.encode("hi")[0] == 1 and with_bos.encode("hi")[1:] == Tokenizer.from_gguf_metadata(metadata).encode("hi")
    assert with_bos.encode_chat([{"role": "user", "content": "x"}]).count(1) == 3  # no extra BOS


def test_unsupported_gguf_tokenizers(metadata):
    with pytest.raises(ValueError, match="tokenizer model 'llama' is not supported"):
        Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="pre-tokenizer 'mystery' is not supported"):
        Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "mystery"})
    with pytest.raises(ValueError, match="no tokenizer"):
        Tokenizer.from_gguf_metadata({"general.architecture": "llama"})


# -- SmolLM2's chat template -----------------------------------------------------------------

def test_chat_template_injects_default_system(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == SYSTEM_DEFAULT + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_keeps_given_system_and_turns(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n")


def test_encode_chat_equals_transformers(tok, hf_tok):
    messages = [{"role": "user", "content": "What is 12345 + 1? Answer in 日本語 🙂"}]
    ref = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ref = ref["input_ids"] if hasattr(ref, "keys") else ref
    ids = tok.encode_chat(messages)
    assert ids == ref
    assert ids[0] == 1 and ids[-4:] == tok.encode("<|im_start|>assistant\n")
    assert tok.apply_chat_template(messages) == hf_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


# -- Hugging Face directories ----------------------------------------------------------------

SPECIALS = ["<s>", "</s>", "<|eot_id|>"]


def _write_hf_tokenizer(directory, tokenizer_config: dict, add_bos: bool = False) -> None:
    vocab = {t: i for i, t in enumerate(SPECIALS + list("abcdefgh") + ["Ġ", "ab", "Ġab"])}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("Ġ", "ab")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIALS)
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    backend.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f)


LLAMA3_LIKE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}<|eot_id|>{% endfor %}"
               "{% if add_generation_prompt %}assistant:{% endif %}")


def test_hf_dir_encode_decode_and_eos(tmp_path):
    _write_hf_tokenizer(tmp_path, {"bos_token": "<s>", "eos_token": {"content": "</s>"},
                                   "chat_template": LLAMA3_LIKE}, add_bos=True)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.encode("ab ab") == [0, 12, 13]  # BOS from the post-processor
    assert tok.decode(tok.encode("ab ab")) == "ab ab"
    assert tok.bos_token_id == 0 and tok.eos_token_ids == (1, 2)
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == "<s>user:ab<|eot_id|>assistant:"
    assert tok.encode_chat([{"role": "user", "content": "ab"}]).count(0) == 1  # the template's BOS only


def test_hf_dir_end_of_turn_token_used_by_template_stops(tmp_path):
    _write_hf_tokenizer(tmp_path, {"eos_token": "</s>", "chat_template": LLAMA3_LIKE})
    assert Tokenizer.from_hf_dir(tmp_path).eos_token_ids == (1, 2)  # </s>, then <|eot_id|>
    _write_hf_tokenizer(tmp_path, {"eos_token": "</s>"})
    assert Tokenizer.from_hf_dir(tmp_path).eos_token_ids == (1,)


def test_hf_dir_chat_template_sources(tmp_path):
    _write_hf_tokenizer(tmp_path, {"chat_template": [{"name": "tool_use", "template": "T"},
                                                     {"name": "default", "template": "D"}]})
    assert Tokenizer.from_hf_dir(tmp_path).apply_chat_template([]) == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer.from_hf_dir(tmp_path).apply_chat_template([{"role": "user", "content": ""}]) == "J1"


def test_hf_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    _write_hf_tokenizer(tmp_path, {})
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_hf_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError):
        Tokenizer.from_hf_dir(tmp_path)


# -- the template renderer -------------------------------------------------------------------

def test_chat_template_helpers():
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ messages | tojson }}|{{ strftime_now('%Y-%m-%d') }}|{{ eos_token }}",
        special_tokens={"eos_token": "</s>"}, now=lambda: datetime(2026, 1, 2))
    assert template.render([{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]|2026-01-02|</s>'
    with pytest.raises(ChatTemplateError, match="user first"):
        template.render([{"role": "system", "content": ""}])
    with pytest.raises(ValueError, match="invalid chat template"):
        ChatTemplate("{% for %}")


def test_chat_template_is_sandboxed():
    with pytest.raises(ValueError):
        ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}").render([])
