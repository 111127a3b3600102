"""A connection keeps admission's decision on its last header list (``HeaderVerdict``): each
request is still judged on its own headers, over real TLS sockets, and the kept decision is
never shared in a way a later request could change."""

from __future__ import annotations

import json

import pytest

from gateway.hub.admission.chain import (
    HeaderVerdict,
    Refusal,
    forwarded_head,
    header_block,
    prepare,
)
from gateway.hub.admission.routing import route
from gateway.wire.http1 import parse_request_head, serialize_request_head
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    MANAGED_TOKEN,
    OTHER_TOKEN,
    Harness,
    get,
    read_response,
    running,
    tls,  # noqa: F401  (fixture)
)
from tests.gateway.hub.test_frontdoor_harness import gw as gw
from tests.support import needs_pure

pytestmark = pytest.mark.timeout(30)


async def test_rule2_every_request_on_a_connection_is_judged_on_its_own_headers(
        gw: Harness) -> None:
    reader, writer = await gw.open()

    async def send(raw: bytes) -> tuple[int, dict]:
        writer.write(raw)
        status, _, body = await read_response(reader)
        return status, json.loads(body)

    status, first = await send(get("/c1/api/v1/pods"))
    assert status == 200
    # The same connection, the same headers plus one that may never cross: refused.
    status, body = await send(get("/c1/api/v1/pods", extra="Impersonate-User: admin\r\n"))
    assert (status, body["code"]) == (403, 403)
    # The token copied into another header: refused, though the headers before were fine.
    status, body = await send(get("/c1/api/v1/pods", extra=f"X-Token: {HUB_TOKEN}\r\n"))
    assert status == 400
    # Another caller's token on the same connection: its own identity, not the last one's.
    status, seen = await send(get("/c1/api/v1/pods", token=OTHER_TOKEN))
    assert status == 200 and seen["metadata"]["user"] == "cluster:hub:bob"
    # The first request again: forwarded exactly as the first time, never with a token.
    status, again = await send(get("/c1/api/v1/pods"))
    assert status == 200
    assert again["headers"] == first["headers"]
    assert again["metadata"]["user"] == first["metadata"]["user"]
    assert all(name.lower() != "authorization" for name, _ in again["headers"])
    # The same headers with another target carrying the token: refused all the same.
    status, _ = await send(get(f"/c1/api/v1/pods?access_token={HUB_TOKEN}"))
    assert status == 400
    writer.close()


async def test_passthrough_on_a_kept_verdict_adds_the_token_to_that_request_only(
        tls) -> None:  # noqa: F811
    async with running(tls, token_passthrough=True) as h:
        h.connect_cluster("c1")
        reader, writer = await h.open()
        for _ in range(2):  # the second request takes the kept verdict
            writer.write(get("/c1/api", token=MANAGED_TOKEN))
            status, _, body = await read_response(reader)
            assert status == 200
            headers = json.loads(body)["headers"]
            assert headers.count(["Authorization", f"Bearer {MANAGED_TOKEN}"]) == 1
        writer.write(get("/c1/api"))  # a hub token: verified, impersonated, never forwarded
        status, _, body = await read_response(reader)
        assert status == 200 and HUB_TOKEN not in body.decode()
        writer.close()


def _head(extra: bytes = b"") -> bytes:
    return (b"GET /c1/api/v1/pods HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer "
            + HUB_TOKEN.encode() + b"\r\n" + extra + b"\r\n")


def test_a_verdict_is_used_only_for_equal_headers_address_and_destination() -> None:
    verdict = HeaderVerdict()
    first = prepare(parse_request_head(_head(b"Expect: 100-continue\r\n")), "10.0.0.1",
                    last=verdict)
    assert verdict.received is not None
    assert all(name.lower() != b"expect" for name, _ in first.headers)
    again = prepare(parse_request_head(_head(b"Expect: 100-continue\r\n")), "10.0.0.1",
                    last=verdict)
    assert again.headers is first.headers  # taken as decided
    # Another client address: X-Forwarded-For differs, so it is decided again.
    other = prepare(parse_request_head(_head(b"Expect: 100-continue\r\n")), "10.0.0.2",
                    last=verdict)
    assert (b"X-Forwarded-For", b"10.0.0.2") in other.headers
    # A refused list leaves no verdict for it behind, and refuses every time.
    for _ in range(2):
        with pytest.raises(Refusal) as refused:
            prepare(parse_request_head(_head(b"Impersonate-Group: system:masters\r\n")),
                    "10.0.0.2", last=verdict)
        assert refused.value.status == 403


