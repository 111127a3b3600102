"""Keepalive from one timer per event loop (tunnel.liveness, issue 22).

The wheel and a session's keepalive decisions are pure and run on an injected clock; the loop
adapter runs on a fake loop (only ``call_later``); then real TLS sessions show that one timer
serves them all and that a frozen peer is still found on either side.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from tests.tunnel.conftest import Collector, session_pair
from tunnel import frames as f
from tunnel import liveness
from tunnel.errors import SessionClosed
from tunnel.liveness import KeepaliveWheel, LoopKeepalive, tick_for
from tunnel.session_state import Session, SessionConfig
from tunnel.targets import KubeAPITarget


class Item:
    def __init__(self, name: str) -> None:
        self.name = name
        self.keepalive_slot = -1

    def __repr__(self) -> str:
        return self.name


# The wheel -----------------------------------------------------------------------------------

def test_the_wheel_hands_out_only_what_is_due_rounded_up_to_its_tick() -> None:
    wheel: KeepaliveWheel[Item] = KeepaliveWheel(0.25)
    a, b, c = Item("a"), Item("b"), Item("c")
    wheel.file(a, 1.0, now=0.0)
    wheel.file(b, 1.1, now=0.0)  # rounded up to 1.25
    wheel.file(c, 3.0, now=0.0)
    assert wheel.filed == 3 and wheel.next_due() == 1.0
    assert wheel.pop_due(0.99) == []
    assert wheel.pop_due(1.0) == [a]
    assert wheel.pop_due(1.2) == []
    assert wheel.pop_due(1.25) == [b]
    assert wheel.next_due() == 3.0 and wheel.filed == 1


def test_filing_again_moves_an_item_and_remove_takes_it_out() -> None:
    wheel: KeepaliveWheel[Item] = KeepaliveWheel(0.5)
    a, b = Item("a"), Item("b")
    wheel.file(a, 1.0, now=0.0)
    wheel.file(a, 4.0, now=0.0)  # moved: its old bucket is skipped
    wheel.file(b, 1.0, now=0.0)
    wheel.remove(b)
    assert wheel.next_due() == 4.0  # buckets with nothing live are passed over
    assert wheel.pop_due(2.0) == [] and wheel.pop_due(4.0) == [a]
    assert wheel.filed == 0 and wheel.next_due() is None


def test_a_due_time_in_the_past_goes_to_the_next_bucket() -> None:
    """An item filed while the due ones are handled is never handled twice in one sweep."""
    wheel: KeepaliveWheel[Item] = KeepaliveWheel(0.25)
    a = Item("a")
    wheel.file(a, 0.0, now=10.0)
    assert wheel.pop_due(10.0) == []
    assert wheel.pop_due(10.25) == [a]


def test_a_sweep_costs_what_is_due_not_what_is_filed() -> None:
    wheel: KeepaliveWheel[Item] = KeepaliveWheel(0.25)
    rng = random.Random(1)
    items = [Item(str(i)) for i in range(10_000)]
    for item in items:
        wheel.file(item, rng.uniform(0, 3.0), now=0.0)
    taken = [len(wheel.pop_due(t / 4)) for t in range(1, 13)]
    assert sum(taken) == 10_000
    assert max(taken) < 1_000  # each quarter second hands out about a twelfth


# A session's keepalive decisions (sans-IO) ----------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pings(session: Session) -> int:
    return sum(1 for chunk in session.data_to_send() if bytes(chunk[4:5]) == bytes([f.PING]))


def pong_for(session: Session, seq: int) -> bytes:
    return f.encode_pong(seq.to_bytes(8, "big"))


def idle_session(ping_after: float = 3.0, dead_after: float = 8.0) -> tuple[Session, Clock]:
    clock = Clock()
    session = Session(SessionConfig(ping_after=ping_after, dead_after=dead_after), clock=clock)
    session.data_to_send()  # our SETTINGS
    return session, clock


def test_a_silent_peer_is_pinged_once_then_declared_dead() -> None:
    session, clock = idle_session()
    assert session.keepalive(0.0) == 3.0 and pings(session) == 0
    clock.now = 3.0
    assert session.keepalive(3.0) == 6.0  # pinged; look again when an answer would allow more
    assert pings(session) == 1
    clock.now = 6.0
    assert session.keepalive(6.0) == 8.0 and pings(session) == 0  # one unanswered at a time
    assert session.keepalive(8.0) is None  # dead_after without a frame


def test_an_answered_ping_makes_the_next_one_due_ping_after_the_answer() -> None:
    session, clock = idle_session()
    clock.now = 3.0
    session.keepalive(3.0)
    pings(session)
    clock.now = 3.01
    session.receive(memoryview(pong_for(session, 1)))
    assert session.rtt == pytest.approx(0.01)
    # The look that was due at 6.0 finds the answer and files for 6.01.
    clock.now = 6.0
    assert session.keepalive(6.0) == pytest.approx(6.01) and pings(session) == 0
    clock.now = 6.01
    session.keepalive(6.01)
    assert pings(session) == 1


def test_receiving_moves_nothing_but_the_next_look_sees_it() -> None:
    session, clock = idle_session()
    clock.now = 2.0
    session.receive(memoryview(f.encode_ping(b"12345678")))  # the peer pinged: life
    clock.now = 3.0
    assert session.keepalive(3.0) == 5.0 and pings(session) == 0  # 3 s after the last frame


def test_open_streams_get_an_rtt_probe_every_rtt_interval() -> None:
    session, clock = idle_session(ping_after=100.0, dead_after=200.0)
    session.open_stream(KubeAPITarget(), b"")
    session.data_to_send()
    clock.now = 1.0
    session.receive(memoryview(f.encode_open_ack(1)))
    assert session.keepalive(1.0) == 11.0 and pings(session) == 1  # never probed: at once
    clock.now = 11.0
    session.receive(memoryview(f.encode_window_update(0, 1)))  # busy, never silent
    assert session.keepalive(11.0) == 21.0 and pings(session) == 1


# The loop's keepalive (fake loop, injected clock) ---------------------------------------------

class FakeLoop:
    """Only what LoopKeepalive uses: call_later, and a way to run what is due."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.timers: list[tuple[float, Callable[[], None], Any]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        loop = self

        class Handle:
            cancelled = False

            def cancel(self) -> None:
                self.cancelled = True
                loop.timers = [t for t in loop.timers if t[2] is not self]

        handle = Handle()
        self.timers.append((self.clock.now + delay, callback, handle))
        return handle

    def run_until(self, t: float) -> None:
        while True:
            due = sorted((when, i) for i, (when, _, _) in enumerate(self.timers) if when <= t)
            if not due:
                self.clock.now = t
                return
            when, i = due[0]
            _, callback, _ = self.timers.pop(i)
            self.clock.now = max(self.clock.now, when)
            callback()


