"""Gateway metrics in the Prometheus text format (no client library: a few counters suffice).

Labels are bounded and carry no secrets (DESIGN §6 rule 5): ``cluster`` is a cluster that
connected since start (anything else counts as ``cluster="_other"``, so random paths cannot
grow the label set), ``code`` an HTTP status. No tokens, no paths, and no user names but in
``hubproxy_fair_flow_rejected_total`` (who is being refused by the fair queuing: at most 20
hub users, the rest ``_other``).

Counters are plain integers updated on the event loop (one increment per request, never per
chunk); :func:`render` reads them, plus live gauges from callables, when ``/metrics`` is asked.
With ``--workers`` each worker counts its own; the others send worker 0 a snapshot every second
(``gateway.ops.metricslink``) and worker 0's ``/metrics`` shows the sum.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.ops.k8saudit.backends import DROP_REASONS

OTHER_CLUSTER = "_other"

# Request duration buckets (seconds): short requests live in the first ten; watches and streams
# (whose duration is how long they stayed open) in the last ones.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0, 1800.0, 3600.0)
# Hub TokenReview / SubjectAccessReview call durations.
HUB_CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Histogram:
    """Counts per bucket (not cumulative; the last one is +Inf), their sum and count.

    ``observe`` is one bisect and two additions: no allocation on the request path.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def to_json(self) -> list[float]:
        return [*self.counts, self.total]

    def add_json(self, values: list[float]) -> None:
        """Add a peer's :meth:`to_json` (ignored if its buckets differ: another version)."""
        if len(values) != len(self.counts) + 1:
            return
        for i in range(len(self.counts)):
            self.counts[i] += int(values[i])
        self.total += float(values[-1])

    def lines(self, name: str, labels: str) -> list[str]:
        out, cumulative = [], 0
        sep = "," if labels else ""
        for bound, count in zip(self.bounds, self.counts, strict=False):
            cumulative += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {cumulative}')
        cumulative += self.counts[-1]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {cumulative}')
        braces = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{braces} {self.total:.6f}")
        out.append(f"{name}_count{braces} {cumulative}")
        return out


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
    # Requests by the protocol the client spoke at the front door (ALPN h2 or HTTP/1.1).
    requests_h1: int = 0
    requests_h2: int = 0
    h2_connections_total: int = 0  # front-door connections that negotiated h2
    # HTTP/2 streams per h2 connection, summed and counted as each connection ends.
    h2_streams_sum: int = 0
    h2_streams_count: int = 0
    h2_protocol_errors: int = 0  # h2 connections ended by a protocol error (GOAWAY)
    h2_calmed: int = 0  # h2 connections ended for abuse (ENHANCE_YOUR_CALM)
    # Front-door connections refused before TLS by --proxy-protocol-from, by reason
    # (gateway.hub.proxyaccept.REFUSAL_REASONS).
    proxy_protocol_refused: Counter[str] = field(default_factory=Counter)
    # Live values read at scrape time.
    connected_agents: Callable[[], int] = lambda: 0
    cluster_names: Callable[[], Iterable[str]] = lambda: ()
    client_connections: Callable[[], int] = lambda: 0
    # Of those, the HTTP/2 ones, and the streams (requests) open on them now.
    h2_client_connections: Callable[[], int] = lambda: 0
    h2_open_streams: Callable[[], int] = lambda: 0
    auth_reviews: Callable[[], int] = lambda: 0  # TokenReviews sent = cache misses
    auth_lookups: int = 0  # authentications asked for
    # Hub reviews that failed and were answered with what the hub confirmed before
    # (--hub-outage-grace), authentication and authorization together.
    hub_outage_answers: Callable[[], int] = lambda: 0
    # Agent connections refused before a session (tunnel.listener), by reason.
    handshake_failures: Callable[[], Mapping[str, int]] = lambda: {}
    # Agent connections that completed TLS but were refused (not TLS 1.3, wrong ALPN, no
    # cluster in the certificate); handshake_failures counts every refusal by reason.
    tunnel_refused: Callable[[], int] = lambda: 0
    # With --workers: the latest snapshots of the other workers (worker 0 serves /metrics).
    peers: Callable[[], Iterable[dict[str, Any]]] = lambda: ()
    # Request durations by (cluster, class: short/watch/stream).
    latency: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    # Hub calls (tokenreview, subjectaccessreview): durations, and outcomes (ok, error).
    hub_latency: dict[str, Histogram] = field(default_factory=dict)
    hub_calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    authz_lookups: int = 0  # authorizations asked for (cache hits = lookups - SARs sent)
    # Certificate expiry (epoch seconds) by which certificate; read at scrape time.
    certificates: Callable[[], dict[str, float]] = dict
    # The fleet (gateway.hub.fleet): this worker's part, and how to render the merged parts.
    fleet: Callable[[], dict[str, Any]] = dict
    fleet_lines: Callable[[list[dict[str, Any]]], list[str]] = lambda parts: []
    agent_certificates: Callable[[list[dict[str, Any]]], dict[str, float]] = lambda parts: {}
    # Fair queuing of short requests (gateway.hub.admission.seats.Seats.snapshot); {}: off.
    fairness: Callable[[], dict[str, Any]] = dict
    # Kubernetes-format audit (gateway.hub.audittrail): events per backend, and the events
    # lost as "backend/reason"; {} when off.
    audit_events: Callable[[], dict[str, int]] = dict
    audit_dropped: Callable[[], dict[str, int]] = dict

    def proxy_refused(self, reason: str) -> None:
        self.proxy_protocol_refused[reason] += 1

    def stream_opened(self) -> None:
        self.active_streams += 1
        self.streams_total += 1

    def stream_closed(self) -> None:
        self.active_streams -= 1

    def h2_streams_per_connection(self, streams: int) -> None:
        self.h2_streams_sum += streams
        self.h2_streams_count += 1

    def request(self, cluster: str, code: int, bytes_in: int, bytes_out: int,
                duration: float | None = None, kind: str = "short") -> None:
        self.requests[(cluster, code)] += 1
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        if duration is not None:
            key = (cluster, kind)
            histogram = self.latency.get(key)
            if histogram is None:
                histogram = self.latency[key] = Histogram(REQUEST_BUCKETS)
            histogram.observe(duration)

    def hub_call(self, call: str, seconds: float, ok: bool) -> None:
        """One TokenReview/SubjectAccessReview sent to the hub (``ok``: it answered)."""
        histogram = self.hub_latency.get(call)
        if histogram is None:
            histogram = self.hub_latency[call] = Histogram(HUB_CALL_BUCKETS)
        histogram.observe(seconds)
        self.hub_calls[(call, "ok" if ok else "error")] += 1

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
            "requests_h1": self.requests_h1,
            "requests_h2": self.requests_h2,
            "h2_connections_total": self.h2_connections_total,
            "h2_streams_sum": self.h2_streams_sum,
            "h2_streams_count": self.h2_streams_count,
            "h2_protocol_errors": self.h2_protocol_errors,
            "h2_calmed": self.h2_calmed,
            "proxy_protocol_refused": dict(self.proxy_protocol_refused),
            "audit_events": self.audit_events(),
            "audit_dropped": self.audit_dropped(),
            "connected_agents": self.connected_agents(),
            "clusters": sorted(self.cluster_names()),
            "client_connections": self.client_connections(),
            "h2_client_connections": self.h2_client_connections(),
            "h2_open_streams": self.h2_open_streams(),
            "auth_reviews": self.auth_reviews(),
            "auth_lookups": self.auth_lookups,
            "hub_outage_answers": self.hub_outage_answers(),
            "handshake_failures": dict(self.handshake_failures()),
            "authz_lookups": self.authz_lookups,
            "tunnel_refused": self.tunnel_refused(),
            "latency": [[cluster, kind, h.to_json()]
                        for (cluster, kind), h in self.latency.items()],
            "hub_latency": [[call, h.to_json()] for call, h in self.hub_latency.items()],
            "hub_calls": [[call, outcome, count]
                          for (call, outcome), count in self.hub_calls.items()],
            "fleet": self.fleet(),
            "fairness": self.fairness(),
        }

    def render(self) -> bytes:
        """Prometheus text: this process's figures plus the latest ones of its peer workers."""
        merged = merge([self.snapshot(), *self.peers()])
        parts = merged["fleet_parts"]
        extra = [*self.fleet_lines(parts),
                 *certificate_lines(self.certificates(), self.agent_certificates(parts))]
        text = render(merged)
        return text + ("\n".join(extra) + "\n").encode("ascii") if extra else text