def test_a_repeated_target_headers_and_address_take_the_last_preparation_only() -> None:
    """Steps 1-5 are a pure function of the target, the header list and the client's
    address: a request repeating all three takes the last request's result as it was; a change
    of any one is judged again, and a refusal in between leaves nothing to take."""
    verdict = HeaderVerdict()
    first = prepare(parse_request_head(_head()), "10.0.0.1", last=verdict)
    assert prepare(parse_request_head(_head()), "10.0.0.1", last=verdict) is first
    post = _head().replace(b"GET", b"POST", 1)  # another method: the same preparation
    assert prepare(parse_request_head(post), "10.0.0.1", last=verdict) is first
    other = _head().replace(b"/c1/api/v1/pods", b"/c2/api/v1/pods", 1)
    assert prepare(parse_request_head(other), "10.0.0.1", last=verdict).route.cluster == "c2"
    assert prepare(parse_request_head(_head()), "10.0.0.2", last=verdict) is not first
    first = prepare(parse_request_head(_head()), "10.0.0.1", last=verdict)
    # The same target with other headers that are decided (and kept) before the request is
    # refused: refused again, never given the result kept for the first headers.
    leaky = _head(b"X-Token: " + HUB_TOKEN.encode() + b"\r\n")
    for _ in range(2):
        with pytest.raises(Refusal) as refused:
            prepare(parse_request_head(leaky), "10.0.0.1", last=verdict)
        assert refused.value.status == 400
    assert prepare(parse_request_head(_head()), "10.0.0.1", last=verdict) is not first
    verdict.forget()
    assert verdict.prepared is None


def test_a_verdict_keeps_its_own_copy_of_the_headers() -> None:
    """A head whose header list changes after admission cannot make a later request with
    the changed list pass on the old decision."""
    verdict = HeaderVerdict()
    head = parse_request_head(_head())
    prepare(head, "10.0.0.1", last=verdict)
    head.headers.append((b"Impersonate-User", b"admin"))
    with pytest.raises(Refusal) as refused:
        prepare(head, "10.0.0.1", last=verdict)
    assert refused.value.status == 403


async def test_a_kept_verdict_forwards_each_request_with_its_own_request_line(
        gw: Harness) -> None:
    """The forwarded fields of a kept verdict are serialised once; the request line is each
    request's own (method, target, version), and the fields are those of the first."""
    reader, writer = await gw.open()
    seen = []
    for target in ("/c1/api/v1/pods", "/c1/apis/apps/v1/deployments?limit=5", "/c1/version"):
        writer.write(get(target))
        status, _, body = await read_response(reader)
        assert status == 200
        seen.append(json.loads(body))
    assert [s["target"] for s in seen] == ["/api/v1/pods", "/apis/apps/v1/deployments?limit=5",
                                           "/version"]
    assert seen[1]["headers"] == seen[0]["headers"] == seen[2]["headers"]
    writer.close()


@pytest.mark.parametrize("extra", [b"", b"Accept: application/json\r\n", b"X-A: \t b\r\n"])
@pytest.mark.parametrize("version", [b"HTTP/1.1", b"HTTP/1.0"])
def test_a_forwarded_head_from_a_kept_block_is_what_the_serialiser_makes(
        extra: bytes, version: bytes) -> None:
    head = parse_request_head(_head(extra).replace(b"HTTP/1.1", version, 1))
    prepared = prepare(head, "10.0.0.1", last=HeaderVerdict())
    assert prepared.block is not None
    for target in (b"/api/v1/pods", b"/api/v1/pods?watch=1&rv=5"):
        assert forwarded_head(head, target, prepared.headers, prepared.block) == \
            serialize_request_head(head.method, target, prepared.headers, version)
    assert forwarded_head(head, b"/", [], header_block([])) == b"GET / %s\r\n\r\n" % version


def test_a_kept_block_does_not_spare_the_request_line_its_checks() -> None:
    head = parse_request_head(_head())
    block = header_block(prepare(head, "10.0.0.1").headers)
    for target in (b"/api v1", b"/api\r\nX: y", b""):
        with pytest.raises(ValueError):
            forwarded_head(head, target, [], block)
    assert header_block([(b"X", b"a\r\nInjected: 1")]) is None