class Watched:
    """A session as the keepalive sees it, with a fixed cadence."""

    def __init__(self, every: float, dead_at: float | None = None) -> None:
        self.keepalive_slot = -1
        self.every = every
        self.dead_at = dead_at
        self.looks: list[float] = []
        self.verdicts: list[float] = []

    def keepalive_due(self, now: float, verdicts_from: float) -> float | None:
        self.looks.append(now)
        if self.dead_at is not None and now >= self.dead_at:
            if now < verdicts_from:
                return verdicts_from
            self.verdicts.append(now)
            return None
        return now + self.every


def test_one_timer_serves_every_session_and_wakes_only_for_due_ones() -> None:
    clock = Clock()
    loop = FakeLoop(clock)
    keepalive = LoopKeepalive(loop, 0.25, clock=clock)  # type: ignore[arg-type]
    sessions = [Watched(every=3.0) for _ in range(3000)]
    rng = random.Random(2)
    for session in sessions:
        keepalive.add(session, rng.uniform(0, 3.0))
    assert len(loop.timers) == 1
    loop.run_until(30.0)
    assert len(loop.timers) == 1
    looks = sum(len(s.looks) for s in sessions)
    assert 3000 * 9 <= looks <= 3000 * 10  # each looked at once per its 3 s, no more


