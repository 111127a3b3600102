"""Seats for short requests, shared fairly between identities: the asyncio side of
:mod:`gateway.hub.admission.fairness` (DESIGN §6 rule 7, fair sharing).

:meth:`Seats.take` gives a short request its :class:`Seat` at once when one is free and nobody
waits (the common case: no task, no timer), or a future that resolves to one when the fair
queuing dispatches it. A request that finds its queue full, or that waits longer than
``max_wait``, is refused with :class:`SeatRefused` (the gateway answers 429 with
``Retry-After``, as kube-apiserver's API Priority and Fairness does). A waiting request whose
client goes away cancels its future and leaves its queue. :meth:`Seat.release` (idempotent)
gives the seat back when the request's response ends, and hands it to the next request.

Long-running requests (watches, ``logs -f``, exec/attach/port-forward) never take a seat, as
kube-apiserver does not count them once started: they have their own per-identity cap
(:mod:`gateway.hub.admission.streams`).

Figures for ``/metrics``: seats in use, requests waiting, waits of the requests that queued,
refusals by reason and by flow. A flow label is ``user:<hub user>`` (``--token-passthrough``
requests all count as ``passthrough``); only the first ``MAX_FLOW_LABELS`` flows refused get
their own label (the rest count as ``_other``), so a caller cycling through identities cannot
grow the label set.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from mypy_extensions import mypyc_attr

from gateway.hub.admission.fairness import (
    DEFAULT_HAND_SIZE,
    DEFAULT_QUEUE_LENGTH,
    DEFAULT_QUEUES,
    FairQueues,
    QueueFull,
    Ticket,
)
from gateway.hub.config import GatewayConfig
from gateway.ops.metrics import FAIR_WAIT_BUCKETS, Histogram

# The flags' defaults (gateway.hub.config), kube-apiserver's: --max-requests-inflight, and a
# quarter of its 60 s request timeout.
DEFAULT_MAX_EXECUTING = GatewayConfig.max_executing_requests
DEFAULT_MAX_WAIT = GatewayConfig.fair_queue_wait
RETRY_AFTER = 1  # seconds, as kube-apiserver's 429s say
MAX_FLOW_LABELS = 20
OTHER_FLOW = "_other"


@mypyc_attr(native_class=False)
class SeatRefused(Exception):
    """No seat for this request: its queue is full, or it waited too long (429)."""

    status = 429
    retry_after = RETRY_AFTER


class Seat(Ticket):
    """One short request's ticket, which knows its :class:`Seats`: once it is executing (a
    seat), :meth:`release` frees the seat (once). One object per request, not a ticket and
    a seat wrapping it."""

    __slots__ = ("_seats",)
    _seats: Seats | None  # set by Seats.take as it arrives


    def release(self) -> None:
        seats, self._seats = self._seats, None
        if seats is not None:
            seats._finish(self)


class Seats:
    """See the module docstring."""

    def __init__(self, max_executing: int = DEFAULT_MAX_EXECUTING, *,
                 queues: int = DEFAULT_QUEUES, hand_size: int = DEFAULT_HAND_SIZE,
                 queue_length: int = DEFAULT_QUEUE_LENGTH, max_wait: float = DEFAULT_MAX_WAIT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.max_wait = max_wait
        self.scheduler = FairQueues(max_executing, queues=queues, hand_size=min(hand_size, queues),
                                    queue_length=queue_length, now=clock())
        self._waiters: dict[Ticket, tuple[asyncio.Future[Seat], asyncio.TimerHandle]] = {}
        self.refused: Counter[str] = Counter()  # by reason: queue_full, timeout
        self.refused_flows: Counter[str] = Counter()  # by flow, bounded (module docstring)
        self.waits = Histogram(FAIR_WAIT_BUCKETS)  # seconds waited by requests that queued
        self.queued_total = 0

    @property
    def limit(self) -> int:
        return self.scheduler.seats

    @property
    def executing(self) -> int:
        return self.scheduler.executing

    @property
    def waiting(self) -> int:
        return self.scheduler.waiting

    def take(self, flow: str) -> Seat | asyncio.Future[Seat]:
        """A seat now, or a future of one; raises :class:`SeatRefused` (queue full). The
        future fails with :class:`SeatRefused` after ``max_wait``; cancel it to leave."""
        try:
            ticket = self.scheduler.arrive(flow, self.clock(), Seat)
        except QueueFull as exc:
            self._count_refusal("queue_full", flow)
            raise SeatRefused(str(exc)) from None
        assert isinstance(ticket, Seat)
        ticket._seats = self
        if ticket.state == Ticket.EXECUTING:
            return ticket
        self.queued_total += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Seat] = loop.create_future()
        timer = loop.call_later(self.max_wait, self._expire, ticket)
        self._waiters[ticket] = (future, timer)
        future.add_done_callback(lambda f: self._left(ticket, f))
        return future

    def _left(self, ticket: Ticket, future: asyncio.Future[Seat]) -> None:
        if future.cancelled():  # the client went away while waiting
            self._drop_waiter(ticket)
            self.scheduler.cancel(ticket, self.clock())

    def _expire(self, ticket: Ticket) -> None:
        waiter = self._drop_waiter(ticket)
        if waiter is None:
            return
        self.scheduler.cancel(ticket, self.clock())
        self._count_refusal("timeout", ticket.flow)
        if not waiter[0].done():
            waiter[0].set_exception(SeatRefused(
                "the gateway is busy: this request waited too long for its turn, retry later"))

    def _drop_waiter(self, ticket: Ticket) -> tuple[asyncio.Future[Seat], Any] | None:
        waiter = self._waiters.pop(ticket, None)
        if waiter is not None:
            waiter[1].cancel()
        return waiter

    def _finish(self, ticket: Ticket) -> None:
        pending = self.scheduler.finish(ticket, self.clock())
        while pending:
            started = pending.pop()
            waiter = self._drop_waiter(started)
            if waiter is None or waiter[0].done():
                # Its client left between the dispatch and now: the seat goes on at once.
                pending += self.scheduler.finish(started, self.clock())
                continue
            self.waits.observe(started.waited)
            assert isinstance(started, Seat)
            waiter[0].set_result(started)

    def _count_refusal(self, reason: str, flow: str) -> None:
        self.refused[reason] += 1
        if not flow.startswith("user:"):
            flow = "passthrough"  # a keyed hash of a token is no label
        if flow not in self.refused_flows and len(self.refused_flows) >= MAX_FLOW_LABELS:
            flow = OTHER_FLOW
        self.refused_flows[flow] += 1

    def snapshot(self) -> dict[str, Any]:
        """Plain JSON values for ``/metrics`` (summed across workers)."""
        return {
            "limit": self.limit, "executing": self.executing, "waiting": self.waiting,
            "queued_total": self.queued_total, "refused": dict(self.refused),
            "refused_flows": dict(self.refused_flows), "waits": self.waits.to_json(),
        }
