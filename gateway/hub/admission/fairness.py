"""Fair queuing of short requests between identities, as kube-apiserver's API Priority and
Fairness does it within one priority level (KEP-1040). Pure: no I/O, no clock of its own (every
call takes ``now``), so each step can be tested alone; ``gateway.hub.admission.seats`` is the
asyncio adapter.

The model:

* **Seats.** At most ``seats`` short requests execute at once (a request holds its seat from
  dispatch until its response ends). While a seat is free and nobody waits, a request takes one
  at once: an unloaded gateway never queues.
* **Flows and queues.** A flow is one identity (the hub user). There are ``queues`` queues; a
  flow is shuffle-sharded onto a *hand* of ``hand_size`` of them (a deterministic hash of the
  flow deals the hand). A flow that has no request in the scheduler joins the shortest queue of
  its hand (ties: the first dealt), and its later requests join the same queue for as long as
  it has requests there (waiting or executing). So a flow holds one queue -- one share of the
  seats, however many requests it sends -- and a newcomer avoids a busy flow's queue unless its
  whole hand is busy (probability ~ (busy queues/queues)^hand). Here we differ from
  kube-apiserver, which puts *each request* in the shortest queue of the hand, so one flow may
  hold up to ``hand_size`` shares: we have few flows (identities) and want one share each.
* **Queue length.** A queue holds at most ``queue_length`` waiting requests; a request whose
  chosen queue is full is rejected (:class:`QueueFull`; the gateway answers 429 with
  ``Retry-After``, as kube-apiserver does). How long a request may wait is the adapter's
  business (it calls :meth:`FairQueues.cancel` and answers 429 too).
* **Fair dispatch by virtual finish time.** A virtual clock ``R`` advances, while queues are
  active (holding waiting or executing requests), at ``min(seats wanted, seats) / active
  queues`` virtual seconds per real second: the service each active queue would get if the
  seats were shared equally. Each queue has ``next_start``, the virtual time at which its next
  request may start; a queue that becomes active starts at ``R`` (no credit banked while
  idle). When a seat frees, the waiting queue with the smallest virtual finish
  (``next_start`` + the estimated service time; the oldest head request on ties) is served, and
  its ``next_start`` advances by the estimate. When the request finishes, its queue is charged
  what it really used instead (seat-seconds: one seat for as long as it ran), so a flow of
  slow requests gets fewer of them than a flow of fast ones: seats are shared by seat-time, not
  by request count.

Every request has width one seat (kube-apiserver also estimates wider LISTs; we do not see
object counts). Memory: queues are fixed; hands are cached per flow in a bounded table.
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import ClassVar

from mypy_extensions import mypyc_attr

from gateway.hub.config import GatewayConfig

# The flags' defaults (gateway.hub.config): 64 queues and hands of 8, kube-apiserver's for a
# priority level. kube-apiserver allows 50 per queue, and spreads one flow over its hand of 8
# queues (up to 400 waiting); here an identity keeps one queue, so it gets a longer one (128).
DEFAULT_QUEUES = GatewayConfig.fair_queues
DEFAULT_HAND_SIZE = GatewayConfig.fair_hand_size
DEFAULT_QUEUE_LENGTH = GatewayConfig.fair_queue_length
# The service time charged at dispatch, corrected when the request ends (kube-apiserver guesses
# too: its estimated service duration).
ESTIMATED_SERVICE = 1.0
_MAX_CACHED_HANDS = 4096


@mypyc_attr(native_class=False)
class QueueFull(Exception):
    """The request's queue already holds ``queue_length`` waiting requests (429)."""

    status = 429

    def __init__(self, limit: int) -> None:
        super().__init__("too many requests of this identity are waiting for the gateway "
                         f"(queue limit {limit}), retry later")


def deal_hand(flow: str, queues: int, hand_size: int) -> tuple[int, ...]:
    """``hand_size`` distinct queue indices for ``flow``, from a hash of it (shuffle sharding):
    the same flow always gets the same hand, different flows mostly different ones."""
    value = int.from_bytes(hashlib.blake2b(flow.encode("utf-8"), digest_size=8).digest(), "big")
    deck = list(range(queues))
    hand = []
    for i in range(hand_size):
        value, pick = divmod(value, queues - i)
        hand.append(deck.pop(pick))
    return tuple(hand)


