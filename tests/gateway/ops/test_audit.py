from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ops import audit
from gateway.ops.audit import (
    AUDIT_LOGGER,
    REDACTED,
    audit_record,
    redact_target,
    request_done,
    stream_end,
    stream_start,
)

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (b"/api/v1/pods?watch=1&labelSelector=a%3Db", "/api/v1/pods?watch=1&labelSelector=a%3Db"),
        (b"/x?access_token=abc&limit=5", f"/x?access_token={REDACTED}&limit=5"),
        (b"/x?token=abc", f"/x?token={REDACTED}"),
        (b"/x?id_token=abc", f"/x?id_token={REDACTED}"),
        (b"/x?Authorization=Bearer%20abc", f"/x?Authorization={REDACTED}"),
        (
            b"/x?refresh_token=a&client_secret=b",
            f"/x?refresh_token={REDACTED}&client_secret={REDACTED}",
        ),
        (b"/x?ACCESS%5FTOKEN=abc", f"/x?ACCESS%5FTOKEN={REDACTED}"),
        (
            b"/x?password=p&api_key=k&apikey=k2",
            f"/x?password={REDACTED}&api_key={REDACTED}&apikey={REDACTED}",
        ),
        (b"/x?q=" + JWT.encode(), f"/x?q={REDACTED}"),
        (b"/x/" + JWT.encode() + b"/y", f"/x/{REDACTED}/y"),
        (b"/x?token", "/x?token"),
        (b"/x?", "/x?"),
        (b"/x", "/x"),
    ],
)
def test_rule5_token_like_query_values_redacted(target: bytes, expected: str) -> None:
    assert redact_target(target) == expected


def test_non_ascii_path_is_escaped_not_decoded() -> None:
    assert redact_target(b"/a\xff%2F") == "/a\\xff%2F"


def test_long_path_bounded() -> None:
    assert len(redact_target(b"/" + b"a" * 100_000)) <= 4096


def test_record_fields() -> None:
    record = audit_record(
        "request",
        request_id="r-1",
        user="system:serviceaccount:ns:sa",
        cluster="c1",
        method=b"GET",
        target=b"/api/v1/pods?token=secret",
        status=200,
        bytes_in=0,
        bytes_out=123,
        duration=0.0125,
        now=0.0,
        target_kind="kube-apiserver",
        absent=None,
    )
    assert record == {
        "event": "request",
        "ts": "1970-01-01T00:00:00.000Z",
        "request_id": "r-1",
        "user": "system:serviceaccount:ns:sa",
        "cluster": "c1",
        "method": "GET",
        "path": f"/api/v1/pods?token={REDACTED}",
        "status": 200,
        "bytes_in": 0,
        "bytes_out": 123,
        "duration_ms": 12.5,
        "target_kind": "kube-apiserver",
    }


