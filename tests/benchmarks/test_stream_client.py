"""The peer benchmark's streaming client: token arrivals, usage and failures from SSE streams
(an httpx mock transport stands in for the server: pure client logic)."""
import asyncio
import json

import httpx

from benchmarks.stream_client import Sample, one_request, parse_sse_line, summarize


def _sse(chunks: list[dict]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _run(handler) -> Sample:
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await one_request(http, "http://server", {}, {"prompt": "x"})
    return asyncio.run(go())


def test_text_chunks_are_tokens_and_usage_counts_them():
    chunks = [{"choices": [{"text": t}]} for t in ("a", "b", "", "c")]
    chunks.append({"choices": [], "usage": {"completion_tokens": 4}})
    sample = _run(lambda request: httpx.Response(200, content=_sse(chunks)))
    assert sample.ok and sample.output_tokens == 4
    assert len(sample.itls_s) == 2  # three text chunks: two gaps
    assert sample.ttft_s >= 0


def test_without_usage_the_text_chunks_are_counted():
    sample = _run(lambda request: httpx.Response(200, content=_sse([{"choices": [{"text": "a"}]}] * 3)))
    assert sample.output_tokens == 3


def test_http_errors_and_error_events_are_failures():
    assert not _run(lambda request: httpx.Response(429, json={"error": {"code": "rate_limited"}})).ok
    failed = _run(lambda request: httpx.Response(200, content=_sse([{"error": {"message": "boom"}}])))
    assert not failed.ok and "boom" in failed.error


def test_parse_and_summarize():
    assert parse_sse_line("event: token") is None and parse_sse_line("data: [DONE]") is None
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    summary = summarize([Sample(True, 0.1, 10, [0.02, 0.04]), Sample(True, 0.3, 6, [0.03]), Sample(False, error="e")], 2.0)
    assert (summary["output_tokens"], summary["failed"], summary["output_tokens_per_s"]) == (16, 1, 8.0)
    assert (summary["ttft_p50_ms"], summary["itl_p50_ms"]) == (100.0, 30.0)


def _dropping(times: int, message: str = "Server disconnected without sending a response."):
    """A handler that drops the first `times` requests the way a closed keep-alive connection does."""
    seen = []

    def handler(request):
        seen.append(request)
        if len(seen) <= times:
            raise httpx.RemoteProtocolError(message, request=request)
        return httpx.Response(200, content=_sse([{"choices": [{"text": "a"}]}]))
    return handler, seen


def test_a_connection_dropped_before_any_response_is_sent_again():
    handler, seen = _dropping(2)
    sample = _run(handler)
    assert sample.ok and sample.output_tokens == 1 and len(seen) == 3


def test_dropped_three_times_or_mid_answer_is_a_failure_not_a_retry():
    handler, seen = _dropping(3)
    assert not _run(handler).ok and len(seen) == 3
    handler, seen = _dropping(5, "peer closed connection without sending complete message body")
    failed = _run(handler)
    assert not failed.ok and "RemoteProtocolError" in failed.error and len(seen) == 1
