"""Storms of agents (tunnel.admission, issue 22): a bound on handshakes in flight, connections
that waited too long (or were given up) refused before any TLS work and counted, and what an
agent does when the hub says it is busy. Pure rules byte by byte, then real TLS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from pathlib import Path

import pytest

from tests.support import eventually
from tests.tunnel.pki import PKI, make_pki
from tests.tunnel.test_listener_dialer import echo_on_open
from tunnel import admission
from tunnel.admission import (
    BUSY_ALERT,
    GONE,
    STALE,
    HandshakeSlots,
    Waiting,
    classify_waiting,
    parse_listen_queue,
    parse_tcp_info,
)
from tunnel.backoff import OVERLOAD_WINDOW, Backoff
from tunnel.connection import SessionConfig
from tunnel.dialer import AgentDialer
from tunnel.handshake import hub_busy
from tunnel.listener import TunnelListener, start_tunnel_listener
from tunnel.registry import SessionRegistry


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    return make_pki(tmp_path)


# Pure ---------------------------------------------------------------------------------------

def tcp_info_bytes(state: int, last_data_recv_ms: int, unacked: int = 0, sacked: int = 0) -> bytes:
    raw = bytearray(admission.TCP_INFO_SIZE)
    raw[0] = state
    struct.pack_into("=II", raw, 24, unacked, sacked)
    struct.pack_into("=I", raw, 52, last_data_recv_ms)
    return bytes(raw)


def test_tcp_info_is_read_at_its_kernel_offsets() -> None:
    assert parse_tcp_info(tcp_info_bytes(1, 4250)) == Waiting(1, 4.25)
    assert parse_listen_queue(tcp_info_bytes(10, 0, unacked=17, sacked=4096)) == (17, 4096)
    with pytest.raises(ValueError):
        parse_tcp_info(b"\x01" * 40)


def test_the_verdict_before_any_handshake() -> None:
    assert classify_waiting(Waiting(admission.TCP_ESTABLISHED, 0.1), 5.0) is None
    assert classify_waiting(Waiting(admission.TCP_ESTABLISHED, 5.0), 5.0) == STALE
    assert classify_waiting(Waiting(8, 0.1), 5.0) == GONE  # CLOSE_WAIT: the agent closed
    assert classify_waiting(Waiting(7, 9.0), 5.0) == GONE  # CLOSE: reset


def test_the_busy_alert_is_a_plaintext_fatal_user_canceled_record() -> None:
    content_type, version, length, level, description = struct.unpack("!BHHBB", BUSY_ALERT)
    assert (content_type, version, length) == (21, 0x0303, 2)
    assert (level, description) == (2, 90)


async def test_slots_let_one_waiter_in_per_slot_given_back() -> None:
    slots = HandshakeSlots(2)
    slots.take()
    slots.take()
    waiters = [asyncio.ensure_future(slots.wait()) for _ in range(2)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    slots.give_back()
    await asyncio.sleep(0)
    assert sum(w.done() for w in waiters) == 1
    slots.take()  # the one let in starts its handshake
    slots.give_back()
    await asyncio.sleep(0)
    assert all(w.done() for w in waiters)


def test_after_the_hub_said_busy_the_window_starts_at_seconds() -> None:
    ceilings: list[float] = []
    backoff = Backoff(rand=lambda: 1.0)
    ceilings.append(backoff.next_delay())
    ceilings.append(backoff.next_delay(overloaded=True))
    ceilings.append(backoff.next_delay(overloaded=True))
    ceilings.append(backoff.next_delay())
    assert ceilings[0] == pytest.approx(0.2)
    assert ceilings[1] >= OVERLOAD_WINDOW  # never "at once" after a busy hub
    assert ceilings[2:] == [pytest.approx(2 * ceilings[1]), pytest.approx(4 * ceilings[1])]
    spread = Backoff(rand=lambda: 0.5)
    assert spread.next_delay(overloaded=True) == pytest.approx(ceilings[1] / 2)  # full jitter


def test_what_counts_as_a_busy_hub() -> None:
    busy = ssl.SSLError(1, "[SSL: TLSV1_ALERT_USER_CANCELLED] tlsv1 alert user cancelled")
    busy.reason = "TLSV1_ALERT_USER_CANCELLED"  # type: ignore[misc]
    expired = ssl.SSLError(1, "[SSL: SSLV3_ALERT_CERTIFICATE_EXPIRED]")
    expired.reason = "SSLV3_ALERT_CERTIFICATE_EXPIRED"  # type: ignore[misc]
    assert hub_busy(busy) and hub_busy(TimeoutError()) and hub_busy(ConnectionResetError())
    assert hub_busy(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))
    assert not hub_busy(expired) and not hub_busy(ConnectionRefusedError())


# Real TLS -----------------------------------------------------------------------------------

async def tls_client(pki: PKI, port: int, cluster: str = "c1") -> tuple[asyncio.StreamReader,
                                                                          asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=pki.agent_context(cluster),
                                         server_hostname="localhost", ssl_handshake_timeout=10)


@contextlib.asynccontextmanager
async def listening(pki: PKI, **kw):  # type: ignore[no-untyped-def]
    listener = await start_tunnel_listener("127.0.0.1", 0, pki.hub_context(), SessionRegistry(),
                                           **kw)
    try:
        yield listener
    finally:
        listener.close()
        await listener.wait_closed()


def record_in_flight(listener: TunnelListener) -> list[int]:
    seen: list[int] = []
    take = listener.slots.take

    def counting_take() -> None:
        take()
        seen.append(listener.slots.in_flight)

    listener.slots.take = counting_take  # type: ignore[method-assign]
    return seen


async def test_more_agents_than_the_bound_are_all_served_never_above_it(pki: PKI) -> None:
    async with listening(pki, max_handshakes=2) as listener:
        in_flight = record_in_flight(listener)
        clients = await asyncio.gather(*(tls_client(pki, listener.port) for _ in range(24)))
        await eventually(lambda: len(listener.registry.sessions("c1")) == 24)
        assert len(in_flight) == 24 and max(in_flight) <= 2
        assert listener.admission()["handshakes_started"] == 24
        assert listener.refused_early == {STALE: 0, GONE: 0}
        for _, writer in clients:
            writer.close()


async def hold_the_only_slot(listener: TunnelListener) -> socket.socket:
    """A peer that connects and never says a word: it takes the one handshake slot."""
    holder = socket.create_connection(("127.0.0.1", listener.port))
    await eventually(lambda: listener.slots.in_flight == 1)
    return holder


async def test_stale_and_abandoned_connections_are_refused_without_a_handshake(pki: PKI) -> None:
    async with listening(pki, max_handshakes=1, handshake_timeout=3.0) as listener:
        listener.stale_after, listener.slot_hold = 0.3, 1.0
        holder = await hold_the_only_slot(listener)
        abandoned = socket.create_connection(("127.0.0.1", listener.port))
        abandoned.close()  # gave up while queued
        waiting = [asyncio.ensure_future(tls_client(pki, listener.port)) for _ in range(3)]
        await asyncio.sleep(0.2)
        assert listener.admission()["accept_queue"] == 4  # waiting in the kernel, for free
        # The holder's slot comes back after slot_hold: by then the queued ones waited 0.8 s.
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(r, ssl.SSLError) and hub_busy(r) for r in results), results
        assert listener.refused_early == {STALE: 3, GONE: 1}
        assert listener.handshakes_started == 1  # the holder's: no TLS work for the rest
        # A fresh agent is served at once.
        _, writer = await tls_client(pki, listener.port)
        await eventually(lambda: len(listener.registry.sessions("c1")) == 1)
        assert listener.handshakes_started == 2
        writer.close()
        holder.close()


async def test_an_agent_told_the_hub_is_busy_backs_off_for_seconds(
        pki: PKI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "hubproxy.tunnel")
    delays: list[float] = []
    backoff = Backoff(rand=lambda: 1.0)
    next_delay = backoff.next_delay

    def recorded(overloaded: bool = False) -> float:
        delays.append(next_delay(overloaded))
        return delays[-1]

    backoff.next_delay = recorded  # type: ignore[method-assign]
    async with listening(pki, max_handshakes=1, handshake_timeout=3.0) as listener:
        listener.stale_after, listener.slot_hold = 0.3, 0.8
        holder = await hold_the_only_slot(listener)
        agent = AgentDialer("127.0.0.1", listener.port, lambda: pki.agent_context("c1"),
                            echo_on_open, SessionConfig(), server_hostname="localhost",
                            backoff=backoff)
        task = asyncio.ensure_future(agent.run())
        try:
            await eventually(lambda: bool(delays))
            assert listener.refused_early[STALE] == 1
            assert delays == [OVERLOAD_WINDOW * 1.28]  # 0.2 s doubled to the first >= 5 s
            assert "the hub is busy" in caplog.text
        finally:
            await agent.drain(1.0)  # (wakes it from its backoff at once)
            await asyncio.wait_for(task, 5)
            holder.close()
