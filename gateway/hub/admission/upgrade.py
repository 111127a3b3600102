"""Which upgrades the gateway splices (DESIGN §2.1, §2.8): pure, on the routed request.

Kubernetes streams (exec, attach, port-forward) upgrade to WebSocket or SPDY/3.1; a Service
reached through the service form speaks for itself. Anything else is refused with 400 before
the hub is asked anything, and an upgrade request never carries a body.

Refused too (400), because the request is ambiguous or is not a Kubernetes stream:

* more than one ``Upgrade`` header (``websocket`` and ``h2c``...), whether or not ``Connection``
  nominates ``upgrade``: the gateway and the next hop could each pick a different one;
* a Kubernetes-API upgrade that offers no Kubernetes stream subprotocol. What client-go and
  kubectl send (k8s.io/apimachinery/pkg/util/httpstream, client-go/tools/remotecommand and
  portforward):

  - WebSocket exec/attach: ``Sec-WebSocket-Protocol: v5.channel.k8s.io, v4.channel.k8s.io, ...``
    (older and browser clients: ``channel.k8s.io``, ``base64.channel.k8s.io``,
    ``v4.base64.channel.k8s.io``; WebSocket port-forward of those clients uses the same names);
  - WebSocket port-forward (tunnelled SPDY, kubectl >= 1.30):
    ``Sec-WebSocket-Protocol: SPDY/3.1+portforward.k8s.io``;
  - SPDY exec/attach: one ``X-Stream-Protocol-Version`` header per offered protocol
    (``v5.channel.k8s.io`` ... ``channel.k8s.io``); SPDY port-forward: ``portforward.k8s.io``.

  So a WebSocket upgrade must offer ``channel.k8s.io``, ``*.channel.k8s.io`` or
  ``SPDY/3.1+portforward.k8s.io`` (the bearer-token subprotocol does not count), and a SPDY
  upgrade ``channel.k8s.io``, ``*.channel.k8s.io`` or ``portforward.k8s.io``. Names are matched
  exactly, as the kubelet and the apiserver match them.
"""

from __future__ import annotations

from gateway.hub.admission.routing import ClusterRoute
from gateway.wire.http1 import RequestHead
from gateway.wire.websocket import BEARER_PROTOCOL_PREFIX

# Upgrades only for Kubernetes streaming endpoints and the protocols kubectl speaks.
ALLOWED_UPGRADES = frozenset({b"websocket", b"spdy/3.1"})
STREAMING_SUBRESOURCES = frozenset({b"exec", b"attach", b"portforward"})

CHANNEL_PROTOCOL = b"channel.k8s.io"
PORTFORWARD_PROTOCOL = b"portforward.k8s.io"
WEBSOCKET_PORTFORWARD_PROTOCOL = b"SPDY/3.1+portforward.k8s.io"


class UpgradeRefused(ValueError):
    """An upgrade the gateway does not splice (400)."""

    status = 400


def is_streaming_endpoint(cluster_route: ClusterRoute) -> bool:
    """exec/attach/portforward of a pod, or the service form (the Service speaks for itself)."""
    if cluster_route.service is not None:
        return True
    path = cluster_route.upstream_target.partition(b"?")[0]
    parts = path.split(b"/")
    # /api/v1/namespaces/<ns>/pods/<name>/<sub>
    return (
        len(parts) == 8
        and parts[1:4] == [b"api", b"v1", b"namespaces"]
        and parts[5] == b"pods"
        and parts[7] in STREAMING_SUBRESOURCES
    )


def _listed(values: list[bytes]) -> list[bytes]:
    """The comma-separated elements of every value, stripped, empty ones dropped."""
    return [p for v in values for p in (e.strip(b" \t") for e in v.split(b",")) if p]


def _is_channel(protocol: bytes) -> bool:
    return protocol == CHANNEL_PROTOCOL or protocol.endswith(b"." + CHANNEL_PROTOCOL)


def offers_stream_protocol(head: RequestHead, upgrade: bytes) -> bool:
    """Does this WebSocket (``upgrade`` b"websocket") or SPDY upgrade offer a Kubernetes stream
    subprotocol? See the module docstring for the names."""
    if upgrade == b"websocket":
        offered = [p for p in _listed(head.get_all(b"sec-websocket-protocol"))
                   if not p.startswith(BEARER_PROTOCOL_PREFIX)]
        return any(_is_channel(p) or p == WEBSOCKET_PORTFORWARD_PROTOCOL for p in offered)
    offered = _listed(head.get_all(b"x-stream-protocol-version"))
    return any(_is_channel(p) or p == PORTFORWARD_PROTOCOL for p in offered)


def check_upgrade(head: RequestHead, cluster_route: ClusterRoute) -> bool:
    """True for an acceptable upgrade request, False for none; :class:`UpgradeRefused` else."""
    if head.names.count(b"upgrade") > 1:  # names are lower-cased
        raise UpgradeRefused("more than one Upgrade header")
    if head.upgrade is None:
        return False  # Upgrade without Connection: upgrade is not a request to upgrade
    protocol = head.upgrade.strip().lower()
    if protocol not in ALLOWED_UPGRADES:
        raise UpgradeRefused("upgrade is allowed only to websocket or SPDY/3.1")
    if not is_streaming_endpoint(cluster_route):
        raise UpgradeRefused(
            "upgrade is allowed only for exec, attach, portforward and services")
    if head.chunked or head.content_length:
        raise UpgradeRefused("an upgrade request cannot carry a body")
    if cluster_route.service is None and not offers_stream_protocol(head, protocol):
        raise UpgradeRefused(
            "upgrade offers no Kubernetes stream protocol (*.channel.k8s.io, "
            "portforward.k8s.io or SPDY/3.1+portforward.k8s.io)")
    return True