class Ticket:
    """One short request: waiting in a queue, executing in a seat, or done."""

    __slots__ = ("arrived", "dispatched", "flow", "queue", "seq", "state")

    WAITING: ClassVar[str] = "waiting"
    EXECUTING: ClassVar[str] = "executing"
    DONE: ClassVar[str] = "done"

    def __init__(self, flow: str, queue: _Queue, seq: int, arrived: float) -> None:
        self.flow = flow
        self.queue = queue
        self.seq = seq  # arrival order: the tie-break between equal virtual finish times
        self.arrived = arrived
        self.dispatched = arrived
        self.state = Ticket.WAITING

    @property
    def waited(self) -> float:
        """Seconds between arrival and dispatch (0 for a request seated at once)."""
        return self.dispatched - self.arrived


class _Queue:
    __slots__ = ("executing", "index", "next_start", "waiting")

    def __init__(self, index: int) -> None:
        self.index = index
        self.waiting: deque[Ticket] = deque()
        self.executing = 0
        self.next_start = 0.0

    @property
    def active(self) -> bool:
        return bool(self.waiting) or self.executing > 0


class _Placement:
    __slots__ = ("queue", "requests")

    def __init__(self, queue: _Queue) -> None:
        self.queue = queue
        self.requests = 1


class FairQueues:
    """The scheduler; see the module docstring. Callers (one event loop) own the ordering."""

    def __init__(self, seats: int, *, queues: int = DEFAULT_QUEUES,
                 hand_size: int = DEFAULT_HAND_SIZE, queue_length: int = DEFAULT_QUEUE_LENGTH,
                 estimate: float = ESTIMATED_SERVICE, now: float = 0.0) -> None:
        if seats < 1 or queues < 1 or queue_length < 1 or estimate <= 0:
            raise ValueError("seats, queues, queue_length and estimate must be positive")
        if not 1 <= hand_size <= queues:
            raise ValueError("hand_size must be between 1 and queues")
        self.seats = seats
        self.hand_size = hand_size
        self.queue_length = queue_length
        self.estimate = estimate
        self._queues = [_Queue(i) for i in range(queues)]
        self._hands: dict[str, tuple[int, ...]] = {}
        # flow -> its queue and its requests in the scheduler; bounded by those requests.
        self._placed: dict[str, _Placement] = {}
        self.executing = 0  # seats in use
        self.waiting = 0  # requests in queues
        self._active = 0  # queues with waiting or executing requests
        self._r = 0.0
        self._then = now
        self._seq = 0

    # --- the virtual clock -------------------------------------------------------------------

    @property
    def virtual_time(self) -> float:
        return self._r

    def _advance(self, now: float) -> None:
        elapsed = now - self._then
        self._then = now
        if elapsed > 0 and self._active:
            wanted = self.executing + self.waiting
            if wanted > self.seats:
                wanted = self.seats
            self._r += elapsed * wanted / self._active

    # --- requests ------------------------------------------------------------------------------

    def hand(self, flow: str) -> tuple[int, ...]:
        hand = self._hands.get(flow)
        if hand is None:
            if len(self._hands) >= _MAX_CACHED_HANDS:
                self._hands.clear()  # recomputed on demand: a cache, not state
            hand = self._hands[flow] = deal_hand(flow, len(self._queues), self.hand_size)
        return hand

    def arrive(self, flow: str, now: float, make: type[Ticket] = Ticket) -> Ticket:
        """A short request of ``flow`` arrives: the ticket (a ``make``, the adapter's
        subclass or a plain :class:`Ticket`) is EXECUTING (a seat was free and nobody waits)
        or WAITING. Raises :class:`QueueFull`."""
        self._advance(now)
        placed = self._placed.get(flow)
        queue = placed.queue if placed is not None else self._shortest(self.hand(flow))
        seated = not self.waiting and self.executing < self.seats
        if not seated and len(queue.waiting) >= self.queue_length:
            raise QueueFull(self.queue_length)
        self._seq += 1
        ticket = make(flow, queue, self._seq, now)
        if placed is None:
            self._placed[flow] = _Placement(queue)
        else:
            placed.requests += 1
        self._activate(queue)
        if seated:
            self._start(ticket, queue, now)
        else:
            queue.waiting.append(ticket)
            self.waiting += 1
        return ticket

    def finish(self, ticket: Ticket, now: float) -> list[Ticket]:
        """An executing request ended (however): its seat frees, its queue is charged the
        virtual time it really used. Returns the tickets now dispatched (EXECUTING)."""
        if ticket.state != Ticket.EXECUTING:
            return []
        self._advance(now)
        ticket.state = Ticket.DONE
        queue = ticket.queue
        queue.executing -= 1
        self.executing -= 1
        # Charged in seat-seconds, as kube-apiserver does: one seat for as long as it ran.
        used = now - ticket.dispatched
        queue.next_start -= self.estimate - used
        self._deactivate(queue)
        self._unplace(ticket.flow)
        return self._dispatch(now) if self.waiting else []

    def cancel(self, ticket: Ticket, now: float) -> None:
        """A waiting request leaves its queue (its client went, or it waited too long)."""
        if ticket.state != Ticket.WAITING:
            return
        self._advance(now)
        ticket.state = Ticket.DONE
        queue = ticket.queue
        queue.waiting.remove(ticket)
        self.waiting -= 1
        self._deactivate(queue)
        self._unplace(ticket.flow)

    def queue_sizes(self) -> list[int]:
        """Waiting requests per queue (for tests and metrics)."""
        return [len(q.waiting) for q in self._queues]

    # --- internals -----------------------------------------------------------------------------

    # _activate and _deactivate run for every short request: queue.active, spelled out.
    def _activate(self, queue: _Queue) -> None:
        if not queue.waiting and not queue.executing:
            self._active += 1
            queue.next_start = self._r  # no credit for the time it was idle

    def _shortest(self, hand: tuple[int, ...]) -> _Queue:
        """The shortest queue of a hand: fewest waiting, then fewest executing (as APF counts
        seats in use); the first dealt on ties. An empty idle queue ends the search (the common
        case: this runs for every short request)."""
        queues = self._queues
        best: _Queue | None = None
        best_key = (0, 0)
        for i in hand:
            queue = queues[i]
            if not queue.waiting and not queue.executing:
                return queue
            key = (len(queue.waiting), queue.executing)
            if best is None or key < best_key:
                best, best_key = queue, key
        assert best is not None
        return best

    def _unplace(self, flow: str) -> None:
        placed = self._placed[flow]
        placed.requests -= 1
        if not placed.requests:
            del self._placed[flow]

    def flows(self) -> int:
        """Flows with requests in the scheduler (waiting or executing)."""
        return len(self._placed)

    def _deactivate(self, queue: _Queue) -> None:
        if not queue.waiting and not queue.executing:
            self._active -= 1

    def _start(self, ticket: Ticket, queue: _Queue, now: float) -> None:
        ticket.state = Ticket.EXECUTING
        ticket.dispatched = now
        queue.executing += 1
        queue.next_start += self.estimate
        self.executing += 1

    def _dispatch(self, now: float) -> list[Ticket]:
        started = []
        while self.waiting and self.executing < self.seats:
            best: _Queue | None = None
            for queue in self._queues:
                if queue.waiting and (best is None or _finish_key(queue) < _finish_key(best)):
                    best = queue
            assert best is not None
            ticket = best.waiting.popleft()
            self.waiting -= 1
            self._start(ticket, best, now)
            started.append(ticket)
        return started


def _finish_key(queue: _Queue) -> tuple[float, int]:
    # Every request is one seat with the same estimate: the smallest virtual start is the
    # smallest virtual finish.
    return (queue.next_start, queue.waiting[0].seq)
