"""The agent's synchronous paths: cached identities and stream setup without a task.

They must decide exactly as the full paths do; these tests make the full path unavailable where
the fast one is claimed, and compare what the upstream receives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.agent.agent import Agent
from gateway.agent.exchange import HttpExchange
from gateway.agent.kubeapi import from_kubeconfig
from gateway.agent.pool import UpstreamPool
from gateway.wire.identity import Identity
from tests.gateway.agent.conftest import Upstream
from tests.gateway.agent.test_exchange import (
    AGENT_TOKEN,
    HUB_TOKEN,
    FakePolicy,
    Resolved,
    get,
    open_stream,
    seen_headers,
    write_kubeconfig,
)
from tests.support import tasks_started
from tunnel.errors import OpenErrorCode
from tunnel.targets import KubeAPITarget

pytestmark = pytest.mark.timeout(30)


class ImmediatePolicy(FakePolicy):
    """Knows the apiserver address without a lookup, like tunnel.policy.TargetPolicy."""

    def resolve_now(self, target: Any) -> Resolved | None:
        if isinstance(target, KubeAPITarget):
            return Resolved(self.kube[0], self.kube[1], None, True)
        return None


@pytest.fixture
def agent(upstream: Upstream, tmp_path: Path) -> Agent:
    token_file = tmp_path / "token"
    token_file.write_text(AGENT_TOKEN + "\n")
    access = from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", upstream, token_file)))
    return Agent(cluster="c1", policy=ImmediatePolicy((upstream.host, upstream.port), {}),
                 kube=access, pool=UpstreamPool())


def metadata(user: str, rid: str) -> bytes:
    return Identity(user=user, groups=("cluster:hub:team",), uid="u-1", extra={},
                    request_id=rid).to_metadata()


class CountingIdentity:
    decoded = 0

    @classmethod
    def from_metadata(cls, data: bytes) -> Identity:
        cls.decoded += 1
        return Identity.from_metadata(data)


async def request(agent: Agent, meta: bytes, path: str = "/echo/x") -> Any:
    stream = open_stream(agent, KubeAPITarget(), meta, get(path))
    stream.send_eof()
    await stream.wait_done()
    return stream


REQUEST_ID_EXTRA = "impersonate-extra-hubproxy.dev%2frequest-id"


async def test_a_users_later_requests_reuse_the_decoded_identity(agent: Agent) -> None:
    """The identity is decoded once per user, but every request carries its own id to the
    apiserver, as the extra and as Audit-ID (issue 24: the cached headers held the first
    request's id, and 49 of 53 requests of one user carried it)."""
    CountingIdentity.decoded = 0
    agent._decode_identity = CountingIdentity.from_metadata
    alice, bob = "cluster:hub:alice", "cluster:hub:bob"
    seen = []
    for user, rid in ((alice, "0a1b"), (alice, "ffee"), (bob, "0a1b"), (alice, "77")):
        stream = await request(agent, metadata(user, rid))
        assert stream.response()[0] == 200
        headers = seen_headers(json.loads(stream.response()[2]))
        seen.append([v for k, v in headers if k == "impersonate-user"])
        assert [v for k, v in headers if k == REQUEST_ID_EXTRA] == [rid]
        assert [v for k, v in headers if k == "audit-id"] == [rid]
        assert exchange_of(stream).request_id == rid
    assert seen == [[alice], [alice], [bob], [alice]]
    assert CountingIdentity.decoded == 2  # alice once, bob once


@pytest.mark.parametrize("passthrough", [False, True])
async def test_the_request_id_replaces_the_streams_audit_id(agent: Agent,
                                                            passthrough: bool) -> None:
    """Audit-ID is the gateway's request id whatever the stream's bytes say (kube-apiserver
    takes its audit event's ID from it), passthrough included; the impersonation extra only
    where there is impersonation."""
    meta = (Identity(user="", groups=(), uid="", request_id="5eed", passthrough=True)
            if passthrough else Identity(user="cluster:hub:alice", groups=(), uid="",
                                         request_id="5eed")).to_metadata()
    stream = open_stream(agent, KubeAPITarget(), meta,
                         get("/echo/a", "Audit-ID: client-chosen", "audit-id: another"))
    stream.send_eof()
    await stream.wait_done()
    headers = seen_headers(json.loads(stream.response()[2]))
    assert [v for k, v in headers if k == "audit-id"] == ["5eed"]
    assert [v for k, v in headers if k == REQUEST_ID_EXTRA] == ([] if passthrough else ["5eed"])


async def test_metadata_of_another_shape_is_decoded_and_checked_every_time(agent: Agent) -> None:
    CountingIdentity.decoded = 0
    agent._decode_identity = CountingIdentity.from_metadata
    good = metadata("cluster:hub:alice", "0a1b")
    prefix = good.rpartition(b',"rid":"')[0]
    # The cached prefix with a tail that is not a plain request id: each is decoded in full,
    # and judged as the full decode judges it.
    assert (await request(agent, good)).response()[0] == 200
    odd_rid = await request(agent, prefix + b',"rid":"x y"}')
    assert odd_rid.response()[0] == 200 and exchange_of(odd_rid).request_id == "x y"
    for tail in (b',"rid":"0a"}junk', b',"rid":"0a","v":2}'):
        stream = await request(agent, prefix + tail)
        assert stream.refused is not None and stream.refused[0] == OpenErrorCode.NO_IDENTITY
    assert CountingIdentity.decoded == 4


async def test_with_an_idle_connection_the_setup_needs_no_task(agent: Agent) -> None:
    with tasks_started() as dialing:
        first = await request(agent, metadata("cluster:hub:alice", "01"))
    assert first.response()[0] == 200 and agent.pool.dials == 1
    assert any("_setup" in name for name in dialing)  # no idle connection yet: a task dials

    with tasks_started() as pooled:
        for rid in ("02", "03"):
            stream = await request(agent, metadata("cluster:hub:alice", rid), f"/echo/{rid}")
            status, _, body = stream.response()
            assert status == 200 and json.loads(body)["path"] == f"/echo/{rid}"
            assert ("authorization", f"Bearer {AGENT_TOKEN}") in seen_headers(json.loads(body))
    assert not [name for name in pooled if "_setup" in name], pooled
    assert agent.pool.dials == 1


def exchange_of(stream: Any) -> HttpExchange:
    protocol = stream.protocol
    assert isinstance(protocol, HttpExchange)
    return protocol


async def test_an_open_watch_keeps_only_the_parsed_flags_of_its_heads(agent: Agent) -> None:
    stream = open_stream(agent, KubeAPITarget(), metadata("cluster:hub:alice", "0a"),
                         get("/watch", "X-Padding: " + "p" * 2000))
    stream.send_eof()
    exchange = exchange_of(stream)
    await stream.wait(lambda: stream.received.count(b"ADDED") >= 2, 10)
    assert exchange.request.headers == [] and exchange.response.headers == []
    assert not exchange._retryable  # (no rewritten head is kept to retry with)
    assert exchange.request.method == b"GET" and exchange.response.status == 200
    stream.client_reset()  # the client leaves: the upstream watch is cancelled as before
    await stream.wait(lambda: agent.pool.in_use == 0, 10)
    assert exchange.outcome == "cancelled"


async def test_a_head_with_the_last_ones_fields_is_read_by_its_request_line(
    agent: Agent,
) -> None:
    """The gateway forwards a client's fields unchanged from request to request, so the agent
    reads such a head by its request line (gateway.wire.repeatedhead: the kept head is not
    parsed again). Each request still reaches the apiserver as the full parse gives it: its
    own path, the agent's credential, the stream's Authorization never; and a request line
    that breaks a rule is refused as the full parse refuses it."""
    fields = (f"Authorization: Bearer {HUB_TOKEN}", "Impersonate-User: system:admin",
              "Accept: application/json")
    meta = metadata("cluster:hub:alice", "0a")

    async def send(request_line_path: str) -> Any:
        stream = open_stream(agent, KubeAPITarget(), meta, get(request_line_path, *fields))
        stream.send_eof()
        await stream.wait_done()
        return stream

    assert (await send("/echo/first")).response()[0] == 200
    kept = agent.heads._head
    assert kept is not None
    for path in ("/echo/second", "/echo/third?watch=0"):
        status, _, body = (await send(path)).response()
        entry = json.loads(body)
        assert status == 200 and entry["path"] == path
        headers = seen_headers(entry)
        assert ("authorization", f"Bearer {AGENT_TOKEN}") in headers
        assert ("authorization", f"Bearer {HUB_TOKEN}") not in headers
        assert [v for k, v in headers if k == "impersonate-user"] == ["cluster:hub:alice"]
        assert agent.heads._head is kept  # read by its request line
    refused = await send("/echo/a b")  # four parts: the full parse refuses it
    assert refused.refused is not None and refused.refused[0] == OpenErrorCode.PROTOCOL
    other = open_stream(agent, KubeAPITarget(), meta, get("/echo/other", "Accept: */*"))
    other.send_eof()
    await other.wait_done()
    assert other.response()[0] == 200 and agent.heads._head is not kept  # other fields
