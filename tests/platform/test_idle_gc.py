"""The API process collects garbage between bursts (llm_platform/idle_gc.py): the young
threshold is raised, and a collection runs on the turn after the last request in flight ends,
of the generation Python's counts call for, never while a request is in flight.

The collector's logic against a stand-in for the `gc` module (its counts are what the logic
reads), then the real collector around real requests on the direct path."""
import asyncio
import gc
import json

import pytest

from inference.views.direct import DirectGeneration
from llm_platform import idle_gc
from llm_platform.asgi_handler import InlineSignalsASGIHandler
from llm_platform.idle_gc import IdleCollector


class FakeGc:
    def __init__(self, count=(0, 0, 0), threshold=(700, 10, 10), enabled=True):
        self.count, self.threshold, self.enabled = list(count), tuple(threshold), enabled
        self.collected: list[int] = []

    def get_count(self):
        return tuple(self.count)

    def get_threshold(self):
        return self.threshold

    def set_threshold(self, *threshold):
        self.threshold = threshold

    def isenabled(self):
        return self.enabled

    def collect(self, generation):
        self.collected.append(generation)
        self.count = [0, self.count[1] + 1, self.count[2]] if generation == 0 else [0, 0, 0]


def test_install_raises_only_the_young_threshold():
    fake = FakeGc(threshold=(700, 10, 10))
    IdleCollector(20000, gc=fake).install()
    assert fake.threshold == (20000, 10, 10)


@pytest.mark.parametrize("count, generation", [
    ((5000, 3, 4), 0),  # the middle generation under its threshold: young only
    ((5000, 10, 4), 1),  # the middle over, the old not: the middle (and the young)
    ((5000, 10, 10), 2),  # both over: a full collection
])
def test_an_idle_collection_takes_the_generation_pythons_counts_call_for(count, generation):
    fake = FakeGc(count=count)
    collector = IdleCollector(20000, gc=fake)
    assert collector.collect_if_idle() == generation
    assert fake.collected == [generation]
    assert collector.collections[generation] == 1


def test_no_collection_while_a_request_is_in_flight_or_with_little_pending():
    busy = FakeGc(count=(5000, 0, 0))
    collector = IdleCollector(20000, gc=busy)
    collector.begin()
    assert collector.collect_if_idle() is None
    assert busy.collected == []
    few = FakeGc(count=(150, 0, 0))
    assert IdleCollector(20000, min_young=200, gc=few).collect_if_idle() is None
    disabled = FakeGc(count=(5000, 0, 0), enabled=False)  # gc.disable() is left alone
    assert IdleCollector(20000, gc=disabled).collect_if_idle() is None
    assert few.collected == [] and disabled.collected == []


@pytest.mark.asyncio
async def test_the_last_request_to_end_schedules_one_collection_on_the_next_turn():
    fake = FakeGc(count=(5000, 0, 0))
    collector = IdleCollector(20000, gc=fake)
    collector.begin()
    collector.begin()
    collector.end()  # one still in flight: nothing scheduled
    await asyncio.sleep(0)
    assert fake.collected == []
    collector.end()
    assert fake.collected == []  # not inside the request's own end
    collector.begin()  # a request that starts before that turn keeps it from collecting
    await asyncio.sleep(0)
    assert fake.collected == []
    collector.end()
    await asyncio.sleep(0)
    assert fake.collected == [0]


def test_zero_leaves_pythons_collector_as_it_is(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setattr(idle_gc, "_current", None)
    assert idle_gc.install(0) is None
    assert gc.get_threshold() == before and idle_gc.current() is None


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_requests_on_the_direct_path_are_in_flight_for_the_collector(auth, ready_replica,
                                                                           monkeypatch):
    """Real requests: while they run the collector counts them, and the end of the last
    one is followed by a real young collection (Python's own threshold put back after)."""
    threshold = gc.get_threshold()
    monkeypatch.setattr(idle_gc, "_current", None)
    collector = idle_gc.install(50_000)
    try:
        counted = []
        real_begin = collector.begin
        monkeypatch.setattr(collector, "begin",
                            lambda: (real_begin(), counted.append(collector.in_flight)))
        direct = DirectGeneration(InlineSignalsASGIHandler())
        body = json.dumps({"model": "chat-small", "max_tokens": 3,
                           "messages": [{"role": "user", "content": "Hi"}]}).encode()

        async def one():
            inbox = asyncio.Queue()
            inbox.put_nowait({"type": "http.request", "body": body, "more_body": False})
            sent = []

            async def send(message):
                sent.append(message)
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                     "method": "POST", "scheme": "http", "path": "/v1/generate",
                     "raw_path": b"/v1/generate", "query_string": b"", "root_path": "",
                     "headers": [(b"host", b"testserver"),
                                 (b"content-type", b"application/json"),
                                 *[(k.lower().encode(), v.encode()) for k, v in auth.items()]],
                     "client": ("127.0.0.1", 40000), "server": ("testserver", 80)}
            await direct(scope, inbox.get, send)
            return sent[0]["status"]

        garbage = []
        for _ in range(300):  # young objects pending, past min_young
            cycle = []
            cycle.append(cycle)
            garbage.append(cycle)
        del garbage
        assert await asyncio.gather(one(), one(), one()) == [200, 200, 200]
        assert max(counted) >= 2  # they overlapped, each counted while it ran
        assert collector.in_flight == 0
        await asyncio.sleep(0)  # the turn after the last end
        assert sum(collector.collections) >= 1
    finally:
        gc.set_threshold(*threshold)
