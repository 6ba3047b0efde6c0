"""Steady streaming load from several tenants through the official `openai` client, and what
became of each request.

Every request streams /v1/chat/completions (16 tokens by default) with an Idempotency-Key of its
own and `stream_options.include_usage`; its system message starts with the request's unique
name, so no two prompts share a prefix-cache block (only a retried cut stream finds its own
prompt in the cache). The client never retries by itself (`max_retries=0`): the
benchmark sees every failure as it happened.

Outcomes (one per request):
  completed          the stream ended with a finish_reason chunk and the usage chunk;
  failed_with_error  an HTTP error with a JSON error body, or an SSE error event;
  cut_by_crash       a connection failure while the API process was killed (in flight at the
                     kill): retried with the same Idempotency-Key once the API is back, the
                     retry's own result recorded in `retry`;
  refused_api_down   the connection was refused because the API process was down (sent after
                     the kill, before the restart): never accepted, so not in `accepted`;
  lost               anything else: past the hang bound, a stream that ended without its final
                     chunk, a connection failure with no API crash to explain it.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
import openai

from benchmarks.chaos.stack import MODEL

SUBJECTS = ["a lighthouse", "a fox", "the moon", "a robot", "a river", "an old clock",
            "a kettle", "a glacier"]


@dataclass
class RetryResult:
    outcome: str  # succeeded | conflict_until_timeout | failed
    attempts: int
    conflicts: int  # 409 answers seen
    seconds: float  # from the first retry to the result
    detail: str = ""


@dataclass
class Record:
    name: str
    tenant: int
    start: float  # seconds since the run's t0 (time.monotonic based)
    end: float = -1.0
    outcome: str = "in_flight"
    detail: str = ""
    status: int = 0
    error_code: str = ""
    first_token: float = -1.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    connection_failure: bool = False  # a transport failure (not an answer)
    connect_refused: bool = False  # the TCP connection itself failed
    kind: str = "load"  # load | poison | calibrate | warmup
    retry: RetryResult | None = None

    @property
    def latency(self) -> float:
        return self.end - self.start


@dataclass
class Crash:
    """One kill of the API process: requests failing on the connection around it are cut.
    `ready` is set once the restarted API answers (`ready_at` then holds the time)."""

    killed_at: float
    ready_at: float | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class LoadClient:
    base_url: str
    keys: list[str]
    max_tokens: int
    hang_bound_s: float
    retry_timeout_s: float
    clock: callable  # seconds since t0
    records: list[Record] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)
    run_tag: str = ""

    def __post_init__(self):
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
        # One OpenAI client per tenant; no keep-alive, so a restarted API is reached at once.
        self._http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(
            self.hang_bound_s, connect=5.0))
        self._clients = [openai.AsyncOpenAI(api_key=key, base_url=self.base_url + "/v1",
                                            max_retries=0, http_client=self._http)
                         for key in self.keys]

    async def aclose(self) -> None:
        await self._http.aclose()

    def body(self, record: Record, **overrides) -> dict:
        subject = SUBJECTS[hash(record.name) % len(SUBJECTS)]
        body = {"model": MODEL, "max_tokens": self.max_tokens, "temperature": 0.0,
                # The request's own number comes first: its first KV block is unique.
                "messages": [{"role": "system", "content":
                              f"{record.name.split('-', 1)[1]} of run {record.name.split('-')[0]}:"
                              " you answer in one short sentence."},
                             {"role": "user", "content": f"Say something about {subject}."}]}
        body.update(overrides)
        return body

    def new_record(self, tenant: int, kind: str = "load") -> Record:
        record = Record(f"{self.run_tag}-{kind[0]}{len(self.records)}", tenant, self.clock(),
                        kind=kind)
        self.records.append(record)
        return record

    async def send(self, tenant: int, kind: str = "load", **overrides) -> Record:
        record = self.new_record(tenant, kind)
        body = self.body(record, **overrides)
        await self._attempt(record, body, idempotency_key=record.name)
        crash = self._classify_connection_failure(record)
        if record.outcome == "cut_by_crash":
            try:
                await asyncio.wait_for(crash.ready.wait(), self.retry_timeout_s + 120)
            except asyncio.TimeoutError:
                record.retry = RetryResult("failed", 0, 0, 0.0, "the API never came back")
                return record
            await self.retry_cut(record, self.retry_timeout_s)
        return record

    async def _attempt(self, record: Record, body: dict, idempotency_key: str) -> None:
        """Runs one streamed request into `record` (outcome, detail, tokens, end)."""
        try:
            await asyncio.wait_for(self._stream(record, body, idempotency_key),
                                   self.hang_bound_s)
        except asyncio.TimeoutError:
            record.outcome, record.detail = "lost", f"no end within {self.hang_bound_s:.0f} s"
        except openai.APIStatusError as exc:
            record.status = exc.status_code
            record.error_code = _error_code(exc.body)
            if isinstance(exc.body, dict) or record.error_code:
                record.outcome = "failed_with_error"
            else:
                record.outcome = "lost"
            record.detail = f"HTTP {exc.status_code} {record.error_code or str(exc)[:120]}"
        except openai.APIConnectionError as exc:
            record.outcome = "lost"
            record.connection_failure = True
            record.connect_refused = isinstance(exc.__cause__, httpx.ConnectError)
            record.detail = f"connection: {type(exc.__cause__ or exc).__name__}"
        except openai.APIError as exc:  # an SSE error event after the stream started
            record.outcome = "failed_with_error"
            record.error_code = _error_code(exc.body) or "stream_error"
            record.detail = f"SSE error {record.error_code}"
        except (httpx.HTTPError, OSError) as exc:
            record.outcome, record.connection_failure = "lost", True
            record.detail = f"connection: {type(exc).__name__}"
        except Exception as exc:  # noqa: BLE001 - anything else is a lost request, with its name
            record.outcome, record.detail = "lost", f"client: {exc!r}"[:200]
        record.end = self.clock()

    async def _stream(self, record: Record, body: dict, idempotency_key: str) -> None:
        client = self._clients[record.tenant]
        stream = await client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True},
            extra_headers={"Idempotency-Key": idempotency_key})
        finished = usage = False
        async for chunk in stream:
            if chunk.choices:
                choice = chunk.choices[0]
                if record.first_token < 0 and choice.delta and choice.delta.content:
                    record.first_token = self.clock()
                if choice.finish_reason:
                    finished = True
            if chunk.usage is not None:
                usage = True
                record.output_tokens = chunk.usage.completion_tokens
                record.prompt_tokens = chunk.usage.prompt_tokens
        record.status = 200
        if finished and usage:
            record.outcome = "completed"
        else:
            record.outcome = "lost"
            record.detail = ("stream ended without its final chunk" if not finished
                             else "stream ended without the usage chunk")

    def _classify_connection_failure(self, record: Record) -> Crash | None:
        """A transport failure is the API crash's doing when the API was killed while the
        request was in flight (cut) or it was down when the request was sent (refused).
        Returns that crash."""
        if record.outcome != "lost" or not record.connection_failure:
            return None
        for crash in self.crashes:
            down_until = crash.ready_at if crash.ready_at is not None else float("inf")
            if record.start < crash.killed_at <= record.end + 0.5:
                record.outcome = "cut_by_crash"
                return crash
            if crash.killed_at <= record.start <= down_until:
                record.outcome = "refused_api_down" if record.connect_refused else "cut_by_crash"
                return crash
        return None

    async def retry_cut(self, record: Record, timeout_s: float) -> None:
        """The client's retry of a cut stream: the same body and Idempotency-Key, again after
        each 409 (still in progress) until it succeeds, fails otherwise, or `timeout_s` passes."""
        body = self.body(record)
        start = self.clock()
        attempts = conflicts = 0
        while True:
            attempts += 1
            probe = Record(record.name, record.tenant, self.clock(), kind="retry")
            await self._attempt(probe, body, idempotency_key=record.name)
            if probe.outcome == "completed":
                record.retry = RetryResult("succeeded", attempts, conflicts,
                                           self.clock() - start)
                return
            if probe.status == 409:
                conflicts += 1
                if self.clock() - start >= timeout_s:
                    record.retry = RetryResult("conflict_until_timeout", attempts, conflicts,
                                               self.clock() - start, probe.detail)
                    return
                await asyncio.sleep(1.0)
                continue
            if probe.connection_failure and self.clock() - start < timeout_s:
                await asyncio.sleep(1.0)  # the API may still be coming back
                continue
            record.retry = RetryResult("failed", attempts, conflicts, self.clock() - start,
                                       probe.detail or probe.outcome)
            return


def _error_code(body) -> str:
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("code") or error.get("type") or "")
    return ""
