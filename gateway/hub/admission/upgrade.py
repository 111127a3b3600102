"""Which upgrades the gateway splices (DESIGN §2.1, §2.8): pure, on the routed request.

Kubernetes streams (exec, attach, port-forward) upgrade to WebSocket or SPDY/3.1; a Service
reached through the service form speaks for itself. Anything else is refused with 400 before
the hub is asked anything, and an upgrade request never carries a body.
"""

from __future__ import annotations

from gateway.hub.admission.routing import ClusterRoute
from gateway.wire.http1 import RequestHead

# Upgrades only for Kubernetes streaming endpoints and the protocols kubectl speaks.
ALLOWED_UPGRADES = frozenset({b"websocket", b"spdy/3.1"})
STREAMING_SUBRESOURCES = frozenset({b"exec", b"attach", b"portforward"})


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


def check_upgrade(head: RequestHead, cluster_route: ClusterRoute) -> bool:
    """True for an acceptable upgrade request, False for none; :class:`UpgradeRefused` else."""
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
    return True
