"""Keepalive for every session of an event loop from one timer (PROTOCOL.md §8, issue 22).

A timer per session, firing four times per keepalive interval, cost a few percent of a core per
thousand idle sessions on each side. Here:

* :class:`KeepaliveWheel` (pure, clock injected) files sessions by when they next need
  attention, in buckets ``tick`` seconds wide; taking the due ones costs O(sessions due), never
  O(sessions).
* Receiving never touches the wheel: a read only moves the session's ``last_received``. When a
  session's bucket comes due it decides from its own state (``Session.keepalive``: a PING after
  ``ping_after`` of silence, death after ``dead_after``, an RTT probe while streams are open)
  and names the time it wants to be looked at next, and is filed again. A session that keeps
  receiving is thus looked at once per ``ping_after`` and does nothing.
* :class:`LoopKeepalive` is the asyncio side: one per event loop and tick, one ``TimerHandle``
  armed for the earliest bucket.
* A loop that was blocked (a sweep running more than ``STALL`` late) has not read what arrived
  meanwhile, so silence then says nothing about the peers: for ``STALL_GRACE`` after such a
  sweep no session is declared dead (each is looked at again when the grace ends, after the
  loop has read its sockets). A frozen peer is still found, that much later.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger("hubproxy.tunnel")

MAX_TICK = 0.25  # seconds: a frozen peer is found within dead_after plus this
STALL = 1.0  # a sweep this late means the event loop was blocked
STALL_GRACE = 1.0  # after a blocked loop, no verdict of death for this long


def tick_for(ping_after: float, dead_after: float) -> float:
    """The bucket width for sessions with these settings (finer for short test intervals)."""
    return min(MAX_TICK, max(0.001, min(ping_after, dead_after) / 8))


class Filed(Protocol):
    """What the wheel needs of what it files: where it is filed (-1: nowhere)."""

    keepalive_slot: int


F = TypeVar("F", bound=Filed)


class KeepaliveWheel(Generic[F]):
    """Items filed by due time in ``tick``-wide buckets; pure (the caller passes ``now``).

    An item is in at most one bucket: filing it again moves it (the old entry is skipped when
    its bucket comes due), :meth:`remove` takes it out. Due times are rounded up to the next
    bucket boundary, and always into a bucket after ``now``'s, so an item filed while the due
    ones are being handled is never handled twice in one sweep.
    """

    def __init__(self, tick: float) -> None:
        self.tick = tick
        self._buckets: dict[int, list[F]] = {}
        self._order: list[int] = []  # heap of bucket numbers
        self.filed = 0  # items filed now

    def file(self, item: F, due: float, now: float) -> bool:
        """File ``item`` to come due at ``due``; True if it is now the earliest bucket."""
        slot = max(math.ceil(due / self.tick), math.floor(now / self.tick) + 1)
        if item.keepalive_slot == slot:
            return False
        if item.keepalive_slot < 0:
            self.filed += 1
        item.keepalive_slot = slot
        bucket = self._buckets.get(slot)
        if bucket is not None:
            bucket.append(item)
            return False
        self._buckets[slot] = [item]
        heapq.heappush(self._order, slot)
        return self._order[0] == slot

    def remove(self, item: F) -> None:
        if item.keepalive_slot >= 0:
            item.keepalive_slot = -1
            self.filed -= 1

    def next_due(self) -> float | None:
        """When the earliest bucket comes due (None: nothing filed)."""
        order = self._order
        while order and not self._live(order[0]):
            del self._buckets[heapq.heappop(order)]
        return order[0] * self.tick if order else None

    def pop_due(self, now: float) -> list[F]:
        """The items whose bucket is due at ``now``, each taken out of the wheel."""
        out: list[F] = []
        order = self._order
        while order and order[0] * self.tick <= now:
            slot = heapq.heappop(order)
            for item in self._buckets.pop(slot):
                if item.keepalive_slot == slot:
                    item.keepalive_slot = -1
                    out.append(item)
        self.filed -= len(out)
        return out

    def _live(self, slot: int) -> bool:
        return any(item.keepalive_slot == slot for item in self._buckets[slot])


class Watched(Filed, Protocol):
    """A session as the loop's keepalive sees it."""

    def keepalive_due(self, now: float, verdicts_from: float) -> float | None:
        """Do what is due at ``now`` and say when to look again (None: never, it ended).

        A peer silent for too long may be declared dead only from ``verdicts_from`` on; before
        that, return ``verdicts_from`` instead.
        """
        ...


class LoopKeepalive:
    """The sessions of one event loop (with one tick) and the one timer that serves them."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.loop = loop
        self.clock = clock
        self.wheel: KeepaliveWheel[Watched] = KeepaliveWheel(tick)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = math.inf
        self.verdicts_from = 0.0  # no death verdicts before this (after a blocked loop)
        self.stalls = 0

    def add(self, session: Watched, due: float) -> None:
        """Look at ``session`` at ``due`` (and then whenever it asks)."""
        if self.wheel.file(session, due, self.clock()):
            self._arm()

    def remove(self, session: Watched) -> None:
        self.wheel.remove(session)

    def _arm(self) -> None:
        due = self.wheel.next_due()
        if due is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer, self._timer_due = None, math.inf
            return
        if self._timer is not None:
            if due >= self._timer_due:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.loop.call_later(max(0.0, due - self.clock()), self._sweep)

    def _sweep(self) -> None:
        self._timer, due, self._timer_due = None, self._timer_due, math.inf
        now = self.clock()
        if now - due > STALL:
            # Blocked: what the peers sent meanwhile is still unread in the sockets.
            self.stalls += 1
            self.verdicts_from = now + STALL_GRACE
            log.warning("tunnel keepalive ran %.1fs late (the event loop was blocked): no "
                        "session is declared dead for the next %.1fs", now - due, STALL_GRACE)
        wheel = self.wheel
        for session in wheel.pop_due(now):
            try:
                again = session.keepalive_due(now, self.verdicts_from)
            except Exception:
                log.exception("tunnel keepalive failed for a session")
                continue
            if again is not None:
                wheel.file(session, again, now)
        self._arm()


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, LoopKeepalive]] = (
    weakref.WeakKeyDictionary())


def loop_keepalive(loop: asyncio.AbstractEventLoop, tick: float) -> LoopKeepalive:
    """The keepalive of ``loop`` for sessions with this ``tick`` (one per loop and tick)."""
    by_tick = _loops.get(loop)
    if by_tick is None:
        by_tick = _loops[loop] = {}
    keepalive = by_tick.get(tick)
    if keepalive is None:
        keepalive = by_tick[tick] = LoopKeepalive(loop, tick)
    return keepalive
