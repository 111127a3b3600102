"""Gateway metrics in the Prometheus text format (no client library: a few counters suffice).

Labels are bounded and carry no secrets (DESIGN §6 rule 5): ``cluster`` is a cluster that
connected since start (anything else counts as ``cluster="_other"``, so random paths cannot
grow the label set), ``code`` an HTTP status. No user names, no tokens, no paths.

Counters are plain integers updated on the event loop (one increment per request, never per
chunk); :func:`render` reads them, plus live gauges from callables, when ``/metrics`` is asked.
With ``--workers`` each worker counts its own; the others send worker 0 a snapshot every second
(``gateway.ops.metricslink``) and worker 0's ``/metrics`` shows the sum.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

OTHER_CLUSTER = "_other"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class GatewayMetrics:
    requests: Counter[tuple[str, int]] = field(default_factory=Counter)
    bytes_in: int = 0  # client -> cluster (request bodies and raw upgraded bytes)
    bytes_out: int = 0  # cluster -> client
    active_streams: int = 0
    streams_total: int = 0
    connections_refused: int = 0
    # Live values read at scrape time.
    connected_agents: Callable[[], int] = lambda: 0
    cluster_names: Callable[[], Iterable[str]] = lambda: ()
    client_connections: Callable[[], int] = lambda: 0
    auth_reviews: Callable[[], int] = lambda: 0  # TokenReviews sent = cache misses
    auth_lookups: int = 0  # authentications asked for
    # Agent certificates (tunnel.listener): refusals by reason, expiry per connected cluster.
    handshake_failures: Callable[[], Mapping[str, int]] = lambda: {}
    certificate_expiry: Callable[[], Mapping[str, float]] = lambda: {}
    # With --workers: the latest snapshots of the other workers (worker 0 serves /metrics).
    peers: Callable[[], Iterable[dict[str, Any]]] = lambda: ()

    def stream_opened(self) -> None:
        self.active_streams += 1
        self.streams_total += 1

    def stream_closed(self) -> None:
        self.active_streams -= 1

    def request(self, cluster: str, code: int, bytes_in: int, bytes_out: int) -> None:
        self.requests[(cluster, code)] += 1
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out

    def snapshot(self) -> dict[str, Any]:
        """This process's figures as plain JSON values (what a worker sends to worker 0)."""
        return {
            "requests": [[cluster, code, count]
                         for (cluster, code), count in self.requests.items()],
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "active_streams": self.active_streams,
            "streams_total": self.streams_total,
            "connections_refused": self.connections_refused,
            "connected_agents": self.connected_agents(),
            "clusters": sorted(self.cluster_names()),
            "client_connections": self.client_connections(),
            "auth_reviews": self.auth_reviews(),
            "auth_lookups": self.auth_lookups,
            "handshake_failures": dict(self.handshake_failures()),
            "certificate_expiry": dict(self.certificate_expiry()),
        }

    def render(self) -> bytes:
        """Prometheus text: this process's figures plus the latest ones of its peer workers."""
        return render(merge([self.snapshot(), *self.peers()]))


SUMMED = ("bytes_in", "bytes_out", "active_streams", "streams_total", "connections_refused",
          "connected_agents", "client_connections", "auth_reviews", "auth_lookups")


