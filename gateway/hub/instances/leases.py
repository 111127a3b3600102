"""What an instance Lease says, as pure functions over Lease objects (no I/O).

Each gateway process (each ``--workers`` worker too) holds one ``coordination.k8s.io/v1``
Lease in the gateway's namespace, named ``hubproxy-gateway-<instance id, hex>`` and labelled
``app.kubernetes.io/component=gateway-instance``: its instance id (the tunnel's HUB_INSTANCE) in
the label ``hubproxy.io/instance``, and the clusters it serves (sorted, comma-separated) in the
annotation ``hubproxy.io/clusters`` -- or, when that text is longer than ``MAX_CLUSTERS_TEXT``,
zlib-compressed and base64-encoded in ``hubproxy.io/clusters-zlib`` (10,000 names like
``cluster-00042`` are 140 KB of text and 33 KB compressed; names with random parts compress
less: about 5,000 32-hex-digit names fit). A Lease whose ``renewTime + leaseDurationSeconds``
has passed belongs to a process that is gone (killed, partitioned): it is ignored, never deleted
by another instance (its owner may come back and renew it).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import zlib
from dataclasses import dataclass
from typing import Any

COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "gateway-instance"
SELECTOR = f"{COMPONENT_LABEL}={COMPONENT}"
INSTANCE_LABEL = "hubproxy.io/instance"
CLUSTERS_ANNOTATION = "hubproxy.io/clusters"
COMPRESSED_CLUSTERS_ANNOTATION = "hubproxy.io/clusters-zlib"
# Annotations share 256 KiB per object; beyond this (compressed) the list is left out (peers
# then learn nothing about this instance's clusters, and their readiness gate waits only its
# bound).
MAX_CLUSTERS_TEXT = 128 * 1024
MAX_INFLATED = 16 * 1024 * 1024  # a compressed list that inflates past this is not read


@dataclass(frozen=True)
class LiveInstance:
    instance: int
    clusters: frozenset[str] | None  # None: not published (too many, or an older gateway)


def lease_name(instance: int) -> str:
    return f"hubproxy-gateway-{instance:08x}"


def micro_time(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def clusters_annotations(clusters: list[str]) -> dict[str, str]:
    """The annotation that names ``clusters``: plain, compressed, or none if too long."""
    text = ",".join(sorted(clusters))
    if len(text) <= MAX_CLUSTERS_TEXT:
        return {CLUSTERS_ANNOTATION: text}
    # Level 1: 1-3 ms for 10,000 names, where level 9 takes up to 80 (on the event loop).
    packed = base64.b64encode(zlib.compress(text.encode(), 1)).decode("ascii")
    return {COMPRESSED_CLUSTERS_ANNOTATION: packed} if len(packed) <= MAX_CLUSTERS_TEXT else {}


def published_clusters(annotations: dict[str, str]) -> frozenset[str] | None:
    """The clusters a Lease's annotations name; None when it names none (too many, an older
    gateway, or a compressed list that does not decode)."""
    text = annotations.get(CLUSTERS_ANNOTATION)
    packed = annotations.get(COMPRESSED_CLUSTERS_ANNOTATION)
    if text is None and packed is not None:
        try:
            inflate = zlib.decompressobj()
            raw = inflate.decompress(base64.b64decode(packed, validate=True), MAX_INFLATED)
            if inflate.unconsumed_tail:
                return None  # more than any real list: refused, not read
            text = raw.decode()
        except (binascii.Error, zlib.error, UnicodeDecodeError):
            return None
    if text is None:
        return None
    return frozenset(c for c in text.split(",") if c)


def lease_body(instance: int, holder: str, duration: int, clusters: list[str],
               now: datetime.datetime) -> dict[str, Any]:
    """The whole Lease of ``instance`` (created, then replaced at each renewal)."""
    annotations = clusters_annotations(clusters)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(instance),
            "labels": {COMPONENT_LABEL: COMPONENT, "app.kubernetes.io/name": "hubproxy",
                       INSTANCE_LABEL: str(instance)},
            "annotations": annotations,
        },
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                 "renewTime": micro_time(now)},
    }


def _field(obj: Any, *names: str) -> Any:
    """A field of a Lease given as a kubernetes-asyncio model or a plain dict."""
    for name in names:
        if obj is None:
            return None
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return obj


def _parse_time(value: Any) -> datetime.datetime | None:
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def live_instances(leases: list[Any], now: datetime.datetime) -> dict[int, LiveInstance]:
    """The instances whose Lease has not expired at ``now``, by instance id.

    A Lease without a valid instance label, duration or renew time is not an instance's.
    """
    live: dict[int, LiveInstance] = {}
    for lease in leases:
        label = (_field(lease, "metadata", "labels") or {}).get(INSTANCE_LABEL, "")
        duration = _field(lease, "spec", "lease_duration_seconds") if not isinstance(
            lease, dict) else _field(lease, "spec", "leaseDurationSeconds")
        renewed = _parse_time(_field(lease, "spec", "renew_time") if not isinstance(
            lease, dict) else _field(lease, "spec", "renewTime"))
        if not label.isdigit() or not isinstance(duration, int) or renewed is None:
            continue
        instance = int(label)
        if not 0 < instance < 2**32:
            continue
        if renewed + datetime.timedelta(seconds=duration) < now:
            continue  # expired: its process is gone
        clusters = published_clusters(_field(lease, "metadata", "annotations") or {})
        live[instance] = LiveInstance(instance, clusters)
    return live


def missing_clusters(own: set[str], live: dict[int, LiveInstance], instance: int) -> set[str]:
    """Clusters another live instance serves and this one does not (yet)."""
    wanted: set[str] = set()
    for other in live.values():
        if other.instance != instance and other.clusters:
            wanted |= other.clusters
    return wanted - own
