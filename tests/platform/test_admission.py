"""The admission queue on the real Redis: tier order, fair share within a tier (and FIFO for
contrast), work conservation, the queue bound, the wait bound, cancellation, metrics; one
queue per model shared by its versions; waiters woken by notification (the fallback poll set
far beyond the tests' time, so an admission in time proves the wake-up), lost wake-ups."""
import asyncio
import time
import uuid

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from django.conf import settings

from inference.admission import (
    AdmissionQueue,
    FairShare,
    Fifo,
    QueueFull,
    QueueTimeout,
    Waiter,
)
from inference.metrics import admission_metrics
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def redis():
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    yield client
    await client.aclose()


# Far beyond any wait in these tests: a waiter admitted in time was woken, not polled.
NO_FALLBACK_S = 60.0


def make_queue(redis, policy=None, max_queue=100, queue_class=AdmissionQueue,
               **kwargs) -> AdmissionQueue:
    # A fresh prefix per test: its own counters and virtual clock.
    prefix = f"{settings.REDIS_KEY_PREFIX}{uuid.uuid4().hex[:6]}:"
    kwargs.setdefault("heartbeat_s", 2 * NO_FALLBACK_S)
    kwargs.setdefault("fallback_poll_s", NO_FALLBACK_S)
    return queue_class(redis, prefix, time.time, policy or FairShare(), max_queue=max_queue,
                       **kwargs)


async def waiting_tenants(redis, queue, model="m") -> list[str]:
    """The tenants of the tickets in `model`'s waiting hash, sorted. The Lua pump hands slots
    over atomically at each release (and enter), so this state says who was admitted."""
    tickets = await redis.hkeys(queue.keys(model)[0])
    return sorted(t.decode().split(":", 1)[0] for t in tickets)


async def until_waiting(redis, queue, tenants: list[str], model="m") -> None:
    """Wait until exactly `tenants` (with repeats) wait on `model`: the tasks have queued."""
    async def check():
        return await waiting_tenants(redis, queue, model) == sorted(tenants)
    await async_wait_until(check, 5.0, f"waiters {sorted(tenants)} queued on {model}")


async def _has_waiting(redis, queue, tenant: str, model="m") -> bool:
    return tenant in await waiting_tenants(redis, queue, model)


async def until_queued(redis, queue, n: int, model="m") -> None:
    """Wait until `n` waiters are in `model`'s waiting hash."""
    async def check():
        return await redis.hlen(queue.keys(model)[0]) == n
    await async_wait_until(check, 5.0, f"{n} waiters queued on {model}")


def waiter(tenant, priority=10, cost=10, max_wait_s=10.0) -> Waiter:
    return Waiter(tenant=tenant, priority=priority, cost_tokens=cost, max_wait_s=max_wait_s)


async def admission_order(queue, waiters: list[tuple[str, Waiter]]) -> list[str]:
    """With one slot held, queue `waiters` in this order, then release slots one by one and
    return the names in the order they were admitted."""
    holder = await queue.admit("m", 1, waiter("holder"), capacity=1)
    order: list[str] = []
    slots = {}

    async def wait_for(name, w):
        slots[name] = await queue.admit("m", 1, w, capacity=1)
        order.append(name)

    tasks = []
    for i, (name, w) in enumerate(waiters):
        tasks.append(asyncio.create_task(wait_for(name, w)))
        await until_queued(queue._redis, queue, i + 1)  # arrival order is the listed order
    assert order == []
    await holder.release()
    for k in range(len(waiters)):
        await async_wait_until(lambda k=k: len(order) > k, 5.0, f"admission #{k + 1}")
        # Nobody else got in while the one slot is held: the pump admits at the release, so
        # the rest are still in the waiting hash.
        assert await queue._redis.hlen(queue.keys("m")[0]) == len(waiters) - k - 1
        assert len(order) == k + 1
        await slots[order[k]].release()
    await asyncio.gather(*tasks)
    return order


async def test_higher_tier_first(redis):
    queue = make_queue(redis)
    order = await admission_order(queue, [("batch", waiter("b", priority=20)),
                                          ("standard", waiter("s", priority=10)),
                                          ("interactive", waiter("i", priority=0))])
    assert order == ["interactive", "standard", "batch"]


