"""The fair-queuing scheduler, step by step (pure: every call takes ``now``)."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.hub.admission.fairness import FairQueues, QueueFull, Ticket, deal_hand


def flows_in_distinct_queues(queues: int, hand_size: int, count: int) -> list[str]:
    """``count`` flow names whose hands share no queue (so their requests never share one)."""
    chosen: list[str] = []
    used: set[int] = set()
    for i in range(10_000):
        name = f"user:u{i}"
        hand = set(deal_hand(name, queues, hand_size))
        if not hand & used:
            chosen.append(name)
            used |= hand
            if len(chosen) == count:
                return chosen
    raise AssertionError("no such flows")


def test_deal_hand_is_deterministic_distinct_and_in_range() -> None:
    hand = deal_hand("user:alice", 64, 8)
    assert hand == deal_hand("user:alice", 64, 8)
    assert len(set(hand)) == 8 and all(0 <= q < 64 for q in hand)
    hands = {deal_hand(f"user:u{i}", 64, 8) for i in range(200)}
    assert len(hands) == 200  # different flows, different hands
    # Every queue gets dealt to someone: the hash spreads flows over all queues.
    assert {q for h in hands for q in h} == set(range(64))


def test_a_free_seat_is_taken_at_once_and_released() -> None:
    fq = FairQueues(2, now=0.0)
    a = fq.arrive("user:a", 0.0)
    b = fq.arrive("user:b", 0.0)
    assert a.state == b.state == Ticket.EXECUTING and fq.executing == 2 and fq.waiting == 0
    assert a.waited == 0.0
    assert fq.finish(a, 0.5) == [] and fq.executing == 1
    assert fq.finish(a, 0.6) == []  # twice: nothing more
    assert fq.executing == 1


def test_when_seats_are_full_requests_wait_and_a_finish_dispatches_one() -> None:
    fq = FairQueues(1, now=0.0)
    first = fq.arrive("user:a", 0.0)
    second = fq.arrive("user:a", 0.1)
    assert second.state == Ticket.WAITING and fq.waiting == 1
    assert fq.finish(first, 0.3) == [second]
    assert second.state == Ticket.EXECUTING and second.waited == pytest.approx(0.2)
    assert fq.waiting == 0 and fq.executing == 1


def test_a_newcomer_is_served_before_a_flood_that_queued_first() -> None:
    a, b = flows_in_distinct_queues(64, 1, 2)
    fq = FairQueues(1, hand_size=1, now=0.0)
    running = fq.arrive(a, 0.0)
    flood = [fq.arrive(a, 0.0) for _ in range(10)]
    newcomer = fq.arrive(b, 0.01)
    assert all(t.state == Ticket.WAITING for t in [*flood, newcomer])
    # The flood's queue was charged for the request it runs; the newcomer's queue starts at R.
    assert fq.finish(running, 0.1) == [newcomer]


def test_two_backlogged_flows_alternate_whoever_queued_more() -> None:
    a, b = flows_in_distinct_queues(64, 1, 2)
    fq = FairQueues(1, hand_size=1, now=0.0)
    current = fq.arrive(a, 0.0)
    for _ in range(30):
        fq.arrive(a, 0.0)
    for _ in range(5):
        fq.arrive(b, 0.0)
    served: list[str] = []
    now = 0.0
    for _ in range(10):
        now += 0.01
        (current,) = fq.finish(current, now)
        served.append(current.flow)
    # Equal service times: b gets one seat in two until its 5 requests are done.
    assert served == [b, a, b, a, b, a, b, a, b, a]


def test_seats_are_shared_by_seat_time_so_slow_requests_get_fewer_turns() -> None:
    slow, fast = flows_in_distinct_queues(64, 1, 2)
    fq = FairQueues(1, hand_size=1, queue_length=200, estimate=0.05, now=0.0)
    current = fq.arrive(slow, 0.0)
    for _ in range(100):
        fq.arrive(slow, 0.0)
        fq.arrive(fast, 0.0)
    now = 0.0
    counts: Counter[str] = Counter()
    for _ in range(60):
        now += 0.04 if current.flow == slow else 0.01  # slow requests take 4x as long
        (current,) = fq.finish(current, now)
        counts[current.flow] += 1
    # Each flow gets about half of the seat's time: the fast one ~4x as many requests.
    assert counts[fast] >= 3 * counts[slow] > 0


def test_a_full_queue_refuses_and_other_flows_still_queue() -> None:
    a, b = flows_in_distinct_queues(64, 1, 2)
    fq = FairQueues(1, hand_size=1, queue_length=2, now=0.0)
    fq.arrive(a, 0.0)
    fq.arrive(a, 0.0)
    fq.arrive(a, 0.0)
    with pytest.raises(QueueFull) as refused:
        fq.arrive(a, 0.0)
    assert refused.value.status == 429 and "queue limit 2" in str(refused.value)
    assert fq.arrive(b, 0.0).state == Ticket.WAITING
    assert fq.waiting == 3


def test_a_flow_keeps_one_queue_and_a_newcomer_avoids_it() -> None:
    fq = FairQueues(1, queues=8, hand_size=3, queue_length=3, now=0.0)
    first = fq.arrive("user:a", 0.0)
    for _ in range(3):
        assert fq.arrive("user:a", 0.0).queue is first.queue
    with pytest.raises(QueueFull):  # its queue is full; the rest of its hand does not help
        fq.arrive("user:a", 0.0)
    assert fq.flows() == 1
    # Another flow takes the shortest queue of its own hand: never a's busy one while it has
    # an idle one.
    b_hand = deal_hand("user:b", 8, 3)
    other = fq.arrive("user:b", 0.0)
    assert other.queue.index in b_hand
    if set(b_hand) != {first.queue.index}:
        assert other.queue is not first.queue
    assert fq.flows() == 2


def test_a_flow_whose_requests_all_ended_may_land_elsewhere_next_time() -> None:
    fq = FairQueues(1, queues=8, hand_size=3, now=0.0)
    t = fq.arrive("user:a", 0.0)
    fq.finish(t, 0.1)
    assert fq.flows() == 0


def test_a_cancelled_request_leaves_its_queue_and_is_never_dispatched() -> None:
    fq = FairQueues(1, now=0.0)
    running = fq.arrive("user:a", 0.0)
    gone = fq.arrive("user:b", 0.0)
    stays = fq.arrive("user:c", 0.0)
    fq.cancel(gone, 0.1)
    assert gone.state == Ticket.DONE and fq.waiting == 1
    fq.cancel(gone, 0.2)  # twice: nothing more
    assert fq.finish(running, 0.3) == [stays]
    assert fq.waiting == 0 and fq.finish(stays, 0.4) == [] and fq.executing == 0


def test_the_virtual_clock_shares_the_seats_among_active_queues() -> None:
    a, b = flows_in_distinct_queues(64, 1, 2)
    fq = FairQueues(2, hand_size=1, now=0.0)
    fq.arrive(a, 0.0)
    assert fq.virtual_time == 0.0
    fq.arrive(b, 1.0)  # 1 s with one active queue and one seat wanted: R += 1
    assert fq.virtual_time == pytest.approx(1.0)
    fq.arrive(a, 2.0)  # 1 s, two queues, two seats wanted: R += 1
    assert fq.virtual_time == pytest.approx(2.0)
    fq.arrive(a, 3.0)  # 3 wanted, capped at 2 seats, two queues: R += 1
    assert fq.virtual_time == pytest.approx(3.0)


def test_an_idle_queue_banks_no_credit() -> None:
    a, b = flows_in_distinct_queues(64, 1, 2)
    fq = FairQueues(1, hand_size=1, now=0.0)
    # b keeps the seat busy for a long time while a is idle ...
    current = fq.arrive(b, 0.0)
    for _ in range(49):
        fq.arrive(b, 0.0)
    now = 0.0
    for _ in range(30):
        now += 1.0
        (current,) = fq.finish(current, now)
    # ... then a arrives with a backlog: it alternates with b, it does not take 50 turns in a row.
    for _ in range(10):
        fq.arrive(a, now)
    served = []
    for _ in range(6):
        now += 1.0
        (current,) = fq.finish(current, now)
        served.append(current.flow)
    assert served.count(a) <= 4 and served.count(b) >= 2


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        FairQueues(0)
    with pytest.raises(ValueError):
        FairQueues(1, queues=4, hand_size=5)
    with pytest.raises(ValueError):
        FairQueues(1, queue_length=0)
