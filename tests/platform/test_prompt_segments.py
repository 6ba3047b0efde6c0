"""The prompt segment cache (inference/prompt_segments.py): the ids of a chat prompt encoded
piece by piece, pieces from the cache, are the ids of encoding it whole, token for token, on
many random conversations (special-token text, whitespace, digits, non-ASCII at the pieces'
edges); cache entries serve their own tenant only; the cache stays within its bound; tokenizers
where piecewise encoding could differ get no cache."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, pre_tokenizers

from inference.prompt_segments import ENTRY_OVERHEAD_CHARS, SegmentEncoder
from inference.prompts import INLINE_TOKENIZE_CHARS, PromptEncoder
from inference.tokenization import ByteTokenizer, TokenizerCache
from replica.engine.models.loader import default_model_path
from replica.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    from inference.tokenization import load_weights_tokenizer
    try:
        return load_weights_tokenizer(default_model_path())
    except FileNotFoundError as e:
        pytest.skip(str(e))


SPECIAL_TEXT = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<|im_", "im_end|>",
                "<|", "|>", "<", ">"]
WORDS = ["hello", "world", " ", "  ", "\n", "\n\n", "\t", "12", "3.14", "1,000", "é", "日本語",
         "🙂", "don't", "WE'RE", "$x^2$", "def f():", "    return", "-", "...", "ñ", "ÿ"]


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 12)):
        parts.append(rng.choice(SPECIAL_TEXT) if rng.random() < 0.15 else rng.choice(WORDS))
    return "".join(parts)


def random_conversation(rng: random.Random, systems: list[str]) -> list[dict]:
    messages = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": rng.choice(systems)})
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": random_text(rng)})
        if rng.random() < 0.6:
            messages.append({"role": "assistant", "content": random_text(rng)})
    return messages


def test_pieces_encode_to_the_ids_of_the_whole_prompt(tok):
    encoder = SegmentEncoder.for_tokenizer(tok, 1_000_000)
    assert encoder is not None
    rng = random.Random(1729)
    systems = [random_text(rng) + " Be brief." for _ in range(5)] + [""]
    checked = 0
    for _ in range(400):
        messages = random_conversation(rng, systems)
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        whole = tuple(tok.encode_chat(messages, add_generation_prompt=True))
        tenant = rng.randint(1, 3)
        assert encoder.encode(text, tenant) == whole, messages  # pieces cached or encoded now
        assert encoder.encode(text, tenant) == whole, messages  # every piece from the cache
        assert encoder.uncached_chars(text, tenant) == 0
        checked += 1
    # Raw text with every added token (not only the template's), at every position.
    for _ in range(200):
        text = "".join(rng.choice(SPECIAL_TEXT + WORDS) for _ in range(rng.randint(0, 20)))
        assert encoder.encode(text, 0) == tuple(tok.backend.encode(
            text, add_special_tokens=False).ids), text
    assert checked == 400 and len(encoder) > 0


def test_a_cache_entry_serves_its_own_tenant_only(tok):
    encoder = SegmentEncoder.for_tokenizer(tok, 1_000_000)
    messages = [{"role": "system", "content": "A private system prompt of tenant one."},
                {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages)
    encoder.encode(text, 1)
    assert encoder.uncached_chars(text, 1) == 0
    assert encoder.uncached_chars(text, 2) == sum(
        len(p) for p in encoder.pieces(text) if p not in ("<|im_start|>", "<|im_end|>"))
    assert encoder.encode(text, 2) == tuple(tok.encode_chat(messages))


def test_the_cache_stays_within_its_bound(tok):
    encoder = SegmentEncoder.for_tokenizer(tok, 400)
    rng = random.Random(7)
    for i in range(200):
        text = f"<|im_start|>user\n{random_text(rng)} {i}<|im_end|>\n"
        assert encoder.encode(text, 1) == tuple(tok.backend.encode(
            text, add_special_tokens=False).ids)
        assert encoder.cached_chars <= 400
    # Tiny pieces count their overhead: the bound holds a few of them, not 400.
    tiny = SegmentEncoder.for_tokenizer(tok, 400)
    for i in range(100):
        tiny.encode(f"<|im_end|>{i}", 1)
    assert len(tiny) == 400 // (2 + ENTRY_OVERHEAD_CHARS)
    long_piece = "x" * 101  # over a quarter of the bound: encoded, not kept
    assert encoder.encode(long_piece, 1) == tuple(tok.backend.encode(
        long_piece, add_special_tokens=False).ids)
    assert encoder.uncached_chars(long_piece, 1) == 101


def _backend(added: list) -> BackendTokenizer:
    vocab = {t: i for i, t in enumerate(list("abcdefgh") + ["Ġ", "ab"])}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.add_special_tokens(added)
    return backend


def test_tokenizers_where_pieces_could_differ_get_no_cache():
    assert SegmentEncoder.for_tokenizer(ByteTokenizer(), 1000) is None  # no backend
    template = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
    plain = Tokenizer(_backend(["<s>", "</s>"]), chat_template=template)
    assert SegmentEncoder.for_tokenizer(plain, 1000) is not None

    class Different(Tokenizer):  # a chat encoding that is not the rendered text's encoding
        def encode_chat(self, messages, add_generation_prompt=True, **extra):
            return [0] + super().encode_chat(messages, add_generation_prompt, **extra)

    assert SegmentEncoder.for_tokenizer(Different(_backend(["<s>", "</s>"]),
                                                  chat_template=template), 1000) is None
    assert SegmentEncoder.for_tokenizer(Tokenizer(_backend(["<s>"])), 1000) is None  # no template
    assert SegmentEncoder.for_tokenizer(plain, 0) is None  # off
    stripping = Tokenizer(_backend([AddedToken("<s>", lstrip=True, special=True), "</s>"]),
                          chat_template=template)
    assert SegmentEncoder.for_tokenizer(stripping, 1000) is None
    normalized = Tokenizer(_backend([AddedToken("<s>", normalized=True, special=True), "</s>"]),
                           chat_template=template)
    assert SegmentEncoder.for_tokenizer(normalized, 1000) is None
    metaspace = _backend(["<s>", "</s>"])
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    assert SegmentEncoder.for_tokenizer(Tokenizer(metaspace, chat_template=template),
                                        1000) is None
    truncating = _backend(["<s>", "</s>"])
    truncating.enable_truncation(8)
    assert SegmentEncoder.for_tokenizer(Tokenizer(truncating, chat_template=template),
                                        1000) is None


def _request(messages):
    return SimpleNamespace(messages=messages, prompt=None)


@pytest.mark.asyncio
async def test_prompt_encoder_with_the_cache_gives_the_same_prompts(tok):
    tokenizers = TokenizerCache({"weights": lambda uri: tok})
    target = SimpleNamespace(tokenizer="weights", weights_uri="smollm2", model_name="chat-small")
    cached, fresh = PromptEncoder(tokenizers, 1_000_000), PromptEncoder(tokenizers, 0)
    rng = random.Random(99)
    long_system = " ".join(f"rule{i}" for i in range(INLINE_TOKENIZE_CHARS // 4))
    for i in range(60):
        messages = [{"role": "system", "content": long_system if i % 3 == 0 else "Be brief."},
                    {"role": "user", "content": random_text(rng)}]
        got = await cached.encode(target, _request(messages), tenant_id=i % 2)
        want = await fresh.encode(target, _request(messages), tenant_id=i % 2)
        assert got == want
        assert got.token_ids == tuple(tok.encode_chat(messages))