def merge(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One gateway's figures from its workers': counts add up; a cluster counts once however
    many workers hold a session from it. Fields a snapshot lacks count as zero."""
    total: dict[str, Any] = dict.fromkeys(SUMMED, 0)
    requests: Counter[tuple[str, int]] = Counter()
    clusters: set[str] = set()
    snapshots_seen = list(snapshots)
    for snap in snapshots_seen:
        for key in SUMMED:
            value = snap.get(key, 0)
            if isinstance(value, int):
                total[key] += value
        for cluster, code, count in snap.get("requests", ()):
            requests[(str(cluster), int(code))] += int(count)
        clusters.update(str(c) for c in snap.get("clusters", ()))
    total["requests"] = requests
    total["connected_clusters"] = len(clusters)
    total.update(_merge_certificates(snapshots_seen))
    return total


def _merge_certificates(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Handshake failures add up; a cluster's expiry is the earliest any worker saw."""
    failures: Counter[str] = Counter()
    expiry: dict[str, float] = {}
    for snap in snapshots:
        for reason, count in snap.get("handshake_failures", {}).items():
            failures[str(reason)] += int(count)
        for cluster, not_after in snap.get("certificate_expiry", {}).items():
            cluster = str(cluster)
            expiry[cluster] = min(float(not_after), expiry.get(cluster, float("inf")))
    return {"handshake_failures": failures, "certificate_expiry": expiry}


def _render_certificates(m: dict[str, Any]) -> list[str]:
    lines = [
        "# HELP hubproxy_tunnel_handshake_failures_total Agent connections refused before a "
        "session, by reason (expired, not_yet_valid, unknown_ca, wrong_name, no_certificate, "
        "bad_certificate, protocol, timeout, aborted).",
        "# TYPE hubproxy_tunnel_handshake_failures_total counter",
    ]
    for reason, count in sorted(m.get("handshake_failures", {}).items()):
        lines.append(
            f'hubproxy_tunnel_handshake_failures_total{{reason="{_escape(reason)}"}} {count}')
    lines += [
        "# HELP hubproxy_agent_certificate_expiry_timestamp_seconds When the agent certificate "
        "of a connected cluster expires (the earliest of its sessions), in seconds since the "
        "epoch; days left: (value - time()) / 86400.",
        "# TYPE hubproxy_agent_certificate_expiry_timestamp_seconds gauge",
    ]
    for cluster, not_after in sorted(m.get("certificate_expiry", {}).items()):
        lines.append(f'hubproxy_agent_certificate_expiry_timestamp_seconds'
                     f'{{cluster="{_escape(cluster)}"}} {not_after:.0f}')
    return lines


def render(m: dict[str, Any]) -> bytes:
    reviews = m["auth_reviews"]
    lines = [
        "# HELP hubproxy_requests_total Requests answered, by cluster and HTTP status.",
        "# TYPE hubproxy_requests_total counter",
    ]
    for (cluster, code), count in sorted(m["requests"].items()):
        lines.append(
            f'hubproxy_requests_total{{cluster="{_escape(cluster)}",code="{code}"}} {count}'
        )
    lines += [
        "# HELP hubproxy_active_streams Tunnel streams currently carrying a request.",
        "# TYPE hubproxy_active_streams gauge",
        f"hubproxy_active_streams {m['active_streams']}",
        "# HELP hubproxy_streams_total Tunnel streams opened.",
        "# TYPE hubproxy_streams_total counter",
        f"hubproxy_streams_total {m['streams_total']}",
        "# HELP hubproxy_connected_agents Agent tunnel sessions connected.",
        "# TYPE hubproxy_connected_agents gauge",
        f"hubproxy_connected_agents {m['connected_agents']}",
        "# HELP hubproxy_connected_clusters Clusters with at least one agent session.",
        "# TYPE hubproxy_connected_clusters gauge",
        f"hubproxy_connected_clusters {m['connected_clusters']}",
        "# HELP hubproxy_client_connections Open client connections on the front door.",
        "# TYPE hubproxy_client_connections gauge",
        f"hubproxy_client_connections {m['client_connections']}",
        "# HELP hubproxy_client_connections_refused_total Connections refused (limit, "
        "shutdown).",
        "# TYPE hubproxy_client_connections_refused_total counter",
        f"hubproxy_client_connections_refused_total {m['connections_refused']}",
        "# HELP hubproxy_auth_cache_hits_total Token authentications answered from the "
        "cache (or coalesced).",
        "# TYPE hubproxy_auth_cache_hits_total counter",
        f"hubproxy_auth_cache_hits_total {max(0, m['auth_lookups'] - reviews)}",
        "# HELP hubproxy_auth_cache_misses_total TokenReviews sent to the hub.",
        "# TYPE hubproxy_auth_cache_misses_total counter",
        f"hubproxy_auth_cache_misses_total {reviews}",
        "# HELP hubproxy_bytes_total Bytes relayed, by direction.",
        "# TYPE hubproxy_bytes_total counter",
        f'hubproxy_bytes_total{{direction="in"}} {m["bytes_in"]}',
        f'hubproxy_bytes_total{{direction="out"}} {m["bytes_out"]}',
        *_render_certificates(m),
    ]
    return ("\n".join(lines) + "\n").encode("ascii")