async def test_least_served_tenant_first_within_a_tier(redis):
    queue = make_queue(redis)
    burst = [(f"a{i}", waiter("A")) for i in range(3)]
    order = await admission_order(queue, [*burst, ("b0", waiter("B")), ("b1", waiter("B"))])
    # A arrived first with 3; after each A admission B has been served less.
    assert order == ["a0", "b0", "a1", "b1", "a2"]


async def test_fifo_policy_is_arrival_order(redis):
    queue = make_queue(redis, policy=Fifo())
    burst = [(f"a{i}", waiter("A")) for i in range(3)]
    order = await admission_order(queue, [*burst, ("b0", waiter("B"))])
    assert order == ["a0", "a1", "a2", "b0"]


async def test_returning_tenant_gets_no_credit_for_idle_time(redis):
    queue = make_queue(redis)
    for _ in range(5):  # A alone: served 50 virtual tokens, all idle capacity (work-conserving)
        await (await queue.admit("m", 1, waiter("A"), capacity=1)).release()
    # B arrives after A's solo run: caught up to the virtual clock, so it does not get 5 turns.
    order = await admission_order(queue, [("a", waiter("A")), ("b0", waiter("B")),
                                          ("b1", waiter("B"))])
    assert order.index("a") < order.index("b1")


async def test_work_conserving_lone_tenant_fills_every_slot(redis):
    queue = make_queue(redis)
    slots = [await asyncio.wait_for(queue.admit("m", 1, waiter("A"), capacity=3), 1.0)
             for _ in range(3)]
    assert all(s.waited_s < 0.5 for s in slots)
    for slot in slots:
        await slot.release()


async def test_queue_full_and_wait_bound(redis):
    queue = make_queue(redis, max_queue=1)
    holder = await queue.admit("m", 1, waiter("A"), capacity=1)
    started = time.monotonic()
    task = asyncio.create_task(queue.admit("m", 1, waiter("B", max_wait_s=0.3), capacity=1))
    await until_waiting(redis, queue, ["B"])
    with pytest.raises(QueueFull):  # one waiting already: the bound is 1
        await queue.admit("m", 1, waiter("C"), capacity=1)
    with pytest.raises(QueueTimeout):
        await task
    assert 0.3 <= time.monotonic() - started < 1.0
    waiting_key = queue.keys("m")[0]
    assert await redis.hlen(waiting_key) == 0  # the timed-out waiter left
    text = await admission_metrics(redis, queue)
    assert 'llmp_admission_rejected_total{model="m",reason="full"} 1' in text
    assert 'llmp_admission_rejected_total{model="m",reason="timeout"} 1' in text
    assert 'llmp_admission_slots_in_use{model="m"} 1' in text
    await holder.release()


async def test_cancelled_waiter_leaves_and_slot_goes_on(redis):
    queue = make_queue(redis)
    holder = await queue.admit("m", 1, waiter("A"), capacity=1)
    cancelled = asyncio.create_task(queue.admit("m", 1, waiter("B"), capacity=1))
    patient = asyncio.create_task(queue.admit("m", 1, waiter("C"), capacity=1))
    await until_waiting(redis, queue, ["B", "C"])
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    text = await admission_metrics(redis, queue)
    assert 'llmp_admission_queue_depth{model="m"} 1' in text
    await holder.release()
    slot = await asyncio.wait_for(patient, 1.0)
    await slot.release()
    text = await admission_metrics(redis, queue)
    assert 'llmp_admission_wait_seconds_count{model="m"} 2' in text