SUMMED = ("bytes_in", "bytes_out", "active_streams", "streams_total", "connections_refused",
          "connected_agents", "client_connections", "auth_reviews", "auth_lookups",
          "authz_lookups", "tunnel_refused", "requests_h1", "requests_h2", "h2_connections_total",
          "h2_streams_sum", "h2_streams_count", "h2_protocol_errors", "h2_calmed",
          "h2_client_connections", "h2_open_streams", "hub_outage_answers")


def merge(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One gateway's figures from its workers': counts add up; a cluster counts once however
    many workers hold a session from it. Fields a snapshot lacks count as zero."""
    total: dict[str, Any] = dict.fromkeys(SUMMED, 0)
    requests: Counter[tuple[str, int]] = Counter()
    clusters: set[str] = set()
    snapshots_seen = list(snapshots)
    latency: dict[tuple[str, str], Histogram] = {}
    hub_latency: dict[str, Histogram] = {}
    hub_calls: Counter[tuple[str, str]] = Counter()
    fleet_parts: list[dict[str, Any]] = []
    proxy_refused: Counter[str] = Counter()
    audit_events: Counter[str] = Counter()
    audit_dropped: Counter[str] = Counter()
    for snap in snapshots_seen:
        for key in SUMMED:
            value = snap.get(key, 0)
            if isinstance(value, int):
                total[key] += value
        for cluster, code, count in snap.get("requests", ()):
            requests[(str(cluster), int(code))] += int(count)
        clusters.update(str(c) for c in snap.get("clusters", ()))
        for cluster, kind, values in snap.get("latency", ()):
            latency_key = (str(cluster), str(kind))
            if latency_key not in latency:
                latency[latency_key] = Histogram(REQUEST_BUCKETS)
            latency[latency_key].add_json(values)
        for call, values in snap.get("hub_latency", ()):
            if call not in hub_latency:
                hub_latency[call] = Histogram(HUB_CALL_BUCKETS)
            hub_latency[call].add_json(values)
        for call, outcome, count in snap.get("hub_calls", ()):
            hub_calls[(str(call), str(outcome))] += int(count)
        fleet_parts.append(snap.get("fleet") or {})
        for reason, count in (snap.get("proxy_protocol_refused") or {}).items():
            proxy_refused[str(reason)] += int(count)
        for backend, count in (snap.get("audit_events") or {}).items():
            audit_events[str(backend)] += int(count)
        for key, count in (snap.get("audit_dropped") or {}).items():
            audit_dropped[str(key)] += int(count)
    total["requests"] = requests
    total["connected_clusters"] = len(clusters)
    total.update(_merge_certificates(snapshots_seen))
    total["latency"] = latency
    total["hub_latency"] = hub_latency
    total["hub_calls"] = hub_calls
    total["fleet_parts"] = fleet_parts
    total["proxy_protocol_refused"] = proxy_refused
    total["audit_events"] = audit_events
    total["audit_dropped"] = audit_dropped
    total["fairness"] = _merge_fairness(snap.get("fairness") or {} for snap in snapshots_seen)
    return total


def _merge_fairness(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Workers' fair-queuing figures, added up (each worker has its own seats)."""
    total: dict[str, Any] = {"limit": 0, "executing": 0, "waiting": 0, "queued_total": 0,
                             "refused": Counter(), "refused_flows": Counter(), "waits": None}
    seen = False
    for part in parts:
        if not part:
            continue
        seen = True
        for key in ("limit", "executing", "waiting", "queued_total"):
            total[key] += int(part.get(key, 0))
        total["refused"].update({str(k): int(v) for k, v in part.get("refused", {}).items()})
        total["refused_flows"].update(
            {str(k): int(v) for k, v in part.get("refused_flows", {}).items()})
        waits = part.get("waits")
        if waits is not None:
            if total["waits"] is None:
                total["waits"] = [0.0] * len(waits)
            if len(waits) == len(total["waits"]):
                total["waits"] = [a + b for a, b in zip(total["waits"], waits, strict=True)]
    return total if seen else {}


FAIR_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0)


