"""Sans-IO session state machine, byte by byte (no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import ManualClock
from tunnel import frames as f
from tunnel import session_state as ss
from tunnel.errors import (
    BadStreamId,
    FloodError,
    OpenErrorCode,
    ProtocolError,
    ResetCode,
    StreamStateError,
    WindowExceeded,
    WindowOverflow,
)
from tunnel.session_state import Session, SessionConfig
from tunnel.targets import KubeAPITarget


def wire(session: Session) -> bytes:
    return b"".join(bytes(c) for c in session.data_to_send())


def feed(session: Session, data: bytes) -> list[ss.Event]:
    buf = memoryview(data)
    consumed = session.receive(buf)
    assert consumed == len(data)
    events = session.take_events()
    for ev in events:  # copy views: the buffer is reused by real callers
        if hasattr(ev, "data"):
            ev.data = bytes(ev.data)
    return events


def pair(hub_cfg=None, agent_cfg=None, clock=None):
    clock = clock or ManualClock(100.0)
    hub = Session(hub_cfg, opens_odd=True, clock=clock)
    agent = Session(agent_cfg, opens_odd=False, clock=clock)
    feed(agent, wire(hub))
    feed(hub, wire(agent))
    feed(agent, wire(hub))  # settings acks
    return hub, agent, clock


def fresh_agent(cfg=None) -> Session:
    agent = Session(cfg, opens_odd=False, clock=ManualClock(100.0))
    wire(agent)
    return agent


def test_settings_sent_first_and_acked():
    hub = Session(SessionConfig(initial_window=65536), clock=ManualClock(100.0))
    out = wire(hub)
    assert out[:12] == f.header(f.SETTINGS, 0, 0, 24)
    agent = Session(opens_odd=False, clock=ManualClock(100.0))
    wire(agent)
    [ev] = feed(agent, out)
    assert isinstance(ev, ss.SettingsReceived) and agent.peer_initial_window == 65536
    assert wire(agent) == f.encode_settings_ack()


def test_defaults_apply_before_settings_arrive():
    agent = fresh_agent()
    # An OPEN before any SETTINGS: the default window (256 KiB) applies.
    evs = feed(agent, f.encode_open(1, KubeAPITarget(), b"m", b"x" * 1000))
    assert evs == [ss.StreamOpened(1, KubeAPITarget(), b"m", b"x" * 1000, False)]


def test_open_ack_data_fin_both_directions_closes_stream():
    hub, agent, _ = pair()
    sid = hub.open_stream(KubeAPITarget(), b"id", b"head", fin=True)
    [opened] = feed(agent, wire(hub))
    assert opened == ss.StreamOpened(sid, KubeAPITarget(), b"id", b"head", True)
    agent.accept(sid)
    agent.send_data(sid, b"response")
    agent.send_eof(sid)
    evs = feed(hub, wire(agent))
    assert evs == [ss.OpenAccepted(sid), ss.DataReceived(sid, b"response", True),
                   ss.StreamClosed(sid)]
    assert sid not in hub.streams and sid not in agent.streams
    assert [type(e) for e in agent.take_events()] == [ss.StreamClosed]


def test_no_data_from_agent_before_accept():
    hub, agent, _ = pair()
    sid = hub.open_stream(KubeAPITarget(), b"")
    feed(agent, wire(hub))
    agent.send_data(sid, b"early")
    assert b"early" not in wire(agent)
    agent.accept(sid)
    assert wire(agent) == f.encode_open_ack(sid) + f.encode_data(sid, b"early")


def test_stream_ids_are_never_reused():
    agent = fresh_agent()
    feed(agent, f.encode_open(3, KubeAPITarget(), b""))
    with pytest.raises(BadStreamId):
        feed(agent, f.encode_open(3, KubeAPITarget(), b""))
    agent = fresh_agent()
    feed(agent, f.encode_open(5, KubeAPITarget(), b""))
    with pytest.raises(BadStreamId):
        feed(agent, f.encode_open(1, KubeAPITarget(), b""))


def test_open_with_wrong_parity_refused():
    agent = fresh_agent()
    with pytest.raises(BadStreamId):
        feed(agent, f.encode_open(2, KubeAPITarget(), b""))


def test_data_on_never_opened_stream_is_protocol_error():
    agent = fresh_agent()
    with pytest.raises(BadStreamId):
        feed(agent, f.encode_data(7, b"x"))


def test_data_after_fin_is_state_error():
    agent = fresh_agent()
    feed(agent, f.encode_open(1, KubeAPITarget(), b"", b"", fin=True))
    with pytest.raises(StreamStateError):
        feed(agent, f.encode_data(1, b"x"))


def test_data_for_reset_stream_is_dropped_quietly():
    agent = fresh_agent()
    feed(agent, f.encode_open(1, KubeAPITarget(), b""))
    agent.reset(1, 1)
    assert wire(agent) == f.encode_reset(1, 1)
    assert feed(agent, f.encode_data(1, b"late")) == []


def test_stream_window_exceeded_is_protocol_error():
    agent = fresh_agent(SessionConfig(initial_window=1024))
    feed(agent, f.encode_open(1, KubeAPITarget(), b"", b"x" * 1000))
    with pytest.raises(WindowExceeded):
        feed(agent, f.encode_data(1, b"y" * 25))


def test_initial_data_beyond_window_is_protocol_error():
    agent = fresh_agent(SessionConfig(initial_window=1024))
    with pytest.raises(WindowExceeded):
        feed(agent, f.encode_open(1, KubeAPITarget(), b"", b"x" * 1025))


def test_connection_window_exceeded_is_protocol_error():
    agent = fresh_agent(SessionConfig(initial_window=f.MAX_WINDOW, max_frame_size=1 << 24))
    feed(agent, f.encode_open(1, KubeAPITarget(), b""))
    agent.conn_recv_window = 10  # as if 16 MiB were already in flight
    with pytest.raises(WindowExceeded):
        feed(agent, f.encode_data(1, b"y" * 11))


def test_window_update_zero_and_overflow():
    hub, _agent, _ = pair()
    with pytest.raises(WindowOverflow):
        feed(hub, f.encode_window_update(0, 0))
    with pytest.raises(WindowOverflow):
        feed(hub, f.encode_window_update(0, f.MAX_WINDOW))


def test_credit_returns_only_when_consumed_and_in_batches():
    hub, agent, _ = pair(agent_cfg=SessionConfig(initial_window=4096))
    sid = hub.open_stream(KubeAPITarget(), b"")
    hub.send_data(sid, b"a" * 10_000)
    feed(agent, wire(hub))
    assert hub.streams[sid].send_window == 0 and hub.streams[sid].send_buffered == 10_000 - 4096
    assert wire(hub) == b""  # blocked on the window
    agent.consumed(sid, 1000)
    assert wire(agent) == b""  # below half a window: batched
    agent.consumed(sid, 1048)
    assert wire(agent) == f.encode_window_update(sid, 2048)
    feed(hub, f.encode_window_update(sid, 2048))
    assert len(wire(hub)) == 12 + 2048


def test_send_buffer_reports_low_water_for_resume_writing():
    cfg = SessionConfig(write_low_water=100)
    hub, _agent, _ = pair(hub_cfg=cfg, agent_cfg=SessionConfig(initial_window=1024))
    sid = hub.open_stream(KubeAPITarget(), b"")
    hub.send_data(sid, b"x" * 2000)
    hub.streams[sid].write_paused = True
    wire(hub)
    assert hub.take_writable() == []
    feed(hub, f.encode_window_update(sid, 1024))
    wire(hub)
    assert hub.take_writable() == [sid]


def test_round_robin_with_quantum_and_control_first():
    hub, _agent, _ = pair(hub_cfg=SessionConfig(quantum=1000))
    a = hub.open_stream(KubeAPITarget(), b"")
    b = hub.open_stream(KubeAPITarget(), b"")
    wire(hub)
    hub.send_data(a, b"A" * 3000)
    hub.send_data(b, b"B" * 3000)
    hub.ping()
    chunks = hub.data_to_send()
    assert bytes(chunks[0])[4] == f.PING
    order = [bytes(c)[:1] for c in chunks[1:] if len(c) == 1000]
    assert order == [b"A", b"B", b"A", b"B", b"A", b"B"]


def test_window_auto_tunes_when_rtt_bound():
    clock = ManualClock(100.0)
    hub, agent, _ = pair(agent_cfg=SessionConfig(initial_window=4096, max_stream_window=16384),
                         clock=clock)
    agent.rtt = 0.01
    sid = hub.open_stream(KubeAPITarget(), b"")
    feed(agent, wire(hub))
    for _ in range(3):
        clock.now += 0.001
        agent.consumed(sid, 4096)
    assert agent.streams[sid].recv_target == 16384
    assert agent.budget.used == 16384 - 4096
    agent.reset(sid, 1)
    assert agent.budget.used == 0


def test_ping_pong_measures_rtt():
    hub, agent, clock = pair()
    hub.ping()
    out = wire(hub)
    clock.now += 0.25
    feed(agent, out)
    [ev] = feed(hub, wire(agent))
    assert isinstance(ev, ss.PongReceived) and hub.rtt == pytest.approx(0.25)


@pytest.mark.parametrize(("frame", "attr"), [
    (f.encode_ping(b"12345678"), "max_pings_per_second"),
    (f.encode_settings({}), "max_settings_per_second"),
    (f.encode_reset(1, 1), "max_resets_per_second"),
])
def test_control_floods_are_protocol_errors(frame, attr):
    agent = fresh_agent(SessionConfig(**{attr: 5}))
    feed(agent, f.encode_open(1, KubeAPITarget(), b""))
    with pytest.raises(FloodError):
        feed(agent, frame * 7)


def test_mass_cancellation_of_accepted_streams_is_not_a_flood():
    """A hub dropping thousands of established watches at once must not kill the session."""
    agent = fresh_agent(SessionConfig(max_resets_per_second=5))
    sids = range(1, 41, 2)
    feed(agent, b"".join(f.encode_open(sid, KubeAPITarget(), b"") for sid in sids))
    for sid in sids:
        agent.accept(sid)
    feed(agent, b"".join(f.encode_reset(sid, 1) for sid in sids))
    assert not any(sid in agent.streams for sid in sids)
    with pytest.raises(FloodError):  # resets of streams already gone still count
        feed(agent, b"".join(f.encode_reset(sid, 1) for sid in sids))


def test_refused_open_flood_is_protocol_error():
    agent = fresh_agent(SessionConfig(max_pending_opens=1, max_refused_per_second=3))
    feed(agent, f.encode_open(1, KubeAPITarget(), b""))
    raw = b"".join(f.encode_open(i, KubeAPITarget(), b"") for i in range(3, 13, 2))
    with pytest.raises(FloodError):
        feed(agent, raw)


def test_pending_opens_and_concurrency_limits_refuse_with_overload():
    agent = fresh_agent(SessionConfig(max_pending_opens=2))
    feed(agent, b"".join(f.encode_open(i, KubeAPITarget(), b"") for i in (1, 3, 5)))
    assert wire(agent) == f.encode_open_fail(5, OpenErrorCode.OVERLOAD, "too many pending opens")
    agent = fresh_agent(SessionConfig(max_concurrent_streams=1))
    feed(agent, f.encode_open(1, KubeAPITarget(), b""))
    agent.accept(1)
    feed(agent, f.encode_open(3, KubeAPITarget(), b""))
    assert wire(agent).endswith(
        f.encode_open_fail(3, OpenErrorCode.OVERLOAD, "too many concurrent streams"))


def test_goaway_refuses_new_opens_and_fails_ours_beyond_last():
    hub, agent, _ = pair()
    s1 = hub.open_stream(KubeAPITarget(), b"")
    feed(agent, wire(hub))
    agent.goaway()
    s3 = hub.open_stream(KubeAPITarget(), b"")
    out = wire(hub)
    evs = feed(hub, wire(agent))
    assert evs[0] == ss.GoAwayReceived(s1, 0, "")
    assert evs[1] == ss.OpenFailed(s3, OpenErrorCode.SHUTTING_DOWN, "peer going away")
    feed(agent, out)  # the OPEN crossed the GOAWAY on the wire: refused
    assert wire(agent) == f.encode_open_fail(s3, OpenErrorCode.SHUTTING_DOWN,
                                             "session going away")
    assert s1 in hub.streams


def test_drain_sends_goaway_then_drain():
    hub, agent, _ = pair()
    agent.drain()
    evs = feed(hub, wire(agent))
    assert [type(e) for e in evs] == [ss.GoAwayReceived, ss.DrainReceived]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([
    f.encode_open(1, KubeAPITarget(), b"m", b"abc"), f.encode_open(3, KubeAPITarget(), b""),
    f.encode_data(1, b"xyz"), f.encode_data(1, b"", fin=True), f.encode_window_update(1, 5),
    f.encode_window_update(0, 7), f.encode_reset(3, 1), f.encode_ping(b"abcdefgh"),
    f.encode_pong(b"abcdefgh"), f.encode_open_ack(2), f.encode_goaway(1, 0), f.encode_drain(),
    f.encode_settings({1: 4096}), f.encode_data(9, b"q"),
]), max_size=12), st.binary(max_size=40), st.integers(0, 400))
def test_session_never_crashes_on_mixed_and_mutated_frames(frames, junk, cut):
    data = bytearray(b"".join(frames) + junk)
    if data:
        data[cut % len(data)] ^= 0x5A
    agent = fresh_agent()
    try:
        view = memoryview(bytes(data))
        agent.receive(view)
        agent.take_events()
        wire(agent)
    except ProtocolError:
        pass


def test_agent_fin_queued_before_accept_goes_out_on_accept():
    hub, agent, _ = pair()
    sid = hub.open_stream(KubeAPITarget(), b"")
    feed(agent, wire(hub))
    agent.send_eof(sid)
    assert wire(agent) == b""
    agent.accept(sid)
    assert wire(agent) == f.encode_open_ack(sid) + f.data_header(sid, 0, True)


def test_small_writes_queued_together_leave_as_one_frame():
    hub, agent, _ = pair()
    sid = hub.open_stream(KubeAPITarget(), b"id", b"head", fin=True)
    feed(agent, wire(hub))
    agent.accept(sid)
    agent.send_data(sid, b"HTTP/1.1 200 OK\r\n\r\n")
    agent.send_data(sid, b"{}")
    agent.send_eof(sid)
    out = wire(agent)
    frames = [fr for fr, _end in f.decode_frames(memoryview(out), 1 << 20)]
    assert [(fr.type, fr.flags & f.FLAG_FIN, bytes(fr.payload)) for fr in frames] == [
        (f.OPEN_ACK, 0, b""), (f.DATA, f.FLAG_FIN, b"HTTP/1.1 200 OK\r\n\r\n{}")]
    assert ss.DataReceived(sid, b"HTTP/1.1 200 OK\r\n\r\n{}", True) in feed(hub, out)


def test_open_ack_waits_for_the_streams_first_frame_and_leads_it():
    """A short request is answered in one write: OPEN_ACK, then the response, then FIN."""
    hub, agent, _ = pair()
    sid = hub.open_stream(KubeAPITarget(), b"id", b"GET / HTTP/1.1\r\n\r\n", fin=True)
    feed(agent, wire(hub))
    agent.accept(sid)
    assert wire(agent) == b""  # nothing yet: the OPEN_ACK waits for the answer
    agent.send_data(sid, b"ok")
    assert wire(agent) == f.encode_open_ack(sid) + f.data_header(sid, 2, False) + b"ok"
    agent.send_eof(sid)
    assert wire(agent) == f.data_header(sid, 0, True)  # answered once only


def test_a_deferred_open_ack_leads_a_window_update_or_a_reset():
    hub, agent, _ = pair()
    sid = hub.open_stream(KubeAPITarget(), b"", bytes(200_000))
    feed(agent, wire(hub))
    agent.accept(sid)
    agent.consumed(sid, 200_000)  # the request body taken: credit goes back
    assert wire(agent) == f.encode_open_ack(sid) + f.encode_window_update(sid, 200_000)
    other = hub.open_stream(KubeAPITarget(), b"")
    feed(agent, wire(hub))
    agent.accept(other)
    agent.reset(other, ResetCode.CANCEL)
    assert wire(agent) == f.encode_open_ack(other) + f.encode_reset(other, ResetCode.CANCEL)


def test_large_writes_are_not_joined():
    hub, agent, _ = pair()
    sid = hub.open_stream(KubeAPITarget(), b"id", b"head", fin=True)
    feed(agent, wire(hub))
    agent.accept(sid)
    wire(agent)
    big = b"x" * ss.COALESCE_BELOW
    agent.send_data(sid, b"small")
    agent.send_data(sid, big)
    frames = [fr for fr, _end in f.decode_frames(memoryview(wire(agent)), 1 << 20)]
    sizes = [len(fr.payload) for fr in frames if fr.type == f.DATA]
    assert sizes == [5, len(big)]


def test_hub_announces_its_instance_and_how_many_share_its_address():
    _hub, agent, _ = pair(hub_cfg=SessionConfig(hub_instance=0xBEEF, hub_instances=3))
    assert (agent.peer_hub_instance, agent.peer_hub_instances) == (0xBEEF, 3)
    assert agent.peer_settings_received
    # A single hub process sends neither setting; the agent sees the defaults.
    _, plain_agent, _ = pair()
    assert (plain_agent.peer_hub_instance, plain_agent.peer_hub_instances) == (0, 1)


def test_agent_announces_its_version_and_instance_and_old_peers_ignore_them():
    cfg = SessionConfig(agent_version=(1 << 24) | (2 << 16) | 3, agent_instance=0xCAFE)
    hub, _agent, _ = pair(agent_cfg=cfg)
    assert (hub.peer_agent_version, hub.peer_agent_instance) == ((1 << 24) | (2 << 16) | 3,
                                                                 0xCAFE)
    plain_hub, _, _ = pair()  # an agent that predates them sends neither
    assert (plain_hub.peer_agent_version, plain_hub.peer_agent_instance) == (0, 0)
    # On the wire they are two more (id, value) pairs in the first SETTINGS: a hub that does
    # not know ids 7 and 8 ignores them, as it ignores any unknown id.
    first = next(fr for fr, _ in f.decode_frames(
        memoryview(wire(Session(cfg, opens_odd=False, clock=ManualClock(100.0)))), 1 << 20))
    settings = f.parse_settings(first.payload)
    assert settings[f.S_AGENT_VERSION] == cfg.agent_version
    assert settings[f.S_AGENT_INSTANCE] == 0xCAFE
    hub = fresh_agent()  # any session parses SETTINGS the same way
    feed(hub, f.encode_settings({99: 7}))  # an id from the future: ignored


@pytest.mark.parametrize(("key", "value"), [(f.S_HUB_INSTANCE, 0), (f.S_HUB_INSTANCES, 0),
                                            (f.S_HUB_INSTANCES, f.MAX_HUB_INSTANCES + 1),
                                            (f.S_AGENT_VERSION, 0), (f.S_AGENT_INSTANCE, 0)])
def test_hub_instance_settings_out_of_range_are_refused(key, value):
    agent = fresh_agent()
    with pytest.raises(ProtocolError):
        feed(agent, f.encode_settings({key: value}))


def test_hub_announces_its_live_instances_first_and_whenever_they_change():
    hub, agent, _ = pair(hub_cfg=SessionConfig(hub_instance=5, hub_instances=2,
                                               hub_peers=(5, 9)))
    assert agent.peer_hub_peers == (5, 9)
    # On the wire: HUB_PEER is repeated, once per instance, in the same SETTINGS.
    hub.announce_hub_peers((5, 9, 12))
    out = wire(hub)
    frame = next(fr for fr, _ in f.decode_frames(memoryview(out), 1 << 20))
    assert frame.type == f.SETTINGS
    assert f.parse_settings_and_peers(frame.payload) == ({f.S_HUB_INSTANCES: 3,
                                                          f.S_HUB_PEER: 12}, (5, 9, 12))
    feed(agent, out)
    assert (agent.peer_hub_peers, agent.peer_hub_instances) == ((5, 9, 12), 3)
    # A SETTINGS without HUB_PEER leaves the set alone.
    feed(agent, f.encode_settings({f.S_INITIAL_WINDOW: 65536}))
    assert agent.peer_hub_peers == (5, 9, 12)
    # A hub without discovery announces no set: agents follow the count.
    _, plain, _ = pair(hub_cfg=SessionConfig(hub_instance=5, hub_instances=2))
    assert (plain.peer_hub_peers, plain.peer_hub_instances) == ((), 2)


def test_hub_peer_entries_are_bounded_and_non_zero():
    agent = fresh_agent()
    with pytest.raises(ProtocolError):
        feed(agent, f.encode_settings({}, tuple(range(1, f.MAX_HUB_INSTANCES + 2))))
    with pytest.raises(ProtocolError):
        feed(fresh_agent(), f.encode_settings({}, (0,)))
    feed(fresh_agent(), f.encode_settings({}, tuple(range(1, f.MAX_HUB_INSTANCES + 1))))
