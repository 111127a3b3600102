"""The hub write rate and the coalescing queue (gateway.hub.hubwrites), on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from gateway.hub.hubwrites import DirtyKeys, HubWriteRate, HubWrites, drain


class FakeClock:
    """Time that moves only when a writer sleeps (so the test runs in no time)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def test_rate_limit_is_honoured_writes_at_most_burst_plus_qps_times_t() -> None:
    """Three writers hammering one bucket (qps 5, burst 10): at every moment of a simulated
    minute, writes so far <= burst + qps * elapsed; and the bucket is not needlessly slow."""
    clock = FakeClock()
    rate = HubWriteRate(5.0, 10, clock=clock, sleep=clock.sleep)
    start = clock.now
    times: list[float] = []

    async def writer() -> None:
        while clock.now - start < 60:
            await rate.take()
            times.append(clock.now)

    await asyncio.gather(writer(), writer(), writer())
    for count, when in enumerate(times, start=1):
        assert count <= 10 + 5.0 * (when - start) + 1e-6, (count, when - start)
    assert len(times) >= 10 + 5 * 59  # the full rate was used
    assert times[9] == start  # the burst at once


async def test_waiters_are_served_in_arrival_order() -> None:
    clock = FakeClock()
    rate = HubWriteRate(1.0, 1, clock=clock, sleep=clock.sleep)
    order: list[str] = []

    async def take(name: str) -> None:
        await rate.take()
        order.append(name)

    await asyncio.gather(*(take(name) for name in ("lease", "profiles", "addons", "lease2")))
    assert order == ["lease", "profiles", "addons", "lease2"]


def test_the_rate_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        HubWriteRate(0.0, 1)
    with pytest.raises(ValueError):
        HubWriteRate(1.0, 0)


async def test_a_thousand_marks_of_one_key_are_one_sync_of_its_last_state() -> None:
    dirty: DirtyKeys[str] = DirtyKeys()
    state = {"c1": 0}
    synced: list[int] = []
    for flap in range(1000):
        state["c1"] = flap
        dirty.mark("c1")
    dirty.mark("c2")
    assert len(dirty) == 2

    async def sync(key: str) -> None:
        synced.append(state.get(key, -1))

    task = asyncio.ensure_future(drain(dirty, sync, "test"))
    await asyncio.sleep(0.05)
    task.cancel()
    assert synced == [999, -1] and len(dirty) == 0


async def test_a_key_due_later_waits_and_the_earliest_time_counts() -> None:
    clock = FakeClock()
    dirty: DirtyKeys[str] = DirtyKeys(clock)
    dirty.mark_at("c1", clock.now + 60)
    dirty.mark_at("c1", clock.now + 30)  # earlier: wins
    dirty.mark_at("c1", clock.now + 90)  # later: ignored
    assert dirty.take() is None and len(dirty) == 0
    clock.now += 29.9
    assert dirty.take() is None
    clock.now += 0.2
    assert dirty.take() == "c1" and dirty.take() is None
    clock.now += 100
    assert dirty.take() is None  # the superseded times do not come back


async def test_a_failing_sync_is_tried_again_later_not_in_a_loop() -> None:
    dirty: DirtyKeys[str] = DirtyKeys()
    calls: list[str] = []

    async def sync(key: str) -> None:
        calls.append(key)
        raise RuntimeError("hub down")

    dirty.mark("c1")
    task = asyncio.ensure_future(drain(dirty, sync, "test", retry_after=0.2))
    await asyncio.sleep(0.1)
    assert calls == ["c1"]
    await asyncio.sleep(0.25)
    task.cancel()
    assert calls == ["c1", "c1"]


async def test_outcomes_and_reads_are_counted_by_resource() -> None:
    class Conflict(Exception):
        status = 409

    writes = HubWrites(HubWriteRate(1000.0, 1000))
    dirty: DirtyKeys[str] = DirtyKeys()
    writes.register("clusterprofiles", lambda: len(dirty))
    dirty.mark("x")

    async def ok() -> str:
        return "written"

    async def conflict() -> None:
        raise Conflict()

    assert await writes.send("clusterprofiles", ok) == "written"
    with pytest.raises(Conflict):
        await writes.send("clusterprofiles", conflict)
    await writes.send("clusterprofiles", ok, write=False)
    snapshot = writes.snapshot()
    assert snapshot["writes"] == [["clusterprofiles", "conflict", 1],
                                  ["clusterprofiles", "ok", 1]]
    assert snapshot["reads"] == {"clusterprofiles": 1}
    assert snapshot["pending"] == {"clusterprofiles": 1}


async def test_a_cancelled_wait_stays_cancelled_when_a_key_arrives_in_the_same_turn() -> None:
    """A writer stopped while a key arrives ends. Python 3.11's wait_for returned the woken
    wait's result instead, so the writer ran on (test_writer_needs_no_more_than_its_rbac hung
    under load)."""
    for turns in range(4):
        dirty: DirtyKeys[str] = DirtyKeys()
        dirty.mark_after("later", 60.0)  # next() waits with a timeout
        waiter = asyncio.create_task(dirty.next())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        dirty.mark("now")
        for _ in range(turns):
            await asyncio.sleep(0)
        if waiter.cancel():  # still waiting: the cancel must win
            with pytest.raises(asyncio.CancelledError):
                await waiter