async def test_dead_waiter_is_never_handed_a_slot(redis):
    clock = [1_000_000.0]
    prefix = f"{settings.REDIS_KEY_PREFIX}{uuid.uuid4().hex[:6]}:"
    queue = AdmissionQueue(redis, prefix, lambda: clock[0], FairShare(), max_queue=10,
                           heartbeat_s=5.0)
    holder = await queue.admit("m", 1, waiter("A"), capacity=1)
    # A process that queued (ahead of B: higher tier) and then died: it never polls again.
    await queue._enter(keys=[*queue.keys("m"), queue.models_key()], args=[
        int(clock[0] * 1000), 900_000, "unused:", "D:1:dead", 0, "D", 1, 1, 1, 0, 10, 5000, "m"])
    clock[0] += 10  # its heartbeat lapses
    live = asyncio.create_task(queue.admit("m", 1, waiter("B"), capacity=1))
    await async_wait_until(lambda: _has_waiting(redis, queue, "B"), 5.0, "B queued")
    await holder.release()
    slot = await asyncio.wait_for(live, 1.0)
    assert await redis.zscore(queue.keys("m")[1], "D:1:dead") is None
    await slot.release()


async def test_headroom_only_for_a_tenant_with_nothing_running(redis):
    queue = make_queue(redis)
    a0 = await queue.admit("m", 1, waiter("A"), capacity=1, headroom=1)
    a1 = asyncio.create_task(queue.admit("m", 1, waiter("A"), capacity=1, headroom=1))
    await until_waiting(redis, queue, ["A"])
    assert not a1.done()  # A already runs: no headroom for A
    b0 = await asyncio.wait_for(queue.admit("m", 1, waiter("B"), capacity=1, headroom=1), 1.0)
    b1 = asyncio.create_task(queue.admit("m", 1, waiter("B"), capacity=1, headroom=1))
    await until_waiting(redis, queue, ["A", "B"])
    assert not b1.done()  # capacity + headroom reached
    await a0.release()
    # One slot free: a1 and b1 both waiting, A and B both served once: arrival order.
    slot = await asyncio.wait_for(a1, 1.0)
    assert not b1.done()
    for s in (slot, b0):
        await s.release()
    await (await asyncio.wait_for(b1, 1.0)).release()


async def test_headroom_for_a_tenant_under_its_fair_share_of_the_slots(redis):
    """4 slots + 2 headroom: A's burst holds the 4; B, which runs 1 of its fair 2, gets a
    headroom slot for a second request at once; A (over its share) waits for a slot."""
    queue = make_queue(redis)
    a_slots = [await queue.admit("m", 1, waiter("A"), capacity=4, headroom=2) for _ in range(4)]
    a_more = asyncio.create_task(queue.admit("m", 1, waiter("A"), capacity=4, headroom=2))
    await until_waiting(redis, queue, ["A"])
    assert not a_more.done()  # A runs 4 of the 4 slots: over any share
    b0 = await asyncio.wait_for(queue.admit("m", 1, waiter("B"), capacity=4, headroom=2), 1.0)
    b1 = await asyncio.wait_for(queue.admit("m", 1, waiter("B"), capacity=4, headroom=2), 1.0)
    b2 = asyncio.create_task(queue.admit("m", 1, waiter("B"), capacity=4, headroom=2))
    await until_waiting(redis, queue, ["A", "B"])
    assert not b2.done()  # capacity + headroom reached (and B at its share of 2)
    assert not a_more.done()
    # Headroom lets in flight exceed the capacity: a capacity slot frees only below 4 running.
    for s in a_slots[:2]:
        await s.release()
    assert await waiting_tenants(redis, queue) == ["A", "B"]  # the releases admitted nobody
    assert not a_more.done() and not b2.done()  # 4 running (A 2, B 2): both at their share
    await a_slots[2].release()
    # 3 running: one slot. B was caught up to the virtual clock when it arrived (30) and has
    # been served 2 x 10 since; A has 40: A's waiter is the least served.
    a4 = await asyncio.wait_for(a_more, 1.0)
    assert not b2.done()
    await a_slots[3].release()
    slot = await asyncio.wait_for(b2, 1.0)
    for s in (slot, b0, b1, a4):
        await s.release()


async def test_waiter_is_woken_by_the_release(redis):
    queue = make_queue(redis)  # fallback poll after 60 s: only a wake-up admits in time
    holder = await queue.admit("m", 1, waiter("A"), capacity=1)
    task = asyncio.create_task(queue.admit("m", 1, waiter("B"), capacity=1))
    await until_waiting(redis, queue, ["B"])
    assert not task.done()
    await holder.release()
    slot = await asyncio.wait_for(task, 5.0)
    # The wake-up was a message, not a key: nothing lingers in Redis for the next waiter.
    assert not [k async for k in redis.scan_iter(match=queue.keys("m")[0][:-len("waiting")] + "wake*")]
    assert queue.wakeups._events == {}
    await slot.release()


