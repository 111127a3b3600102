"""Writes to the hub apiserver: one rate for this process, coalesced per object.

The gateway's writers keep hub objects in step with its agents: the ClusterProfile access
provider (:mod:`gateway.hub.clusterprofile`), the OCM ``TunnelConnected`` condition
(:mod:`gateway.hub.ocm`) and this process's instance Lease (:mod:`gateway.hub.instances`). A
reconnect storm of 10,000 clusters is 10,000 connect events; answering each with a write would be
tens of thousands of writes in seconds. Two rules bound it, as client-go's controllers do:

* **Coalescing** (:class:`DirtyKeys`): an event only marks an object dirty. A worker takes dirty
  objects one at a time, computes the object's desired state *then*, and writes only if the
  object it last saw differs: an object marked a thousand times before its turn costs one write
  of its latest state, and one that flapped back to what it already says costs none. Work is
  O(changed objects), never O(events).
* **Rate** (:class:`HubWriteRate`): a token bucket like client-go's
  ``flowcontrol.NewTokenBucketRateLimiter``: ``burst`` requests at once, then ``qps`` a second,
  shared by every writer of the process (``--hub-write-qps``, ``--hub-write-burst``). Waiters
  are served first come, first served, and each writer has one request waiting at most, so no
  writer starves another (the Lease renewal waits behind at most two requests). Writes and the
  per-object reads that prepare them (a GET before a patch, a page of a relist) take a token;
  watches and the instance listing, one request per period whatever the fleet, do not.

:class:`HubWrites` is the process's one instance of both counters and the rate: writers send
each request through :meth:`HubWrites.send` (which takes a token and counts the outcome) and
register their pending count, so ``/metrics`` shows ``hubproxy_hub_writes_pending{resource}``
and ``hubproxy_hub_writes_total{resource,outcome}`` (what a benchmark watches to see convergence).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from gateway.hub.config import DEFAULT_HUB_WRITE_BURST, DEFAULT_HUB_WRITE_QPS

log = logging.getLogger("hubproxy.gateway")

# Outcomes of a write, the values of the ``outcome`` label.
OK, CONFLICT, NOT_FOUND, FORBIDDEN, ERROR = "ok", "conflict", "not_found", "forbidden", "error"

K = TypeVar("K", bound=Hashable)


def outcome_of(exc: BaseException) -> str:
    """The ``outcome`` label of a failed hub request."""
    status = getattr(exc, "status", None)
    return {409: CONFLICT, 404: NOT_FOUND, 403: FORBIDDEN}.get(status or 0, ERROR)


class HubWriteRate:
    """A token bucket: at most ``burst + qps * t`` tokens are taken in any ``t`` seconds.

    ``clock`` and ``sleep`` are injectable (tests run it on a fake clock).
    """

    def __init__(self, qps: float = DEFAULT_HUB_WRITE_QPS, burst: int = DEFAULT_HUB_WRITE_BURST, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        if not qps > 0 or burst < 1:
            raise ValueError("qps must be positive and burst at least 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._updated = clock()
        self._turn = asyncio.Lock()  # FIFO: waiters are served in arrival order
        self.taken = 0
        self.waited = 0.0  # seconds spent waiting for a token, all writers together

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.qps)
        self._updated = now

    async def take(self) -> None:
        """Wait for a token and take it."""
        async with self._turn:
            self._refill()
            if self._tokens < 1.0:
                delay = (1.0 - self._tokens) / self.qps
                self.waited += delay
                await self._sleep(delay)
                self._refill()
            self._tokens -= 1.0
            self.taken += 1


class DirtyKeys(Generic[K]):
    """Objects waiting for their writer: each at most once, in the order first marked.

    :meth:`mark` queues a key now, :meth:`mark_at` at a later time (a grace that ends); a key
    already queued keeps its place, and of several times for one key the earliest counts.
    :meth:`next` waits for the next key that is due. Memory is O(keys), whatever the events.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ready: OrderedDict[K, None] = OrderedDict()
        self._due: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._order = 0
        self._wake = asyncio.Event()
        self.active = 0  # keys taken whose sync has not finished (drain counts them)

    def __len__(self) -> int:
        """Keys due now and not yet synced, those being synced included (the pending
        gauge: zero once every marked object is written)."""
        return len(self._ready) + self.active

    def mark(self, key: K) -> None:
        if key not in self._ready:
            self._ready[key] = None
            self._wake.set()

    def mark_at(self, key: K, when: float) -> None:
        earlier = self._due.get(key)
        if earlier is not None and earlier <= when:
            return
        self._due[key] = when
        self._order += 1
        heapq.heappush(self._heap, (when, self._order, key))
        self._wake.set()

    def mark_after(self, key: K, delay: float) -> None:
        self.mark_at(key, self._clock() + delay)

    def _promote(self) -> None:
        now = self._clock()
        while self._heap and self._heap[0][0] <= now:
            when, _, key = heapq.heappop(self._heap)
            if self._due.get(key) == when:
                del self._due[key]
                self.mark(key)

    def _until_due(self) -> float | None:
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # superseded by an earlier time, already promoted
        if not self._heap:
            return None
        return max(0.0, self._heap[0][0] - self._clock())

    def take(self) -> K | None:
        """The next due key, or None."""
        self._promote()
        if not self._ready:
            return None
        key, _ = self._ready.popitem(last=False)
        return key

    async def next(self) -> K:
        while True:
            key = self.take()
            if key is not None:
                return key
            self._wake.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the event's result
            # when a cancel arrives in the turn the event is set, so a cancelled writer kept
            # running (the flaky hang of test_writer_needs_no_more_than_its_rbac).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._until_due()):
                    await self._wake.wait()


