"""Which upgrades the gateway splices: the subprotocols real clients offer pass, others do not."""

from __future__ import annotations

import pytest

from gateway.hub.admission.routing import route
from gateway.hub.admission.upgrade import UpgradeRefused, check_upgrade
from gateway.wire.http1 import parse_request_head

EXEC = b"/c1/api/v1/namespaces/default/pods/web/exec?command=sh"
PORTFORWARD = b"/c1/api/v1/namespaces/default/pods/web/portforward"
SERVICE = b"/c1/api/v1/namespaces/ns/services/web:80/proxy-service/ws"
WS = b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
SPDY = b"Upgrade: SPDY/3.1\r\nConnection: Upgrade\r\n"


def check(target: bytes, headers: bytes) -> bool:
    head = parse_request_head(b"GET " + target + b" HTTP/1.1\r\nHost: gw\r\n" + headers
                              + b"\r\n")
    return check_upgrade(head, route(target))


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        # kubectl >= 1.30 exec/attach over WebSocket (client-go remotecommand)
        (EXEC, WS + b"Sec-WebSocket-Protocol: v5.channel.k8s.io, v4.channel.k8s.io\r\n"),
        # older and browser clients
        (EXEC, WS + b"Sec-WebSocket-Protocol: channel.k8s.io\r\n"),
        (EXEC, WS + b"Sec-WebSocket-Protocol: v4.base64.channel.k8s.io, base64.channel.k8s.io\r\n"),
        # the bearer token subprotocol next to a stream protocol
        (EXEC, WS + b"Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.YQ,"
         b" v5.channel.k8s.io\r\n"),
        # kubectl >= 1.30 port-forward over WebSocket (tunnelled SPDY)
        (PORTFORWARD, WS + b"Sec-WebSocket-Protocol: SPDY/3.1+portforward.k8s.io\r\n"),
        (PORTFORWARD, WS + b"Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n"),
        # SPDY exec: one X-Stream-Protocol-Version header per protocol
        (EXEC, SPDY + b"X-Stream-Protocol-Version: v5.channel.k8s.io\r\n"
         b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
         b"X-Stream-Protocol-Version: channel.k8s.io\r\n"),
        (PORTFORWARD, SPDY + b"X-Stream-Protocol-Version: portforward.k8s.io\r\n"),
        # a Service speaks for itself
        (SERVICE, WS + b"Sec-WebSocket-Protocol: chat\r\n"),
        (SERVICE, WS),
    ],
)
def test_kubernetes_stream_upgrades_accepted(target: bytes, headers: bytes) -> None:
    assert check(target, headers) is True


@pytest.mark.parametrize(
    ("target", "headers", "reason"),
    [
        (EXEC, WS, "no Kubernetes stream protocol"),
        (EXEC, WS + b"Sec-WebSocket-Protocol: chat, superchat\r\n", "no Kubernetes stream"),
        (EXEC, WS + b"Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.YQ\r\n",
         "no Kubernetes stream"),
        (EXEC, WS + b"Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io."
         b"x.channel.k8s.io\r\n", "no Kubernetes stream"),
        (EXEC, WS + b"Sec-WebSocket-Protocol: v5.channel.k8s.io.evil\r\n", "no Kubernetes"),
        (EXEC, WS + b"Sec-WebSocket-Protocol: portforward.k8s.io\r\n", "no Kubernetes stream"),
        (EXEC, WS + b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n", "no Kubernetes"),
        (EXEC, SPDY, "no Kubernetes stream protocol"),
        (EXEC, SPDY + b"Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n", "no Kubernetes"),
        (PORTFORWARD, SPDY + b"X-Stream-Protocol-Version: SPDY/3.1+portforward.k8s.io\r\n",
         "no Kubernetes"),
        (EXEC, b"Upgrade: websocket\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n"
         b"Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n", "more than one Upgrade"),
        (EXEC, b"Upgrade: h2c\r\nUpgrade: websocket\r\n", "more than one Upgrade"),
        (SERVICE, b"Upgrade: websocket\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
         "more than one Upgrade"),
        (EXEC, b"Upgrade: websocket, h2c\r\nConnection: Upgrade\r\n"
         b"Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n", "only to websocket"),
    ],
)
def test_ambiguous_or_foreign_upgrades_refused(target: bytes, headers: bytes, reason: str
                                               ) -> None:
    with pytest.raises(UpgradeRefused) as info:
        check(target, headers)
    assert info.value.status == 400 and reason in str(info.value)


def test_upgrade_header_without_connection_upgrade_is_no_upgrade() -> None:
    assert check(EXEC, b"Upgrade: websocket\r\n") is False
