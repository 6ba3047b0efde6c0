"""Encoding a rendered chat prompt piece by piece, each piece's ids kept in a bounded LRU.

A Hugging Face `tokenizers` tokenizer first splits its input at its added tokens
(`<|im_start|>`, `<|im_end|>`, ...), then normalizes, pre-tokenizes and encodes each piece
between them on its own. So the ids of a rendered chat prompt are the added tokens' ids and the
pieces' ids, concatenated, and a piece seen before (a system message, the default system turn,
the earlier turns a conversation sends again with every new one) need not be encoded again.
Encoding is the costly part of preparing a prompt (~0.6 us per character here: a 400-word system
prompt costs ~2 ms of CPU per request, encoded whole).

`SegmentEncoder.encode(text, scope)` returns exactly `backend.encode(text,
add_special_tokens=False).ids` (what `Tokenizer.encode_chat` returns for the rendered text): it
only saves CPU. It is built (`for_tokenizer`) only for a tokenizer where that holds by
construction, and checked on probe texts when built (and its `encode_chat` against the
backend's encoding of the rendered probe chat); any other tokenizer (the test and fake
replicas' byte tokenizer, an added token that strips whitespace or matches after
normalization, a Metaspace pre-tokenizer that treats the first piece differently, truncation
or padding set) gets None and its prompts are encoded whole, as before. `scope` (the tenant) is part of every cache key:
one tenant's prompts never serve another's, not even through how fast its request is prepared.
The LRU is bounded in characters (`max_chars`): an entry counts as its text's length plus
ENTRY_OVERHEAD_CHARS (its key, ids and bookkeeping: many tiny pieces cannot hold much more
memory than the bound says); a piece longer than a quarter of the bound is encoded and not
kept. Thread-safe (long prompts are encoded in a worker thread).
"""
from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from typing import Hashable

# What one cache entry costs beyond its text, in characters' worth of the bound (a tuple key,
# an array of ids, the LRU's links: ~200 bytes for a short piece).
ENTRY_OVERHEAD_CHARS = 64

# Probe texts a SegmentEncoder must encode exactly like the backend before it is used:
# pieces that begin and end with spaces, newlines, digits and non-ASCII next to added tokens.
_PROBES = (
    "{0}system\nYou are a helpful assistant.{1}\n{0}user\n  hi  there 12{1}\n{0}assistant\n",
    " lead{1}{1} trail {0}\n\n{0}x{1}",
    "héllo {0}wörld 🙂{1} 日本語\t",
)


_PROBE_CHAT = [{"role": "user", "content": " Hi  there, 12 times 🙂\n"}]


class SegmentEncoder:
    def __init__(self, backend, added: dict[str, int], max_chars: int):
        self._backend = backend
        self._added = added  # added token text -> id
        # Longest first: at each position the longest added token wins, as the backend's
        # leftmost-longest matcher does.
        self._split = re.compile("(" + "|".join(
            re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")
        self._max_chars = max_chars
        self._max_piece = max(1, max_chars // 4)
        self._lru: OrderedDict[tuple[Hashable, str], array] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    @classmethod
    def for_tokenizer(cls, tokenizer, max_chars: int) -> SegmentEncoder | None:
        """A SegmentEncoder for `tokenizer` (replica.engine.tokenizer.Tokenizer: its `backend`),
        or None when piecewise encoding could differ from encoding the whole text."""
        backend = getattr(tokenizer, "backend", None)
        if backend is None or max_chars <= 0:
            return None
        try:
            decoder = backend.get_added_tokens_decoder()
            if (backend.truncation is not None or backend.padding is not None
                    or getattr(backend, "encode_special_tokens", False)):
                return None
        except AttributeError:
            return None
        tokens = list(decoder.items())
        if not tokens or any(t.normalized or t.lstrip or t.rstrip or t.single_word or not t.content
                             for _, t in tokens):
            return None
        # Metaspace with prepend_scheme "first" marks only the text's first piece: a piece
        # encoded alone would be marked too.
        if "Metaspace" in repr(backend.pre_tokenizer) or "Prepend" in repr(backend.normalizer):
            return None
        encoder = cls(backend, {t.content: i for i, t in tokens}, max_chars)
        names = [t.content for _, t in tokens]
        first, last = names[min(1, len(names) - 1)], names[min(2, len(names) - 1)]
        for probe in _PROBES:
            text = probe.format(first, last)
            if encoder.encode(text, None, keep=False) != tuple(
                    backend.encode(text, add_special_tokens=False).ids):
                return None
        # And the tokenizer's own chat encoding is its backend's encoding of the rendered text
        # (what `encode` stands in for).
        try:
            rendered = tokenizer.apply_chat_template(_PROBE_CHAT, add_generation_prompt=True)
            if encoder.encode(rendered, None, keep=False) != tuple(
                    tokenizer.encode_chat(_PROBE_CHAT, add_generation_prompt=True)):
                return None
        except Exception:  # noqa: BLE001 - a template that refuses the probe: no cache
            return None
        return encoder

    def pieces(self, text: str) -> list[str]:
        """The text split at added tokens (the tokens themselves included, empty pieces not)."""
        return [piece for piece in self._split.split(text) if piece]

    def uncached_chars(self, text: str, scope: Hashable) -> int:
        """How many characters of `text` `encode` would encode now (the rest is cached)."""
        lru, added = self._lru, self._added
        return sum(len(piece) for piece in self.pieces(text)
                   if piece not in added and (scope, piece) not in lru)

    def encode(self, text: str, scope: Hashable, keep: bool = True) -> tuple[int, ...]:
        """`backend.encode(text, add_special_tokens=False).ids`, as a tuple; `scope`: whose
        prompt it is (a cache entry serves its own scope only); `keep`: remember new pieces."""
        ids: list[int] = []
        added, lru, lock = self._added, self._lru, self._lock
        for piece in self.pieces(text):
            token = added.get(piece)
            if token is not None:
                ids.append(token)
                continue
            key = (scope, piece)
            with lock:
                cached = lru.get(key)
                if cached is not None:
                    lru.move_to_end(key)
            if cached is None:
                cached = array("i", self._backend.encode(piece, add_special_tokens=False).ids)
                if keep and len(piece) <= self._max_piece:
                    self._keep(key, cached)
            ids.extend(cached)
        return tuple(ids)

    def _keep(self, key: tuple[Hashable, str], ids: array) -> None:
        with self._lock:
            if key in self._lru:
                return
            self._lru[key] = ids
            self._chars += len(key[1]) + ENTRY_OVERHEAD_CHARS
            while self._chars > self._max_chars:
                (_, piece), _ = self._lru.popitem(last=False)
                self._chars -= len(piece) + ENTRY_OVERHEAD_CHARS

    @property
    def cached_chars(self) -> int:
        return self._chars

    def __len__(self) -> int:
        return len(self._lru)