class PollCountingQueue(AdmissionQueue):
    """Counts its waits: a waiter waits again only after a poll that did not admit it."""

    num_waits = 0

    async def wait_for_wake(self, model, ticket, timeout_s):
        self.num_waits += 1
        return await super().wait_for_wake(model, ticket, timeout_s)


class DeafQueue(AdmissionQueue):
    """Never hears a wake-up (as if every push were lost): only the fallback poll admits."""

    num_waits = 0

    async def wait_for_wake(self, model, ticket, timeout_s):
        self.num_waits += 1
        await asyncio.sleep(timeout_s)  # the fake's behaviour: it hears nothing till the timeout
        return False


async def test_lost_wake_up_is_covered_by_the_fallback_poll(redis):
    queue = make_queue(redis, queue_class=DeafQueue, fallback_poll_s=0.05, heartbeat_s=5.0)
    holder = await queue.admit("m", 1, waiter("A"), capacity=1)
    task = asyncio.create_task(queue.admit("m", 1, waiter("B"), capacity=1))
    await async_wait_until(lambda: queue.num_waits >= 2, 5.0, "two fallback polls")
    assert not task.done() and queue.num_waits >= 2  # it polls while it waits
    await holder.release()
    slot = await asyncio.wait_for(task, 5.0)
    await slot.release()


async def test_versions_of_a_model_share_one_queue_bound(redis):
    queue = make_queue(redis, max_queue=1)
    v1 = await queue.admit("m", 1, waiter("A"), capacity=1)
    v2 = await queue.admit("m", 2, waiter("A"), capacity=1)  # a canary version: its own slots
    task = asyncio.create_task(queue.admit("m", 1, waiter("B"), capacity=1))
    await until_waiting(redis, queue, ["B"])
    with pytest.raises(QueueFull):  # the one queue place is taken, whatever the version
        await queue.admit("m", 2, waiter("C"), capacity=1)
    other_model = await asyncio.wait_for(queue.admit("n", 1, waiter("C"), capacity=1), 1.0)
    await v1.release()
    await (await asyncio.wait_for(task, 5.0)).release()
    for slot in (v2, other_model):
        await slot.release()


async def test_a_freed_slot_goes_to_the_best_waiter_of_its_version(redis):
    queue = make_queue(redis)
    v1 = await queue.admit("m", 1, waiter("A"), capacity=1)
    v2 = await queue.admit("m", 2, waiter("A"), capacity=1)
    admitted: list[str] = []

    async def wait_for(name, version, w):
        slot = await queue.admit("m", version, w, capacity=1)
        admitted.append(name)
        return slot

    # For version 1: an interactive and a batch waiter; for version 2: a standard one.
    tasks = {"v1-interactive": asyncio.create_task(wait_for("v1-interactive", 1, waiter("I", 0))),
             "v1-batch": asyncio.create_task(wait_for("v1-batch", 1, waiter("X", 20))),
             "v2-standard": asyncio.create_task(wait_for("v2-standard", 2, waiter("S", 10)))}
    await until_waiting(redis, queue, ["I", "S", "X"])
    await v2.release()  # version 2 frees: its waiter goes, though version 1 has a higher tier
    slot_s = await asyncio.wait_for(tasks["v2-standard"], 5.0)
    assert admitted == ["v2-standard"]
    await v1.release()  # version 1 frees: tier order among its waiters
    slot_i = await asyncio.wait_for(tasks["v1-interactive"], 5.0)
    assert await waiting_tenants(redis, queue) == ["X"]  # the batch waiter was not let in
    assert admitted == ["v2-standard", "v1-interactive"]
    await slot_i.release()
    await (await asyncio.wait_for(tasks["v1-batch"], 5.0)).release()
    await slot_s.release()