def test_after_a_blocked_loop_nobody_is_declared_dead_until_the_sockets_were_read() -> None:
    clock = Clock()
    loop = FakeLoop(clock)
    keepalive = LoopKeepalive(loop, 0.25, clock=clock)  # type: ignore[arg-type]
    silent = Watched(every=1.0, dead_at=5.0)
    keepalive.add(silent, 1.0)
    loop.run_until(2.0)
    # The loop is blocked for 6 s (an O(N) answer, a GC pause): the sweep due at 3.0 runs at 8.
    clock.now = 8.0
    loop.run_until(8.0)
    assert silent.verdicts == [] and keepalive.stalls == 1
    loop.run_until(8.0 + liveness.STALL_GRACE + 0.3)
    assert silent.verdicts == [pytest.approx(8.0 + liveness.STALL_GRACE, abs=0.26)]


def test_the_tick_follows_the_settings() -> None:
    assert tick_for(3.0, 8.0) == liveness.MAX_TICK
    assert tick_for(0.1, 0.4) == pytest.approx(0.0125)


# Real sessions ------------------------------------------------------------------------------

async def test_many_sessions_share_one_timer(tls_contexts) -> None:
    loop = asyncio.get_running_loop()
    pairs = [await session_pair(tls_contexts) for _ in range(20)]
    await asyncio.sleep(0.05)
    # Per-session timers would be 40 here (each side of each pair).
    keepalive_timers = [h for h in getattr(loop, "_scheduled", [])
                        if getattr(h, "_callback", None) is not None
                        and getattr(h._callback, "__self__", None).__class__ is LoopKeepalive]
    assert len(keepalive_timers) == 1
    for hub, _agent, server in pairs:
        hub.close()
        server.close()


FAST_HUB = SessionConfig(ping_after=0.3, dead_after=0.6)
FAST_AGENT = SessionConfig(ping_after=0.15, dead_after=0.6)


async def test_an_idle_agent_pings_and_the_hub_only_answers(tls_contexts) -> None:
    hub, agent, server = await session_pair(tls_contexts, hub_config=FAST_HUB,
                                            agent_config=FAST_AGENT)
    await asyncio.sleep(0.2)
    hub_before, agent_before = hub.pings_sent, agent.pings_sent
    await asyncio.sleep(1.5)  # ten agent keepalives, five hub keepalives
    assert not hub.closed and not agent.closed
    assert agent.pings_sent - agent_before >= 6
    assert hub.pings_sent == hub_before  # it heard the agent every 0.15 s: nothing to ask
    hub.close()
    server.close()


@pytest.mark.parametrize("frozen_side", ["agent", "hub"])
async def test_a_frozen_peer_is_found_on_either_side(tls_contexts, frozen_side: str) -> None:
    hub, agent, server = await session_pair(tls_contexts, hub_config=FAST_HUB,
                                            agent_config=FAST_AGENT,
                                            on_open=lambda req: Collector())
    client = Collector()
    hub.open_stream(KubeAPITarget(), b"", client)
    await asyncio.sleep(0.3)
    frozen, watcher = (agent, hub) if frozen_side == "agent" else (hub, agent)
    # Frozen as by SIGSTOP: it reads nothing and sends nothing, its socket stays open.
    assert frozen._keepalive is not None
    frozen._keepalive.remove(frozen)
    assert frozen._transport is not None
    frozen._transport.pause_reading()
    lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    watcher.on_closed.append(lambda s: lost.set_result(s.close_reason))
    t0 = asyncio.get_running_loop().time()
    assert await asyncio.wait_for(lost, 5) == "peer dead"
    took = asyncio.get_running_loop().time() - t0
    assert took <= 0.6 + tick_for(0.15, 0.6) + 0.15
    if frozen_side == "agent":
        assert isinstance(await asyncio.wait_for(client.lost, 1), SessionClosed)
    frozen.close()
    server.close()


def test_a_ping_may_go_one_tick_early_so_one_look_does_it() -> None:
    session, clock = idle_session()
    clock.now = 3.0
    session.keepalive(3.0)
    pings(session)
    clock.now = 3.01
    session.receive(memoryview(pong_for(session, 1)))
    # The look due at 6.0 finds the answer 2.99 s old: within a tick of ping_after, so it pings.
    clock.now = 6.0
    assert session.keepalive(6.0, early=0.25) == pytest.approx(9.0)
    assert pings(session) == 1