class HubWrites:
    """This process's hub writes: the shared rate, outcomes by resource, pending counts."""

    def __init__(self, rate: HubWriteRate | None = None) -> None:
        self.rate = rate or HubWriteRate()
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.reads: Counter[str] = Counter()
        self._pending: dict[str, Callable[[], int]] = {}

    def register(self, resource: str, pending: Callable[[], int]) -> None:
        """A writer of ``resource`` reports how many of its objects wait for a write."""
        self._pending[resource] = pending

    def pending(self) -> dict[str, int]:
        return {resource: count() for resource, count in self._pending.items()}

    async def send(self, resource: str, request: Callable[[], Awaitable[Any]], *,
                   write: bool = True, take: bool = True) -> Any:
        """Take a token (unless the caller did: ``take=False``), send ``request()``, count its
        outcome; its exceptions propagate."""
        if take:
            await self.rate.take()
        if not write:
            self.reads[resource] += 1
            return await request()
        try:
            answer = await request()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.outcomes[(resource, outcome_of(exc))] += 1
            raise
        self.outcomes[(resource, OK)] += 1
        return answer

    def snapshot(self) -> dict[str, Any]:
        """Plain JSON values for ``/metrics`` (and for worker 0, with ``--workers``)."""
        return {"writes": [[r, o, n] for (r, o), n in sorted(self.outcomes.items())],
                "reads": dict(self.reads), "pending": self.pending(),
                "waited": round(self.rate.waited, 6)}


async def drain(dirty: DirtyKeys[K], sync: Callable[[K], Awaitable[None]], what: str,
                retry_after: float = 5.0) -> None:
    """Take dirty keys for ever and ``sync`` each; a key whose sync fails is tried again after
    ``retry_after`` seconds (the hub is down or refuses: the next resync would too).

    Yields to the event loop after every key, so a resync of 10,000 objects that need nothing
    never holds the loop.
    """
    failures = 0
    while True:
        key = await dirty.next()
        dirty.active += 1
        try:
            await sync(key)
            failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            if failures in (1, 10) or failures % 1000 == 0:
                log.warning("%s %s: not written (%s); retrying in %.0fs", what, key,
                            getattr(exc, "status", None) or type(exc).__name__, retry_after)
            dirty.mark_after(key, retry_after)
        finally:
            dirty.active -= 1
        await asyncio.sleep(0)
