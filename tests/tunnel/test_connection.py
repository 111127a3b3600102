"""asyncio adapter end to end over real TLS on 127.0.0.1."""

from __future__ import annotations

import asyncio

from tests.tunnel.conftest import Collector, session_pair
from tunnel.connection import WRITE_EVERY_REQUESTS, OpenRequest
from tunnel.errors import OpenErrorCode, OpenRefused, SessionClosed, StreamReset
from tunnel.targets import KubeAPITarget, ServiceTarget


class Echo(Collector):
    """Agent side: accepts, echoes everything, half-closes after the peer's EOF."""

    def connection_made(self, stream) -> None:
        super().connection_made(stream)
        stream.accept()

    def data_received(self, data) -> None:
        super().data_received(data)
        self.stream.write(data)

    def eof_received(self) -> None:
        super().eof_received()
        self.stream.write_eof()


class AnswersLater(Collector):
    """Agent side: accepts, and ``delay`` seconds after the peer's EOF answers b"done" and its
    own EOF (unless ``answers`` says not to)."""

    delay = 0.01

    def connection_made(self, stream) -> None:
        super().connection_made(stream)
        stream.accept()

    def eof_received(self) -> None:
        super().eof_received()
        if self.answers():
            asyncio.get_running_loop().call_later(self.delay, self.answer)

    def answers(self) -> bool:
        return True

    def answer(self) -> None:
        self.stream.write(b"done")
        self.stream.write_eof()


async def ask(hub) -> Collector:
    """The hub's side of a stream that sends b"ask" with its EOF, once the stream has ended
    without error (what it received is for the caller to check)."""
    client = Collector(keep=True)
    hub.open_stream(KubeAPITarget(), b"", client, initial_data=b"ask", fin=True)
    assert await asyncio.wait_for(client.lost, 5) is None
    return client


async def test_echo_with_0rtt_and_half_close(tls_contexts):
    requests: list[OpenRequest] = []

    def on_open(req: OpenRequest):
        requests.append(req)
        return Echo()

    hub, agent, server = await session_pair(tls_contexts, on_open=on_open)
    client = Collector(keep=True)
    stream = hub.open_stream(KubeAPITarget(), b'{"user":"u"}', client, initial_data=b"hello ")
    assert stream.stream_id == 1 and client.stream is stream
    stream.write(b"world")
    stream.write_eof()
    assert await asyncio.wait_for(client.lost, 5) is None
    assert bytes(client.data) == b"hello world" and client.eof
    assert requests == [OpenRequest(1, KubeAPITarget(), b'{"user":"u"}')]
    assert hub.active_streams == 0 and agent.active_streams == 0
    hub.close()
    await asyncio.wait_for(agent.wait_closed(), 5)
    assert agent.closed
    server.close()


async def test_the_opens_of_a_loop_turn_share_one_write(tls_contexts):
    """A burst of OPENs in one loop turn, the first included, leaves in the turn's one write:
    the agent then reads and turns once for them (writing the first at once cost both sides
    ~15-18% more CPU per request at 16 concurrent requests)."""
    hub, _agent, server = await session_pair(tls_contexts, on_open=lambda req: Echo())
    await asyncio.sleep(0.05)  # settled: SETTINGS and the first pings are out
    before = hub.bytes_sent
    clients = [Collector(keep=True) for _ in range(3)]
    for client, data in zip(clients, (b"a", b"b", b"c"), strict=True):
        hub.open_stream(KubeAPITarget(), b"", client, initial_data=data)
        assert hub.bytes_sent == before  # not yet: with the turn's write
    await asyncio.sleep(0)
    assert hub.bytes_sent > before
    for client in clients:
        client.stream.write_eof()
    for client, body in zip(clients, (b"a", b"b", b"c"), strict=True):
        assert await asyncio.wait_for(client.lost, 5) is None
        assert bytes(client.data) == body
    hub.close()
    server.close()


