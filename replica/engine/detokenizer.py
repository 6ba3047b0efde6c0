"""Incremental detokenisation with stop strings.

Text deltas are whole UTF-8 characters: a character split across byte-level tokens is held back
until complete (the decoder yields U+FFFD for a partial one). While stop strings are set, the
last `max_stop_len - 1` characters are held back too, so a stop string is never half-emitted.
"""
from __future__ import annotations

from typing import Protocol, Sequence

# tokens of context decoded before the new ones, so merges like leading spaces decode right
_CONTEXT_TOKENS = 5


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, decoder: Decoder, prompt_token_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self._decoder = decoder
        self._ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""  # all output text so far (stop string excluded)
        self._emitted = 0  # characters of `text` already handed out

    def append(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        """Add new tokens; return (text delta, whether a stop string ended the output)."""
        self._ids.extend(token_ids)
        prefix = self._decoder.decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decoder.decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new_text = full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            search_from = max(len(self.text) - self._hold, 0)
            self.text += new_text
            if self._stop:
                hit = self._find_stop(search_from)
                if hit is not None:
                    self.text = self.text[:hit]
                    return self.flush(), True
        safe_end = len(self.text) - self._hold if self._stop else len(self.text)
        if safe_end <= self._emitted:
            return "", False
        delta = self.text[self._emitted : safe_end]
        self._emitted = safe_end
        return delta, False

    def flush(self) -> str:
        """Everything not yet emitted (at the end of the request)."""
        delta = self.text[self._emitted :]
        self._emitted = len(self.text)
        return delta

    def _find_stop(self, search_from: int) -> int | None:
        best = None
        for stop in self._stop:
            idx = self.text.find(stop, search_from)
            if idx != -1 and (best is None or idx < best):
                best = idx
        return best
