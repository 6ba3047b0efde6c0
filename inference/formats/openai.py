"""OpenAI-compatible shapes for /v1/chat/completions and /v1/completions.

Conventions OpenAI clients rely on: `finish_reason` is one of OpenAI's values (a generation the
replica aborted is an error, not a `finish_reason: "abort"`); with `stream_options.include_usage`
every chunk before the last carries `usage: null` and the last one the usage.
"""
from __future__ import annotations

from inference.errors import ReplicaFailed
from inference.formats.base import Event, StreamMeta
from inference.request import Result

OPENAI_FINISH_REASONS = frozenset({"stop", "length"})


def _aborted(result: Result) -> ReplicaFailed | None:
    if result.finish_reason in OPENAI_FINISH_REASONS:
        return None
    return ReplicaFailed(f"The replica ended the generation before it finished "
                         f"({result.finish_reason}); retry later.", code="generation_aborted",
                         headers={"Retry-After": "1"})


def _usage(result: Result) -> dict:
    usage = {
        "prompt_tokens": result.input_tokens,
        "completion_tokens": result.output_tokens,
        "total_tokens": result.input_tokens + result.output_tokens,
    }
    if result.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": result.cached_tokens}
    return usage


class _OpenAIFormat:
    named_events = False
    done_sentinel = "[DONE]"
    id_prefix = ""
    chunk_object = ""

    def _chunk(self, meta: StreamMeta, choices: list, **extra) -> Event:
        if meta.include_usage:
            extra.setdefault("usage", None)
        return Event("chunk", {"id": self.id_prefix + meta.id, "object": self.chunk_object,
                               "created": meta.created, "model": meta.model,
                               "choices": choices, **extra})

    def finish(self, meta: StreamMeta, result: Result) -> list[Event]:
        aborted = _aborted(result)
        if aborted is not None:
            return self.error(meta, aborted.body())
        events = [self._chunk(meta, [self._final_choice(result.finish_reason)])]
        if meta.include_usage:
            events.append(self._chunk(meta, [], usage=_usage(result)))
        return events

    def error(self, meta: StreamMeta, error_body: dict) -> list[Event]:
        return [Event("error", error_body)]


class ChatFormat(_OpenAIFormat):
    id_prefix = "chatcmpl-"
    chunk_object = "chat.completion.chunk"

    def start(self, meta: StreamMeta) -> list[Event]:
        return [self._chunk(meta, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}])]

    def delta(self, meta: StreamMeta, text: str) -> list[Event]:
        return [self._chunk(meta, [{"index": 0, "delta": {"content": text}, "logprobs": None,
                                    "finish_reason": None}])]

    def _final_choice(self, finish_reason: str) -> dict:
        return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}

    def complete(self, result: Result) -> dict:
        aborted = _aborted(result)
        if aborted is not None:
            raise aborted
        return {
            "id": self.id_prefix + result.id,
            "object": "chat.completion",
            "created": result.created,
            "model": result.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }],
            "usage": _usage(result),
        }


class CompletionsFormat(_OpenAIFormat):
    id_prefix = "cmpl-"
    chunk_object = "text_completion"

    def start(self, meta: StreamMeta) -> list[Event]:
        return []

    def delta(self, meta: StreamMeta, text: str) -> list[Event]:
        return [self._chunk(meta, [{"index": 0, "text": text, "logprobs": None,
                                    "finish_reason": None}])]

    def _final_choice(self, finish_reason: str) -> dict:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}

    def complete(self, result: Result) -> dict:
        aborted = _aborted(result)
        if aborted is not None:
            raise aborted
        return {
            "id": self.id_prefix + result.id,
            "object": "text_completion",
            "created": result.created,
            "model": result.model,
            "choices": [{"index": 0, "text": result.text, "logprobs": None,
                         "finish_reason": result.finish_reason}],
            "usage": _usage(result),
        }
