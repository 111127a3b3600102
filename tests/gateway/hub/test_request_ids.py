"""One id per request (issue 24 item 3), at the front door, on real TLS sockets: the gateway's
request id is what its audit line names, what the OPEN carries to the agent (which sends it to
the apiserver as ``Audit-ID``; see tests/gateway/agent/test_fast_path.py and the real
apiserver's audit log in tests/realkube/test_managed_audit.py), and the ``Audit-Id`` of every
answer the gateway gives itself. Every request has its own, also one refused before its head
was whole on a connection that already carried one."""

from __future__ import annotations

import json
import logging

import pytest

from gateway.ops.audit import AUDIT_LOGGER
from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    Tls,
    get,
    h2tls,  # noqa: F401 - the session fixture
    read_response,
    running,
    tls,  # noqa: F401 - the session fixture
)

pytestmark = pytest.mark.timeout(30)


def audit_ids(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [json.loads(r.getMessage())["request_id"] for r in caplog.records
            if r.name == AUDIT_LOGGER]


async def test_each_http1_request_on_one_connection_has_its_own_id(
        tls: Tls, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    async with running(tls) as h:
        h.gateway._audit = True
        h.connect_cluster("c1")
        reader, writer = await h.open()
        answers = []
        for raw in (get("/c1/api"), get("/c1/api", token="not-a-hub-token"), get("/c1/api"),
                    b"GET /c1/api HTTP/1.1\r\nHost: gw\r\nBad Header\r\n\r\n"):
            writer.write(raw)
            answers.append(await read_response(reader))
        writer.close()
    assert [status for status, _, _ in answers] == [200, 401, 200, 400]
    ids = audit_ids(caplog)
    assert len(ids) == 4 and len(set(ids)) == 4, ids  # the parse error got its own, too
    forwarded = [json.loads(s.metadata)["rid"] for s in h.streams("c1")]
    assert forwarded == [ids[0], ids[2]]
    assert [headers.get("audit-id") for _, headers, _ in answers[1::2]] == [ids[1], ids[3]]


async def test_each_http2_stream_has_its_own_id(h2tls: Tls,  # noqa: F811
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    async with running(h2tls) as h:
        h.gateway._audit = True
        h.connect_cluster("c1")
        c = await H2Client.connect(h.port, h.tls.ca_file)
        try:
            ok = await c.request("/c1/version", token=HUB_TOKEN)
            refused = await c.request("/c1/version", token="not-a-hub-token")
            unknown = await c.request("/nowhere/version", token=HUB_TOKEN)
        finally:
            await c.close()
    assert (ok.status, refused.status, unknown.status) == (200, 401, 404)
    ids = audit_ids(caplog)
    assert len(ids) == 3 and len(set(ids)) == 3, ids
    assert [json.loads(s.metadata)["rid"] for s in h.streams("c1")] == [ids[0]]
    assert [refused.headers.get("audit-id"), unknown.headers.get("audit-id")] == ids[1:]


def test_request_ids_are_drawn_afresh_in_a_forked_worker() -> None:
    """Ids come 256 to a getrandom call; a worker forked with some of them left over must not
    hand out the ones its parent will."""
    import os

    from gateway.hub.admission.chain import new_request_id

    first = new_request_id()  # the parent now holds a batch
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        try:
            os.write(write, ",".join(new_request_id() for _ in range(255)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split(","))
    os.waitpid(pid, 0)
    parent = {new_request_id() for _ in range(255)}
    assert len(child) == 255 and first not in child
    assert not child & parent
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in child | parent)