async def test_every_eighth_complete_request_of_a_turn_is_written_at_once(tls_contexts):
    """Complete requests (an OPEN with FIN, or a write_eof that ends a stream's request) share
    the turn's write, but every WRITE_EVERY_REQUESTS of them go at once, so the agent starts on
    them while the hub makes the rest; what remains leaves with the turn."""
    hub, _agent, server = await session_pair(tls_contexts, on_open=lambda req: Echo())
    await asyncio.sleep(0.05)  # settled: SETTINGS and the first pings are out
    count = 2 * WRITE_EVERY_REQUESTS + 3
    clients = [Collector(keep=True) for _ in range(count)]
    written: list[bool] = []
    for i, client in enumerate(clients):
        before = hub.bytes_sent
        if i % 2:  # the OPEN carries the whole request
            hub.open_stream(KubeAPITarget(), b"", client, initial_data=b"%d" % i, fin=True)
        else:  # the request ends with write_eof; a second one is no other request
            hub.open_stream(KubeAPITarget(), b"", client, initial_data=b"%d" % i)
            client.stream.write_eof()
            client.stream.write_eof()
        written.append(hub.bytes_sent > before)
    assert [i + 1 for i, w in enumerate(written) if w] == [WRITE_EVERY_REQUESTS,
                                                             2 * WRITE_EVERY_REQUESTS]
    before = hub.bytes_sent
    await asyncio.sleep(0)
    assert hub.bytes_sent > before  # the last three, with the turn's write
    for i, client in enumerate(clients):
        assert await asyncio.wait_for(client.lost, 5) is None
        assert bytes(client.data) == b"%d" % i and client.eof
    hub.close()
    server.close()


async def test_answers_of_a_turn_share_its_one_write(tls_contexts):
    """Answers (write_eof on streams the peer opened) are not counted: they end work rather
    than start it, and the agent's turn of answers stays one write."""
    held: list[Collector] = []

    class Held(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            stream.accept()

        def eof_received(self) -> None:
            super().eof_received()
            held.append(self)

    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Held())
    await asyncio.sleep(0.05)
    count = WRITE_EVERY_REQUESTS + 2
    clients = [Collector(keep=True) for _ in range(count)]
    for client in clients:
        hub.open_stream(KubeAPITarget(), b"", client, initial_data=b"ask", fin=True)
    async with asyncio.timeout(5):
        while len(held) < count:
            await asyncio.sleep(0.01)
    before = agent.bytes_sent
    for answer in held:
        answer.stream.write(b"done")
        answer.stream.write_eof()
    assert agent.bytes_sent == before  # all of them with the turn's write
    for client in clients:
        assert await asyncio.wait_for(client.lost, 5) is None
        assert bytes(client.data) == b"done" and client.eof
    hub.close()
    server.close()


async def test_an_accept_with_nothing_to_send_schedules_no_flush(tls_contexts):
    """The OPEN_ACK waits for the stream's first frame: accepting a stream whose answer is not
    ready yet costs no loop callback; the answer's first write brings the flush, ack first."""
    accepted: list[bool] = []

    class Later(AnswersLater):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            accepted.append(stream._session._flush_scheduled)

    hub, _agent, server = await session_pair(tls_contexts, on_open=lambda req: Later())
    await asyncio.sleep(0.05)  # settled: SETTINGS and the first pings are out
    client = await ask(hub)
    assert bytes(client.data) == b"done" and client.eof
    assert accepted == [False]
    hub.close()
    server.close()


async def test_a_streams_last_frame_leaves_at_once_only_when_no_other_stream_is_open(
        tls_contexts):
    """The FIN that ends the session's only stream (the peer's side already ended) is written
    by write_eof itself, not after the rest of the loop turn: it is on the c=1 latency path.
    With another stream open the turn's one write still takes it (the other stream may add
    to it in the same turn)."""
    written_at_once: list[bool] = []

    class Later(AnswersLater):
        def answer(self) -> None:
            session = self.stream._session
            self.stream.write(b"done")
            before = session.bytes_sent
            self.stream.write_eof()
            written_at_once.append(session.bytes_sent > before)

    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Later())
    await asyncio.sleep(0.05)  # settled: SETTINGS and the first pings are out
    client = await ask(hub)
    assert bytes(client.data) == b"done" and client.eof
    assert written_at_once == [True]
    assert agent.active_streams == 0  # the stream's end was still delivered

    other = Collector(keep=True)  # open, not ended: its answer waits for its EOF
    hub.open_stream(KubeAPITarget(), b"", other, initial_data=b"wait")
    client = await ask(hub)
    assert bytes(client.data) == b"done"
    assert written_at_once == [True, False]
    other.stream.write_eof()
    assert await asyncio.wait_for(other.lost, 5) is None
    hub.close()
    server.close()


async def test_refusal_is_typed(tls_contexts):
    class Refuser(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            stream.refuse(OpenErrorCode.DENIED, "service not allow-listed")

    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Refuser())
    client = Collector()
    hub.open_stream(ServiceTarget("ns", "svc", 80), b"", client)
    exc = await asyncio.wait_for(client.lost, 5)
    assert isinstance(exc, OpenRefused) and exc.code == OpenErrorCode.DENIED
    assert exc.message == "service not allow-listed"
    # on_open returning None refuses with DENIED too
    agent.on_open = lambda req: None
    client2 = Collector()
    hub.open_stream(KubeAPITarget(), b"", client2)
    exc2 = await asyncio.wait_for(client2.lost, 5)
    assert isinstance(exc2, OpenRefused) and exc2.code == OpenErrorCode.DENIED
    hub.close()
    server.close()