async def test_fair_share_counts_service_on_every_version(redis):
    queue = make_queue(redis)
    # A was served on version 2 (the canary); on version 1, B (served less) goes first.
    await (await queue.admit("m", 2, waiter("A", cost=100), capacity=1)).release()
    holder = await queue.admit("m", 1, waiter("H", cost=1000), capacity=1)
    order: list[str] = []

    async def wait_for(name, w):
        slot = await queue.admit("m", 1, w, capacity=1)
        order.append(name)
        await slot.release()

    a = asyncio.create_task(wait_for("A", waiter("A")))
    await until_waiting(redis, queue, ["A"])
    b = asyncio.create_task(wait_for("B", waiter("B")))
    await until_waiting(redis, queue, ["A", "B"])
    await holder.release()
    await asyncio.wait_for(asyncio.gather(a, b), 5.0)
    assert order == ["B", "A"]


class Clock:
    """An injected wall clock the test moves (slot leases are compared against it)."""

    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_slot_is_a_lease_reclaimed_after_its_ttl_unless_refreshed(redis):
    clock = Clock()
    prefix = f"{settings.REDIS_KEY_PREFIX}{uuid.uuid4().hex[:6]}:"
    queue = PollCountingQueue(redis, prefix, clock, FairShare(), max_queue=10,
                              heartbeat_s=60.0, slot_ttl_s=30.0, fallback_poll_s=0.05)
    kept = await queue.admit("m", 1, waiter("alive"), capacity=2)
    dead = await queue.admit("m", 1, waiter("dead"), capacity=2)  # its holder never refreshes
    clock.now += 20
    assert await kept.refresh()
    task = asyncio.create_task(queue.admit("m", 1, waiter("next", max_wait_s=1000), capacity=2))
    # Each wait after the first follows a poll that found no slot: two such polls ran.
    await async_wait_until(lambda: queue.num_waits >= 3, 5.0, "two polls of the waiter")
    assert not task.done()  # both slots still held
    clock.now += 15  # the dead holder's lease ran out; the live one was refreshed 15 s ago
    slot = await asyncio.wait_for(task, 5.0)  # the waiter's poll reclaimed the dead slot
    assert not await dead.refresh()  # gone for good: a refresh never re-creates it
    assert await kept.refresh()
    for s in (kept, slot):
        await s.release()
    assert await redis.zcard(queue.keys("m")[1]) == 0


async def test_an_entry_admitted_without_the_pump_keeps_the_pumps_books(redis):
    """Nobody waiting and fewer running than the version's capacity: the entry takes its slot
    without the pump's scan of every ticket. Its books (virtual time and clock, the entry
    counters, the wait histogram) are those the pump keeps for the same admission: the same
    sequence of entries on two queues, one where the last entry goes through the pump (every
    slot of the model is taken, though version 1 has a free one), one where it does not. The
    earlier entries find their tenant at or behind the virtual clock; the last one finds B
    ahead of it (served 11, clock 0), so the clock moves."""
    async def books(capacity_v1: int) -> tuple:
        queue = make_queue(redis)
        for tenant, cost in (("A", 30), ("B", 11)):
            earlier = await queue.admit("m", 1, waiter(tenant, cost=cost), capacity=5)
            await earlier.release()
        other = await queue.admit("m", 2, waiter("C", cost=7), capacity=5)  # a canary's slot
        slot = await queue.admit("m", 1, waiter("B", cost=11), capacity=capacity_v1)
        assert not slot.queued
        keys = queue.keys("m")
        running = sorted(t.decode().split(":")[0] for t in await redis.zrange(keys[1], 0, -1))
        state = (await redis.hgetall(keys[2]), await redis.hgetall(keys[3]), running)
        await slot.release()
        await other.release()
        return state

    through_pump = await books(capacity_v1=1)  # 1 running (C's) is not fewer than 1
    direct = await books(capacity_v1=2)
    assert direct == through_pump
    vtime, stats, running = direct
    assert (vtime[b"A"], vtime[b"B"], vtime[b"C"], vtime[b"__clock"]) == \
        (b"30", b"22", b"7", b"11")
    assert stats[b"seq"] == b"4" and stats[b"seq:1"] == b"3" and stats[b"count"] == b"4"
    assert stats[b"b1"] == b"4" and b"sum_ms" not in stats  # four waits of 0 ms
    assert running == ["B", "C"]