def test_one_json_line_per_event_on_the_audit_logger(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
        start = stream_start(request_id="r", user="u", cluster="c", method="GET",
                             target=b"/api/v1/pods?watch=1")
        end = stream_end(request_id="r", status=200, bytes_out=10, duration=1.0)
        done = request_done(request_id="r2", method="GET", target=b"/x?token=t0k", status=401)
    records = [r for r in caplog.records if r.name == AUDIT_LOGGER]
    assert [r.getMessage() for r in records] == [start, end, done]
    assert [json.loads(line)["event"] for line in (start, end, done)] == [
        "stream_start", "stream_end", "request"
    ]
    for line in (start, end, done):
        assert "\n" not in line
        assert "t0k" not in line


def test_writer_batches_lines_of_one_loop_turn_into_one_write():
    import asyncio
    import io

    class CountingStream(io.StringIO):
        writes = 0

        def write(self, s: str) -> int:
            CountingStream.writes += 1
            return super().write(s)

    stream = CountingStream()
    writer = audit.AuditWriter(stream)

    async def burst() -> None:
        audit.install_writer(writer)
        try:
            for i in range(5):
                audit.request_done(request_id=f"r{i}", status=200)
            assert stream.getvalue() == ""  # nothing before the turn ends
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        finally:
            audit.install_writer(None)

    asyncio.run(burst())
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [f"r{i}" for i in range(5)]
    assert CountingStream.writes == 1


def test_writer_outside_a_loop_writes_at_once_and_uninstall_restores_the_logger(caplog):
    import io

    stream = io.StringIO()
    audit.install_writer(audit.AuditWriter(stream))
    try:
        audit.request_done(request_id="now", status=200)
        assert json.loads(stream.getvalue())["request_id"] == "now"
    finally:
        audit.install_writer(None)
    caplog.set_level(logging.INFO, logger=audit.AUDIT_LOGGER)
    audit.request_done(request_id="logged", status=200)
    assert any("logged" in r.getMessage() for r in caplog.records)


def test_timestamp_keeps_milliseconds_across_the_per_second_cache():
    assert audit._timestamp(1_700_000_000.123) == "2023-11-14T22:13:20.123Z"
    assert audit._timestamp(1_700_000_000.999) == "2023-11-14T22:13:20.999Z"
    assert audit._timestamp(1_700_000_001.0) == "2023-11-14T22:13:21.000Z"


def test_atomic_writer_never_writes_more_than_pipe_buf_unless_one_line_is_longer():
    import io

    class Recording(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[str] = []

        def write(self, s: str) -> int:
            self.writes.append(s)
            return super().write(s)

    stream = Recording()
    writer = audit.AuditWriter(stream, atomic=True)
    lines = [f'{{"n":{i},"pad":"{"x" * 700}"}}' for i in range(20)] + ["y" * 5000]
    writer._pending = list(lines)
    writer.flush()
    assert stream.getvalue().splitlines() == lines  # nothing lost, order kept
    assert all(w.endswith("\n") for w in stream.writes)  # cut only at line ends
    assert all(len(w) <= audit.ATOMIC_WRITE for w in stream.writes[:-1])
    assert stream.writes[-1] == "y" * 5000 + "\n"


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    event=st.sampled_from(["request", "stream_end"]),
    request_id=_text,
    user=st.none() | _text,
    cluster=st.none() | _text,
    method=st.none() | st.binary(max_size=10),
    target=st.none() | st.binary(max_size=80) | st.sampled_from(
        [b"/c1/api/v1/pods?token=x&watch=1", b"/c1/x/" + JWT.encode(), b"/c1/a\xffb"]),
    status=st.integers(0, 999),
    bytes_in=st.integers(0, 2**63),
    bytes_out=st.integers(0, 2**63),
    duration=st.floats(0, 1e7) | st.just(float("inf")),
    protocol=st.sampled_from(["h1", "h2"]),
    client=st.none() | _text,
    proxies=st.none() | st.lists(_text, min_size=1, max_size=3),
    now=st.floats(0, 4e9),
)
def test_request_line_is_the_record_formatted(event: str, request_id: str, user: str | None,
                                              cluster: str | None, method: bytes | None,
                                              target: bytes | None, status: int,
                                              bytes_in: int, bytes_out: int, duration: float,
                                              protocol: str, client: str | None,
                                              proxies: list[str] | None, now: float) -> None:
    """The per-request line, written in one go, is the generic record's line exactly: same
    fields, order, escaping and redaction (rule 5 holds for both)."""
    fields = dict(request_id=request_id, user=user, cluster=cluster, method=method,
                  target=target, status=status, bytes_in=bytes_in, bytes_out=bytes_out,
                  duration=duration, now=now)
    expected = audit.format_record(audit_record(event, protocol=protocol, client=client,
                                                proxies=proxies, **fields))
    line = audit.request_line(event, protocol=protocol, client=client, proxies=proxies,
                              **fields)
    assert line == expected
    json.loads(line)
    # With a connection's memo: the same line the first time and when repeated, and after
    # a line of other fields was kept.
    memo = audit.LineMemo()
    for _ in range(2):
        assert audit.request_line(event, protocol=protocol, client=client, proxies=proxies,
                                  memo=memo, **fields) == expected
    other = audit.request_line(event, protocol="h2", client="x", proxies=None, memo=memo,
                               **{**fields, "user": "other", "target": b"/other"})
    assert '"user":"other"' in other and '"path":"/other"' in other
    assert audit.request_line(event, protocol=protocol, client=client, proxies=proxies,
                              memo=memo, **fields) == expected


def test_rule5_a_line_memo_is_formatted_again_for_each_field_that_changes() -> None:
    """A connection's memo is used only for equal fields: another user, cluster, method,
    path, protocol, client or proxy list (even the same list changed afterwards) gets its own
    line, with its path redacted."""
    base = dict(request_id="r", user="alice", cluster="c1", method=b"GET", target=b"/c1/api",
                status=200, bytes_in=0, bytes_out=5, duration=0.001, protocol="h1",
                client="10.0.0.1", now=1.0e9)
    memo = audit.LineMemo()
    proxies = ["10.0.0.9"]
    audit.request_line("request", proxies=proxies, memo=memo, **base)
    changes = [dict(user="bob"), dict(cluster="c2"), dict(method=b"PUT"),
               dict(target=b"/c1/api?access_token=abc"), dict(protocol="h2"),
               dict(client="10.0.0.2")]
    for change in changes:
        fields = {**base, **change}
        assert audit.request_line("request", proxies=proxies, memo=memo, **fields) == \
            audit.request_line("request", proxies=proxies, **fields)
    audit.request_line("request", proxies=proxies, memo=memo, **base)
    proxies.append("10.0.0.8")  # the caller's list changed: its line changes with it
    line = audit.request_line("request", proxies=proxies, memo=memo, **base)
    assert json.loads(line)["proxies"] == ["10.0.0.9", "10.0.0.8"]
    assert "abc" not in audit.request_line(
        "request", proxies=None, memo=memo, **{**base, "target": b"/c1/api?token=abc"})