FAST = dict(ping_after=0.1, dead_after=0.4)


async def test_ping_measures_rtt(tls_contexts):
    hub, agent, server = await session_pair(tls_contexts)
    for _ in range(100):
        if hub.rtt is not None and agent.rtt is not None:
            break
        await asyncio.sleep(0.01)
    assert 0 < hub.rtt < 0.1 and 0 < agent.rtt < 0.1
    hub.close()
    server.close()


async def test_frozen_peer_declared_dead_within_interval(tls_contexts):
    from tunnel.session_state import SessionConfig

    lost: list[str] = []
    hub, agent, server = await session_pair(tls_contexts, hub_config=SessionConfig(**FAST),
                                            agent_config=SessionConfig(**FAST),
                                            on_open=lambda req: Collector())
    hub.on_closed.append(lambda s: lost.append(s.close_reason))
    client = Collector()
    hub.open_stream(KubeAPITarget(), b"", client)
    await asyncio.sleep(0.3)
    assert not hub.closed  # idle but alive: pings answered
    # Freeze the agent: it neither reads its socket nor sends anything (as if SIGSTOPped).
    agent._keepalive.remove(agent)  # (its keepalive: one wheel per event loop since issue 22)
    agent._transport.pause_reading()
    t0 = asyncio.get_running_loop().time()
    exc = await asyncio.wait_for(client.lost, 3)
    took = asyncio.get_running_loop().time() - t0
    assert hub.closed and lost == ["peer dead"]
    assert isinstance(exc, SessionClosed)
    assert took <= 0.4 + 0.2
    agent.close()
    server.close()


async def test_back_pressured_session_is_not_dead(tls_contexts):
    from tunnel.session_state import SessionConfig

    class Stalled(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            stream.accept()
            stream.pause_reading()  # consumer takes nothing: the window fills and stays full

    hub, agent, server = await session_pair(tls_contexts, hub_config=SessionConfig(**FAST),
                                            agent_config=SessionConfig(**FAST),
                                            on_open=lambda req: Stalled())
    client = Collector()
    stream = hub.open_stream(KubeAPITarget(), b"", client)
    stream.write(b"x" * (2 * 1024 * 1024))
    await asyncio.sleep(1.2)  # three dead_after intervals with unsent data
    assert stream.get_write_buffer_size() > 0 and client.paused == 1
    assert not hub.closed and not agent.closed
    hub.close()
    server.close()


async def test_drain_lets_in_flight_streams_finish_and_resets_the_rest(tls_contexts):
    class Slow(AnswersLater):
        """Answers after a delay; the stream for 'never' never answers."""

        delay = 0.2

        def answers(self) -> bool:
            return self.stream.metadata != b"never"

    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Slow())
    clients = [Collector(keep=True) for _ in range(3)]
    for i, c in enumerate(clients):
        hub.open_stream(KubeAPITarget(), b"never" if i == 2 else b"", c).write_eof()
    await asyncio.sleep(0.05)
    drain = asyncio.create_task(agent.drain(1.0))  # the agent's SIGTERM path
    await asyncio.sleep(0.05)
    assert hub.draining  # the registry stops picking this session
    late = Collector()
    hub.open_stream(KubeAPITarget(), b"", late)
    exc = await asyncio.wait_for(late.lost, 2)
    assert isinstance(exc, OpenRefused) and exc.code == OpenErrorCode.SHUTTING_DOWN
    assert await asyncio.wait_for(clients[0].lost, 2) is None
    assert bytes(clients[0].data) == b"done" and bytes(clients[1].data) == b"done"
    await asyncio.wait_for(drain, 3)
    exc = await asyncio.wait_for(clients[2].lost, 2)
    assert isinstance(exc, StreamReset | SessionClosed)
    assert agent.closed
    await asyncio.wait_for(hub.wait_closed(), 3)
    server.close()


async def test_goaway_refuses_new_streams_from_peer(tls_contexts):
    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: None)
    agent.goaway("rotating")
    await asyncio.sleep(0.05)
    c = Collector()
    hub.open_stream(KubeAPITarget(), b"", c)
    exc = await asyncio.wait_for(c.lost, 2)
    assert isinstance(exc, OpenRefused) and exc.code == OpenErrorCode.SHUTTING_DOWN
    assert not hub.closed
    hub.close()
    server.close()