def _fairness_lines(m: dict[str, Any]) -> list[str]:
    fair = m.get("fairness") or {}
    if not fair:
        return []
    lines = [
        "# HELP hubproxy_fair_seats Seats for short requests (--max-executing-requests).",
        "# TYPE hubproxy_fair_seats gauge",
        f"hubproxy_fair_seats {fair['limit']}",
        "# HELP hubproxy_fair_seats_in_use Short requests executing now.",
        "# TYPE hubproxy_fair_seats_in_use gauge",
        f"hubproxy_fair_seats_in_use {fair['executing']}",
        "# HELP hubproxy_fair_requests_waiting Short requests waiting in the fair queues now.",
        "# TYPE hubproxy_fair_requests_waiting gauge",
        f"hubproxy_fair_requests_waiting {fair['waiting']}",
        "# HELP hubproxy_fair_requests_queued_total Short requests that had to wait for a seat.",
        "# TYPE hubproxy_fair_requests_queued_total counter",
        f"hubproxy_fair_requests_queued_total {fair['queued_total']}",
        "# HELP hubproxy_fair_rejected_total Short requests refused with 429 by the fair "
        "queuing, by reason (queue_full, timeout).",
        "# TYPE hubproxy_fair_rejected_total counter",
    ]
    for reason in ("queue_full", "timeout"):
        lines.append(f'hubproxy_fair_rejected_total{{reason="{reason}"}} '
                     f'{fair["refused"].get(reason, 0)}')
    lines += [
        "# HELP hubproxy_fair_flow_rejected_total Short requests refused with 429 by the fair "
        "queuing, by flow (user:<hub user>; the first 20 flows refused, the rest _other).",
        "# TYPE hubproxy_fair_flow_rejected_total counter",
    ]
    for flow, count in sorted(fair["refused_flows"].items()):
        lines.append(f'hubproxy_fair_flow_rejected_total{{flow="{_escape(flow)}"}} {count}')
    waits = fair.get("waits")
    if waits is not None and len(waits) == len(FAIR_WAIT_BUCKETS) + 2:
        histogram = Histogram(FAIR_WAIT_BUCKETS)
        histogram.add_json(waits)
        lines += [
            "# HELP hubproxy_fair_queue_wait_seconds How long short requests that queued "
            "waited for their seat.",
            "# TYPE hubproxy_fair_queue_wait_seconds histogram",
            *histogram.lines("hubproxy_fair_queue_wait_seconds", ""),
        ]
    return lines


