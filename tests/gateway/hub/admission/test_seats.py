"""The asyncio side of fair queuing: seats now or later, timeouts, clients that leave."""

from __future__ import annotations

import asyncio

import pytest

from gateway.hub.admission.seats import MAX_FLOW_LABELS, OTHER_FLOW, Seat, SeatRefused, Seats


async def test_a_free_seat_is_given_at_once_and_passed_on_when_released() -> None:
    seats = Seats(1, max_wait=5)
    first = seats.take("user:a")
    assert isinstance(first, Seat) and seats.executing == 1
    later = seats.take("user:b")
    assert isinstance(later, asyncio.Future) and not later.done() and seats.waiting == 1
    first.release()
    first.release()  # idempotent: the second seat is not freed by it
    second = await asyncio.wait_for(later, 1)
    assert seats.executing == 1 and seats.waiting == 0 and seats.queued_total == 1
    second.release()
    assert seats.executing == 0
    assert sum(seats.waits.counts) == 1  # the wait was observed


async def test_a_request_that_waits_too_long_is_refused_with_429() -> None:
    seats = Seats(1, max_wait=0.05)
    held = seats.take("user:a")
    assert isinstance(held, Seat)
    waiting = seats.take("user:b")
    assert isinstance(waiting, asyncio.Future)
    with pytest.raises(SeatRefused) as refused:
        await asyncio.wait_for(waiting, 2)
    assert refused.value.status == 429 and refused.value.retry_after == 1
    assert seats.waiting == 0 and seats.refused["timeout"] == 1
    assert seats.refused_flows == {"user:b": 1}
    held.release()
    assert seats.executing == 0


async def test_a_full_queue_refuses_at_once() -> None:
    seats = Seats(1, queues=1, hand_size=1, queue_length=1, max_wait=5)
    held = seats.take("user:a")
    waiting = seats.take("user:a")
    with pytest.raises(SeatRefused):
        seats.take("user:a")
    assert seats.refused["queue_full"] == 1
    assert isinstance(held, Seat) and isinstance(waiting, asyncio.Future)
    held.release()
    (await waiting).release()
    assert seats.executing == seats.waiting == 0


async def test_a_client_that_leaves_while_waiting_leaves_its_queue() -> None:
    seats = Seats(1, max_wait=5)
    held = seats.take("user:a")
    gone = seats.take("user:b")
    stays = seats.take("user:c")
    assert isinstance(held, Seat) and isinstance(gone, asyncio.Future)
    assert isinstance(stays, asyncio.Future)
    gone.cancel()
    held.release()  # may run before the cancellation's callback: the seat must still go on
    seat = await asyncio.wait_for(stays, 1)
    await asyncio.sleep(0)
    assert seats.waiting == 0 and seats.executing == 1
    seat.release()
    assert seats.executing == 0


async def test_refusals_by_flow_are_bounded_and_name_no_passthrough_token() -> None:
    seats = Seats(1, queues=1, hand_size=1, queue_length=1, max_wait=5)
    held = seats.take("user:a")
    waiting = seats.take("user:a")
    for i in range(MAX_FLOW_LABELS + 5):
        with pytest.raises(SeatRefused):
            seats.take(f"user:u{i}")
    with pytest.raises(SeatRefused):
        seats.take("passthrough:0123abcd")
    assert len(seats.refused_flows) == MAX_FLOW_LABELS + 1
    assert seats.refused_flows[OTHER_FLOW] == 6  # 5 users past the bound + the passthrough
    assert not any(k.startswith("passthrough:") for k in seats.refused_flows)
    assert isinstance(held, Seat) and isinstance(waiting, asyncio.Future)
    held.release()
    (await waiting).release()