def test_a_verdict_routes_a_repeated_target_once_and_keeps_no_refused_one() -> None:
    """The connection's last route is taken for the same target; a target whose request was
    refused (here: the hub token in its query) is never kept, and is refused every time."""
    verdict = HeaderVerdict()
    head = parse_request_head(_head())
    first = prepare(head, "10.0.0.1", last=verdict)
    again = prepare(parse_request_head(_head()), "10.0.0.1", last=verdict)
    # route() makes a new ClusterRoute on every call: the same object is the kept one.
    assert route(head.target) is not first.route
    assert again.route is first.route
    leaky = _head().replace(head.target, head.target + b"?token=" + HUB_TOKEN.encode(), 1)
    for _ in range(2):
        with pytest.raises(Refusal) as refused:
            prepare(parse_request_head(leaky), "10.0.0.1", last=verdict)
        assert refused.value.status == 400
        assert HUB_TOKEN.encode() not in verdict.target
    verdict.forget()
    assert verdict.route is None and verdict.target == b""


async def test_rule5_a_connection_keeps_its_tokens_review_key_and_changes_it_with_the_token(
        gw: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The token's review-cache key (a MAC, never the token) is made once per connection and
    token, not per request; another token on the same connection gets its own key (and its
    own identity), and a new connection makes its own."""
    from gateway.hub.admission import auth

    needs_pure(auth)
    authenticator = gw.gateway.authenticator
    macs: list[bytes] = []
    real_mac = authenticator._mac  # type: ignore[attr-defined]
    monkeypatch.setattr(authenticator, "_mac", lambda token: macs.append(token.encode())
                        or real_mac(token))
    # Two connections interleaved: a one-entry memo in the authenticator would miss each time.
    conns = [await gw.open() for _ in range(2)]

    async def send(conn: int, token: str = HUB_TOKEN) -> str:
        reader, writer = conns[conn]
        writer.write(get("/c1/api/v1/pods", token=token))
        status, _, body = await read_response(reader)
        assert status == 200
        return str(json.loads(body)["metadata"]["user"])

    for _ in range(3):
        for conn in (0, 1):
            assert await send(conn) == "cluster:hub:system:serviceaccount:team:alice"
    assert macs.count(HUB_TOKEN.encode()) == 2  # once per connection
    made = len(macs)
    assert await send(0, OTHER_TOKEN) == "cluster:hub:bob"
    assert await send(0, OTHER_TOKEN) == "cluster:hub:bob"
    # The key follows the token back.
    assert await send(0) == "cluster:hub:system:serviceaccount:team:alice"
    assert macs[made:] == [OTHER_TOKEN.encode(), HUB_TOKEN.encode()]  # one per change
    for _, writer in conns:
        writer.close()


async def test_a_kept_request_line_is_taken_only_for_the_same_method_target_and_version(
        gw: Harness) -> None:
    """A connection's last forwarded head is reused only for a request with the same request
    line and fields: every other method, target or version is forwarded as its own."""
    reader, writer = await gw.open()
    sent = [("GET", "/c1/api/v1/pods"), ("GET", "/c1/api/v1/pods"), ("DELETE", "/c1/api/v1/pods"),
            ("GET", "/c1/api/v1/pods"), ("GET", "/c1/api/v1/pods?watch=1"),
            ("GET", "/c1/api/v1/pods")]
    for method, target in sent:
        writer.write(get(target).replace(b"GET", method.encode(), 1))
        status, _, body = await read_response(reader)
        assert status == 200
        seen = json.loads(body)
        assert (seen["method"], seen["target"]) == (method, target.removeprefix("/c1"))
    writer.close()
    # The head as the agent got it, version included: one connection, HTTP/1.0 after 1.1.
    reader, writer = await gw.open()
    for version in (b"HTTP/1.1", b"HTTP/1.0"):
        writer.write(get("/c1/version").replace(b"HTTP/1.1", version, 1)
                     .replace(b"\r\n\r\n", b"\r\nConnection: keep-alive\r\n\r\n"))
        status, _, _ = await read_response(reader)
        assert status == 200
        assert bytes(gw.streams()[-1].received).startswith(b"GET /version " + version + b"\r\n")
    writer.close()