async def test_open_on_closed_session_reports_session_closed(tls_contexts):
    hub, _agent, server = await session_pair(tls_contexts)
    hub.close()
    c = Collector()
    stream = hub.open_stream(KubeAPITarget(), b"", c)
    assert c.stream is stream
    assert isinstance(await asyncio.wait_for(c.lost, 2), SessionClosed)
    server.close()


async def test_burst_of_opens_accepted_immediately_is_not_overload(tls_contexts):
    """3000 OPENs arrive in few reads; the agent accepts each in connection_made, so the
    pending-opens limit (1000) never refuses one."""

    class Idle(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            stream.accept()

    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Idle())
    clients = [Collector() for _ in range(3000)]
    for c in clients:
        hub.open_stream(KubeAPITarget(), b"", c)
    for _ in range(300):
        if agent.active_streams == 3000:
            break
        await asyncio.sleep(0.01)
    assert agent.active_streams == 3000 and not any(c.lost.done() for c in clients)
    hub.close()
    await asyncio.wait_for(asyncio.gather(*(c.lost for c in clients)), 5)
    server.close()


async def test_a_reset_with_an_unknown_code_ends_only_its_stream(tls_contexts):
    """A RESET code from a newer (or broken) peer is reported as INTERNAL; it used to raise
    ValueError inside the session's event dispatch."""
    from tunnel.errors import ResetCode
    from tunnel.frames import encode_reset

    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Echo())
    client = Collector()
    stream = hub.open_stream(KubeAPITarget(), b"", client, initial_data=b"x")
    agent._transport.write(encode_reset(stream.stream_id, 99))
    lost = await asyncio.wait_for(client.lost, 5)
    assert isinstance(lost, StreamReset) and lost.code == ResetCode.INTERNAL
    assert not hub.closed
    echo = Collector(keep=True)
    hub.open_stream(KubeAPITarget(), b"", echo, initial_data=b"still alive").write_eof()
    assert await asyncio.wait_for(echo.lost, 5) is None
    assert bytes(echo.data) == b"still alive"
    hub.close()
    server.close()


async def test_two_drains_of_one_session_both_end_when_its_streams_do(tls_contexts):
    """The agent's SIGTERM drains its session while its dialer retires the same session (a
    second drain): both must return once the last stream ends, not one at its deadline."""

    class Accept(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            stream.accept()

    hub, agent, server = await session_pair(tls_contexts, on_open=lambda req: Accept())
    watch = Collector(keep=True)
    stream = hub.open_stream(KubeAPITarget(), b"", watch)
    await asyncio.sleep(0.05)
    first = asyncio.create_task(agent.drain(10.0))
    second = asyncio.create_task(agent.drain(10.0))
    await asyncio.sleep(0.05)
    assert hub.draining
    started = asyncio.get_running_loop().time()
    stream.reset()  # the hub ends its watch (the gateway's end of a watch on a draining agent)
    await asyncio.wait_for(asyncio.gather(first, second), 3)
    assert asyncio.get_running_loop().time() - started < 2, "a drain waited for its deadline"
    assert agent.closed
    server.close()


async def test_connection_made_knows_whether_the_opens_bytes_follow_it(tls_contexts):
    """During connection_made, ``open_data_follows`` says whether the OPEN carried data or its
    FIN, which reach the protocol right after the call: a protocol that needs the first bytes
    (the agent's exchange: the request head) need not wait a loop turn to learn they came."""
    seen: list[tuple[bool, bytes, bool]] = []  # (during connection_made, data then, eof then)

    class Watcher(Collector):
        def connection_made(self, stream) -> None:
            super().connection_made(stream)
            seen.append((stream.open_data_follows, bytes(self.data), self.eof))
            stream.accept()

        def data_received(self, data) -> None:
            super().data_received(data)
            assert not self.stream.open_data_follows
            self.stream.write(b"ok")
            self.stream.write_eof()

        def eof_received(self) -> None:
            super().eof_received()
            if not self.data:
                self.stream.write_eof()

    hub, _agent, server = await session_pair(tls_contexts, on_open=lambda req: Watcher())
    for data, fin in ((b"head", False), (b"", True), (b"", False)):
        client = Collector(keep=True)
        stream = hub.open_stream(KubeAPITarget(), b"", client, initial_data=data, fin=fin)
        if not data and not fin:
            await asyncio.sleep(0.05)  # the OPEN alone arrived: nothing followed it
            stream.write(b"later")
        if not fin:
            stream.write_eof()
        assert await asyncio.wait_for(client.lost, 5) is None
    assert seen == [(True, b"", False), (True, b"", False), (False, b"", False)]
    hub.close()
    server.close()