def _merge_certificates(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Handshake failures add up across workers."""
    failures: Counter[str] = Counter()
    for snap in snapshots:
        for reason, count in snap.get("handshake_failures", {}).items():
            failures[str(reason)] += int(count)
    return {"handshake_failures": failures}


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
        "# HELP hubproxy_requests_by_protocol_total Front-door requests by the protocol the "
        "client spoke (h1: HTTP/1.1, h2: HTTP/2).",
        "# TYPE hubproxy_requests_by_protocol_total counter",
        f'hubproxy_requests_by_protocol_total{{protocol="h1"}} {m["requests_h1"]}',
        f'hubproxy_requests_by_protocol_total{{protocol="h2"}} {m["requests_h2"]}',
        "# HELP hubproxy_h2_client_connections Open front-door connections speaking HTTP/2.",
        "# TYPE hubproxy_h2_client_connections gauge",
        f"hubproxy_h2_client_connections {m['h2_client_connections']}",
        "# HELP hubproxy_h2_open_streams Requests open as streams of HTTP/2 connections now.",
        "# TYPE hubproxy_h2_open_streams gauge",
        f"hubproxy_h2_open_streams {m['h2_open_streams']}",
        "# HELP hubproxy_h2_connections_total Front-door connections that negotiated HTTP/2.",
        "# TYPE hubproxy_h2_connections_total counter",
        f"hubproxy_h2_connections_total {m['h2_connections_total']}",
        "# HELP hubproxy_h2_streams_per_connection Streams each ended HTTP/2 connection "
        "carried.",
        "# TYPE hubproxy_h2_streams_per_connection summary",
        f"hubproxy_h2_streams_per_connection_sum {m['h2_streams_sum']}",
        f"hubproxy_h2_streams_per_connection_count {m['h2_streams_count']}",
        "# HELP hubproxy_h2_connection_errors_total HTTP/2 connections ended by the gateway, "
        "by reason (protocol: a protocol error; calm: a flood or rapid reset, "
        "ENHANCE_YOUR_CALM).",
        "# TYPE hubproxy_h2_connection_errors_total counter",
        f'hubproxy_h2_connection_errors_total{{reason="protocol"}} {m["h2_protocol_errors"]}',
        f'hubproxy_h2_connection_errors_total{{reason="calm"}} {m["h2_calmed"]}',
        "# HELP hubproxy_client_connections_refused_total Connections refused (limit, "
        "shutdown).",
        "# TYPE hubproxy_client_connections_refused_total counter",
        f"hubproxy_client_connections_refused_total {m['connections_refused']}",
        *_proxy_protocol_lines(m),
        "# HELP hubproxy_auth_cache_hits_total Token authentications answered from the "
        "cache (or coalesced).",
        "# TYPE hubproxy_auth_cache_hits_total counter",
        f"hubproxy_auth_cache_hits_total {max(0, m['auth_lookups'] - reviews)}",
        "# HELP hubproxy_hub_outage_answers_total Hub reviews that failed (hub down, slow or "
        "saturated) and were answered with what the hub confirmed earlier "
        "(--hub-outage-grace).",
        "# TYPE hubproxy_hub_outage_answers_total counter",
        f"hubproxy_hub_outage_answers_total {m.get('hub_outage_answers', 0)}",
        "# HELP hubproxy_auth_cache_misses_total TokenReviews sent to the hub.",
        "# TYPE hubproxy_auth_cache_misses_total counter",
        f"hubproxy_auth_cache_misses_total {reviews}",
        "# HELP hubproxy_bytes_total Bytes relayed, by direction.",
        "# TYPE hubproxy_bytes_total counter",
        f'hubproxy_bytes_total{{direction="in"}} {m["bytes_in"]}',
        f'hubproxy_bytes_total{{direction="out"}} {m["bytes_out"]}',
        *_render_certificates(m),
        "# HELP hubproxy_tunnel_refused_total Agent connections refused after TLS (not TLS "
        "1.3, wrong ALPN, no cluster in the certificate); by reason in "
        "hubproxy_tunnel_handshake_failures_total.",
        "# TYPE hubproxy_tunnel_refused_total counter",
        f"hubproxy_tunnel_refused_total {m['tunnel_refused']}",
    ]
    lines += _latency_lines(m)
    lines += _fairness_lines(m)
    lines += _audit_lines(m)
    return ("\n".join(lines) + "\n").encode("ascii")


def _proxy_protocol_lines(m: dict[str, Any]) -> list[str]:
    refused = m.get("proxy_protocol_refused") or {}
    if not refused:
        return []  # --proxy-protocol-from off, or nothing refused yet
    lines = [
        "# HELP hubproxy_proxy_protocol_refused_total Front-door connections closed before TLS "
        "by --proxy-protocol-from, by reason (missing, malformed, oversized: from a trusted "
        "balancer without a valid PROXY header; untrusted: a header from another address; "
        "timeout; closed; busy).",
        "# TYPE hubproxy_proxy_protocol_refused_total counter",
    ]
    for reason, count in sorted(refused.items()):
        lines.append(f'hubproxy_proxy_protocol_refused_total{{reason="{_escape(reason)}"}} '
                     f'{count}')
    return lines


def _audit_lines(m: dict[str, Any]) -> list[str]:
    events = m.get("audit_events") or {}
    if not events:
        return []  # Kubernetes-format audit off
    lines = [
        "# HELP hubproxy_audit_events_total Kubernetes-format audit events written (log) or "
        "delivered (webhook), by backend.",
        "# TYPE hubproxy_audit_events_total counter",
        *(f'hubproxy_audit_events_total{{backend="{_escape(b)}"}} {n}'
          for b, n in sorted(events.items())),
        "# HELP hubproxy_audit_events_dropped_total Kubernetes-format audit events lost, by "
        "backend and reason (buffer_full: the webhook was too slow or down for the buffer; "
        "send_failed: every attempt failed; rejected: the webhook answered 4xx; shutdown; "
        "write_failed: the log could not be written).",
        "# TYPE hubproxy_audit_events_dropped_total counter",
    ]
    dropped = m.get("audit_dropped") or {}
    for backend in sorted(events):
        for reason in DROP_REASONS.get(backend, ()):
            lines.append(f'hubproxy_audit_events_dropped_total{{backend="{_escape(backend)}",'
                         f'reason="{reason}"}} {dropped.get(f"{backend}/{reason}", 0)}')
    return lines


def _latency_lines(m: dict[str, Any]) -> list[str]:
    lines = [
        "# HELP hubproxy_request_duration_seconds Requests by cluster and class: short (its "
        "whole exchange), watch and stream (how long they stayed open).",
        "# TYPE hubproxy_request_duration_seconds histogram",
    ]
    for (cluster, kind), histogram in sorted(m.get("latency", {}).items()):
        lines += histogram.lines("hubproxy_request_duration_seconds",
                                 f'cluster="{_escape(cluster)}",class="{_escape(kind)}"')
    lines += [
        "# HELP hubproxy_hub_request_duration_seconds TokenReviews and SubjectAccessReviews "
        "sent to the hub (cache misses), by call.",
        "# TYPE hubproxy_hub_request_duration_seconds histogram",
    ]
    for call, histogram in sorted(m.get("hub_latency", {}).items()):
        lines += histogram.lines("hubproxy_hub_request_duration_seconds",
                                 f'call="{_escape(call)}"')
    lines += [
        "# HELP hubproxy_hub_requests_total Hub calls by outcome: ok (the hub answered, yes or "
        "no) or error (unreachable, timeout, refused the gateway's credential).",
        "# TYPE hubproxy_hub_requests_total counter",
    ]
    for (call, outcome), count in sorted(m.get("hub_calls", {}).items()):
        lines.append(f'hubproxy_hub_requests_total{{call="{_escape(call)}",'
                     f'outcome="{_escape(outcome)}"}} {count}')
    sars = sum(count for (call, _), count in m.get("hub_calls", {}).items()
               if call == "subjectaccessreview")
    lines += [
        "# HELP hubproxy_authz_cache_hits_total Authorizations answered from the cache (or "
        "coalesced).",
        "# TYPE hubproxy_authz_cache_hits_total counter",
        f"hubproxy_authz_cache_hits_total {max(0, m.get('authz_lookups', 0) - sars)}",
        "# HELP hubproxy_authz_cache_misses_total SubjectAccessReviews sent to the hub.",
        "# TYPE hubproxy_authz_cache_misses_total counter",
        f"hubproxy_authz_cache_misses_total {sars}",
    ]
    return lines


def certificate_lines(own: dict[str, float], agents: dict[str, float]) -> list[str]:
    """``hubproxy_certificate_expiry_timestamp_seconds``: ``{certificate="serving"}`` and
    ``"tunnel"`` (``own``), and ``{certificate="agent",cluster=...}`` for each connected cluster
    (the earliest of its sessions' client certificates), in one metric family."""
    if not own and not agents:
        return []
    lines = [
        "# HELP hubproxy_certificate_expiry_timestamp_seconds When a certificate expires (Unix "
        "time): serving, tunnel, and each agent's client certificate (earliest per cluster).",
        "# TYPE hubproxy_certificate_expiry_timestamp_seconds gauge",
    ]
    for name, when in sorted(own.items()):
        lines.append(f'hubproxy_certificate_expiry_timestamp_seconds{{certificate='
                     f'"{_escape(name)}"}} {when:.0f}')
    for cluster, when in sorted(agents.items()):
        lines.append(f'hubproxy_certificate_expiry_timestamp_seconds{{certificate="agent",'
                     f'cluster="{_escape(cluster)}"}} {when:.0f}')
    return lines
