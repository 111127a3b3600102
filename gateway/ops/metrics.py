"""Gateway metrics in the Prometheus text format (no client library: a few counters suffice).

Labels are bounded and carry no secrets (DESIGN §6 rule 5): ``cluster`` is a cluster that
connected since start (anything else counts as ``cluster="_other"``, so random paths cannot
grow the label set), ``code`` an HTTP status (per cluster, its class). No tokens, no paths, and
no user names but in ``hubproxy_fair_flow_rejected_total`` (who is being refused by the fair
queuing: at most 20 hub users, the rest ``_other``).

**Series per cluster** are what a fleet multiplies (DESIGN §6 rule 8). By default a cluster adds
at most :data:`BASIC_SERIES_PER_CLUSTER` series, counters and gauges only: requests by status
class (``1xx``..``5xx``, those seen), its tunnel sessions, RTT, open streams, streams opened,
bytes each way, and its agents' version (one more while its agents run two versions). Latency
histograms are kept for the whole gateway by request class; ``--cluster-metrics detailed``
adds them per cluster (``hubproxy_cluster_request_duration_seconds``, 19 series per cluster and
class) and each cluster's agent certificate expiry. Agent certificates are otherwise summarized:
the earliest expiry and how many clusters' certificates expire within 7 and 30 days.

**Rendering never holds the event loop**: :meth:`GatewayMetrics.render_chunks` is a generator
that does a bounded amount of work per step (:data:`CHUNK` clusters), and the health port runs
the loop between steps. Counters are plain integers updated on the event loop (one increment
per request, never per chunk).

**Workers.** With ``--workers`` each worker counts its own; the others send worker 0 what
changed (``gateway.ops.metricslink``) and worker 0's ``/metrics`` shows the sum. What a worker
sends is a *part*: ``{"scalars": {...}, "requests": {cluster: [by class]},
"cluster_latency": {cluster: {class: histogram}}, "fleet": {cluster: entry}}``, the same shape
this process renders its own figures from (:meth:`GatewayMetrics.part`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gateway.ops.k8saudit.backends import DROP_REASONS

OTHER_CLUSTER = "_other"

# Request duration buckets (seconds): short requests live in the first ten; watches and streams
# (whose duration is how long they stayed open) in the last ones.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0, 1800.0, 3600.0)
# Hub TokenReview / SubjectAccessReview call durations.
HUB_CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# Per cluster, the status of a request is counted by class: five series at most, whatever codes
# the managed apiservers answer. Exact codes are counted for the whole gateway.
CODE_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
# Tunnel series per cluster: sessions, RTT, open streams, streams opened, bytes (2), agent info.
TUNNEL_SERIES_PER_CLUSTER = 7
BASIC_SERIES_PER_CLUSTER = len(CODE_CLASSES) + TUNNEL_SERIES_PER_CLUSTER

# Clusters handled per step of a render (between two turns of the event loop): 1-3 ms.
CHUNK = 128
DAY = 86400.0
EXPIRY_WINDOWS = ((7, 7 * DAY), (30, 30 * DAY))  # days, seconds: agent certificates expiring


def code_class(code: int) -> int:
    """Index into :data:`CODE_CLASSES` of an HTTP status (anything odd counts as 5xx)."""
    return min(max(code // 100 - 1, 0), len(CODE_CLASSES) - 1) if code >= 100 else 4


# code_class of every three-digit status, looked up per request instead of computed.
_CODE_CLASS_OF = tuple(code_class(code) for code in range(1000))


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


class TunnelStats(NamedTuple):
    """One cluster's tunnel, all workers' sessions together (``gateway.hub.fleet`` computes it
    from the fleet entries)."""

    sessions: int
    rtt_seconds: float | None  # the slowest session's
    active_streams: int
    streams_opened: int  # ended sessions included: a counter
    bytes_from_agent: int
    bytes_to_agent: int
    versions: dict[str, int]  # sessions by agent version
    certificate_not_after: float | None  # the earliest agent certificate


def _no_stats(entries: list[dict[str, Any]]) -> TunnelStats:
    return TunnelStats(0, None, 0, 0, 0, 0, {}, None)


class LazyMapping(Mapping[str, Any]):
    """A read-only mapping whose values are computed when read (a live view, never copied)."""

    def __init__(self, keys: Callable[[], Iterable[str]], value: Callable[[str], Any]) -> None:
        self._keys = keys
        self._value = value

    def __getitem__(self, key: str) -> Any:
        found = self._value(key)
        if found is None:
            raise KeyError(key)
        return found

    def get(self, key: str, default: Any = None) -> Any:
        found = self._value(key)
        return default if found is None else found

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys()))

    def __len__(self) -> int:
        return sum(1 for _ in self._keys())


# The per-cluster sections of a part, keyed by cluster name.
CLUSTER_SECTIONS = ("requests", "cluster_latency", "fleet")


@dataclass
class GatewayMetrics:
    # Requests by cluster and status class (CODE_CLASSES), and by exact status for all.
    cluster_requests: dict[str, list[int]] = field(default_factory=dict)
    codes: Counter[int] = field(default_factory=Counter)
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
    # Per-cluster latency histograms and agent certificate expiry (--cluster-metrics detailed).
    cluster_detail: bool = False
    # Live values read at scrape time.
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
    # The tunnel listener's admission (tunnel.listener.TunnelListener.admission): handshakes in
    # flight and begun, agents waiting in the listen queue, refusals before any TLS work.
    tunnel_admission: Callable[[], Mapping[str, int]] = lambda: {}
    # With --workers: the latest parts of the other workers (worker 0 serves /metrics).
    peers: Callable[[], Iterable[dict[str, Any]]] = lambda: ()
    # Request durations by class (short/watch/stream), and by cluster too when detailed.
    latency: dict[str, Histogram] = field(default_factory=dict)
    cluster_latency: dict[str, dict[str, Histogram]] = field(default_factory=dict)
    # Hub calls (tokenreview, subjectaccessreview): durations, and outcomes (ok, error).
    hub_latency: dict[str, Histogram] = field(default_factory=dict)
    hub_calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    authz_lookups: int = 0  # authorizations asked for (cache hits = lookups - SARs sent)
    # Certificate expiry (epoch seconds) by which certificate; read at scrape time.
    certificates: Callable[[], dict[str, float]] = dict
    # The fleet (gateway.hub.fleet): this worker's clusters' entries (a live mapping), and how
    # one cluster's entries (one per worker) become its tunnel figures.
    fleet: Callable[[], Mapping[str, Any]] = dict
    fleet_stats: Callable[[list[dict[str, Any]]], TunnelStats] = _no_stats
    # Fair queuing of short requests (gateway.hub.admission.seats.Seats.snapshot); {}: off.
    fairness: Callable[[], dict[str, Any]] = dict
    # Writes to the hub (gateway.hub.hubwrites.HubWrites.snapshot); {}: none.
    hub_writes: Callable[[], dict[str, Any]] = dict
    # Kubernetes-format audit (gateway.hub.audittrail): events per backend, and the events
    # lost as "backend/reason"; {} when off.
    audit_events: Callable[[], dict[str, int]] = dict
    audit_dropped: Callable[[], dict[str, int]] = dict
    # Clusters whose figures changed since the link last asked (None: nobody asks).
    changed: set[str] | None = None

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

    def mark_changed(self, cluster: str) -> None:
        if self.changed is not None:
            self.changed.add(cluster)

    def take_changed(self) -> set[str]:
        """The clusters marked changed since the last call (the first call starts tracking)."""
        taken = self.changed if self.changed is not None else set()
        self.changed = set()
        return taken

    def request(self, cluster: str, code: int, bytes_in: int, bytes_out: int,
                duration: float | None = None, kind: str = "short") -> None:
        counts = self.cluster_requests.get(cluster)
        if counts is None:
            counts = self.cluster_requests[cluster] = [0] * len(CODE_CLASSES)
        counts[_CODE_CLASS_OF[code] if 0 <= code < 1000 else code_class(code)] += 1
        self.codes[code] += 1
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        if duration is not None:
            histogram = self.latency.get(kind)
            if histogram is None:
                histogram = self.latency[kind] = Histogram(REQUEST_BUCKETS)
            histogram.observe(duration)
            if self.cluster_detail:
                by_class = self.cluster_latency.setdefault(cluster, {})
                histogram = by_class.get(kind)
                if histogram is None:
                    histogram = by_class[kind] = Histogram(REQUEST_BUCKETS)
                histogram.observe(duration)
        if self.changed is not None:
            self.changed.add(cluster)

    def hub_call(self, call: str, seconds: float, ok: bool) -> None:
        """One TokenReview/SubjectAccessReview sent to the hub (``ok``: it answered)."""
        histogram = self.hub_latency.get(call)
        if histogram is None:
            histogram = self.hub_latency[call] = Histogram(HUB_CALL_BUCKETS)
        histogram.observe(seconds)
        self.hub_calls[(call, "ok" if ok else "error")] += 1

    def scalars(self) -> dict[str, Any]:
        """This process's figures that do not grow with the fleet, as plain JSON values."""
        return {
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
            "client_connections": self.client_connections(),
            "h2_client_connections": self.h2_client_connections(),
            "h2_open_streams": self.h2_open_streams(),
            "auth_reviews": self.auth_reviews(),
            "auth_lookups": self.auth_lookups,
            "hub_outage_answers": self.hub_outage_answers(),
            "handshake_failures": dict(self.handshake_failures()),
            "authz_lookups": self.authz_lookups,
            "tunnel_refused": self.tunnel_refused(),
            "codes": {str(code): count for code, count in self.codes.items()},
            "latency": {kind: h.to_json() for kind, h in self.latency.items()},
            "hub_latency": {call: h.to_json() for call, h in self.hub_latency.items()},
            "tunnel_admission": dict(self.tunnel_admission()),
            "hub_calls": [[call, outcome, count]
                          for (call, outcome), count in self.hub_calls.items()],
            "fairness": self.fairness(),
            "hub_writes": self.hub_writes(),
        }

    def part(self) -> dict[str, Any]:
        """This process's figures in the shape workers send (see the module docstring): the
        per-cluster sections are live mappings, read as they are rendered or sent."""
        latency, requests = self.cluster_latency, self.cluster_requests
        return {
            "scalars": self.scalars(),
            # Copies: the link keeps what it sent to compare with what comes next.
            "requests": LazyMapping(lambda: requests.keys(),
                                    lambda c: list(requests[c]) if c in requests else None),
            "cluster_latency": LazyMapping(
                lambda: latency.keys(),
                lambda c: ({kind: h.to_json() for kind, h in latency[c].items()}
                           if c in latency else None)),
            "fleet": self.fleet(),
        }

    def snapshot(self) -> dict[str, Any]:
        """:meth:`part` copied into plain JSON values (for tests and tools; O(clusters))."""
        part = self.part()
        return {name: (dict(section.items()) if name in CLUSTER_SECTIONS else section)
                for name, section in part.items()}

    def render_chunks(self) -> Iterator[bytes]:
        """Prometheus text of this process and its peer workers, a bounded step at a time."""
        parts = [self.part(), *self.peers()]
        own = self.certificates()
        return render_parts(parts, own, self.fleet_stats, detail=self.cluster_detail)

    def render(self) -> bytes:
        """The whole text at once (tests, small fleets)."""
        return b"".join(self.render_chunks())


# Scalars that are counts by one label value, added up label by label.
COUNTED_BY_LABEL = ("proxy_protocol_refused", "audit_events", "audit_dropped")
SUMMED = ("bytes_in", "bytes_out", "active_streams", "streams_total", "connections_refused",
          "client_connections", "auth_reviews", "auth_lookups",
          "authz_lookups", "tunnel_refused", "requests_h1", "requests_h2", "h2_connections_total",
          "h2_streams_sum", "h2_streams_count", "h2_protocol_errors", "h2_calmed",
          "h2_client_connections", "h2_open_streams", "hub_outage_answers")


def merge_scalars(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One gateway's bounded figures from its workers': counts add up. Fields a worker's
    scalars lack count as zero (a field it does not know is ignored)."""
    total: dict[str, Any] = dict.fromkeys(SUMMED, 0)
    codes: Counter[int] = Counter()
    failures: Counter[str] = Counter()
    admission: Counter[str] = Counter()
    latency: dict[str, Histogram] = {}
    hub_latency: dict[str, Histogram] = {}
    hub_calls: Counter[tuple[str, str]] = Counter()
    counted: dict[str, Counter[str]] = {key: Counter() for key in COUNTED_BY_LABEL}
    seen = list(snapshots)
    for snap in seen:
        for key in SUMMED:
            value = snap.get(key, 0)
            if isinstance(value, int):
                total[key] += value
        for code, count in (snap.get("codes") or {}).items():
            codes[int(code)] += int(count)
        for reason, count in (snap.get("handshake_failures") or {}).items():
            failures[str(reason)] += int(count)
        for key, count in (snap.get("tunnel_admission") or {}).items():
            admission[str(key)] += int(count)
        for kind, values in (snap.get("latency") or {}).items():
            latency.setdefault(str(kind), Histogram(REQUEST_BUCKETS)).add_json(values)
        for call, values in (snap.get("hub_latency") or {}).items():
            hub_latency.setdefault(str(call), Histogram(HUB_CALL_BUCKETS)).add_json(values)
        for call, outcome, count in snap.get("hub_calls") or ():
            hub_calls[(str(call), str(outcome))] += int(count)
        for key, counter in counted.items():
            for label, count in (snap.get(key) or {}).items():
                counter[str(label)] += int(count)
    total.update(counted)
    total["codes"] = codes
    total["handshake_failures"] = failures
    total["tunnel_admission"] = admission
    total["latency"] = latency
    total["hub_latency"] = hub_latency
    total["hub_calls"] = hub_calls
    total["fairness"] = _merge_fairness(snap.get("fairness") or {} for snap in seen)
    total["hub_writes"] = _merge_hub_writes(snap.get("hub_writes") or {} for snap in seen)
    return total


def _merge_hub_writes(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Workers' hub writes, added up (each has its own Lease; worker 0 has the writers)."""
    writes: Counter[tuple[str, str]] = Counter()
    reads: Counter[str] = Counter()
    pending: Counter[str] = Counter()
    waited, seen = 0.0, False
    for part in parts:
        if not part:
            continue
        seen = True
        for resource, outcome, count in part.get("writes") or ():
            writes[(str(resource), str(outcome))] += int(count)
        reads.update({str(k): int(v) for k, v in (part.get("reads") or {}).items()})
        pending.update({str(k): int(v) for k, v in (part.get("pending") or {}).items()})
        waited += float(part.get("waited") or 0.0)
    if not seen:
        return {}
    return {"writes": writes, "reads": reads, "pending": pending, "waited": waited}


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


def _hub_write_lines(m: dict[str, Any]) -> list[str]:
    writes = m.get("hub_writes") or {}
    if not writes:
        return []
    lines = [
        "# HELP hubproxy_hub_writes_pending Hub objects waiting for their writer (coalesced: "
        "one per object however many events), by resource.",
        "# TYPE hubproxy_hub_writes_pending gauge",
    ]
    for resource, count in sorted(writes["pending"].items()):
        lines.append(f'hubproxy_hub_writes_pending{{resource="{_escape(resource)}"}} {count}')
    lines += [
        "# HELP hubproxy_hub_writes_total Writes sent to the hub by the gateway's writers, by "
        "resource and outcome (ok, conflict, not_found, forbidden, error).",
        "# TYPE hubproxy_hub_writes_total counter",
    ]
    for (resource, outcome), count in sorted(writes["writes"].items()):
        lines.append(f'hubproxy_hub_writes_total{{resource="{_escape(resource)}",'
                     f'outcome="{_escape(outcome)}"}} {count}')
    lines += [
        "# HELP hubproxy_hub_writer_reads_total Reads the writers sent to prepare writes (list "
        "pages, a GET before a patch), by resource; they share the write rate.",
        "# TYPE hubproxy_hub_writer_reads_total counter",
    ]
    for resource, count in sorted(writes["reads"].items()):
        lines.append(f'hubproxy_hub_writer_reads_total{{resource="{_escape(resource)}"}} '
                     f"{count}")
    lines += [
        "# HELP hubproxy_hub_write_rate_wait_seconds_total Time writers waited for the hub "
        "write rate (--hub-write-qps, --hub-write-burst).",
        "# TYPE hubproxy_hub_write_rate_wait_seconds_total counter",
        f"hubproxy_hub_write_rate_wait_seconds_total {writes['waited']:.6f}",
    ]
    return lines


def _admission_lines(admission: Mapping[str, int]) -> list[str]:
    """The tunnel listener's admission (tunnel.admission): storms of agents made visible."""
    if not admission:
        return []
    lines = [
        "# HELP hubproxy_tunnel_handshakes_in_flight Agent TLS handshakes running now "
        "(at most --tunnel-max-handshakes).",
        "# TYPE hubproxy_tunnel_handshakes_in_flight gauge",
        f"hubproxy_tunnel_handshakes_in_flight {admission.get('handshakes_in_flight', 0)}",
        "# HELP hubproxy_tunnel_handshakes_total Agent TLS handshakes begun.",
        "# TYPE hubproxy_tunnel_handshakes_total counter",
        f"hubproxy_tunnel_handshakes_total {admission.get('handshakes_started', 0)}",
        "# HELP hubproxy_tunnel_accept_queue Agent connections waiting in the tunnel port's "
        "listen queue (--tunnel-backlog).",
        "# TYPE hubproxy_tunnel_accept_queue gauge",
        f"hubproxy_tunnel_accept_queue {admission.get('accept_queue', 0)}",
        "# HELP hubproxy_tunnel_refused_early_total Agent connections refused before any TLS "
        "work, by reason (stale: waited so long in the listen queue that the agent would give "
        "up, told the hub is busy; gone: the agent had already closed it).",
        "# TYPE hubproxy_tunnel_refused_early_total counter",
    ]
    for key, count in sorted(admission.items()):
        if key.startswith("refused_"):
            reason = _escape(key[len("refused_"):])
            lines.append(f'hubproxy_tunnel_refused_early_total{{reason="{reason}"}} {count}')
    return lines


def _scalar_lines(m: dict[str, Any]) -> list[str]:
    reviews = m["auth_reviews"]
    lines = [
        "# HELP hubproxy_requests_by_code_total Requests answered, by HTTP status (all "
        "clusters; per cluster see hubproxy_requests_total).",
        "# TYPE hubproxy_requests_by_code_total counter",
    ]
    for code, count in sorted(m["codes"].items()):
        lines.append(f'hubproxy_requests_by_code_total{{code="{code}"}} {count}')
    lines += [
        "# HELP hubproxy_active_streams Tunnel streams currently carrying a request.",
        "# TYPE hubproxy_active_streams gauge",
        f"hubproxy_active_streams {m['active_streams']}",
        "# HELP hubproxy_streams_total Tunnel streams opened.",
        "# TYPE hubproxy_streams_total counter",
        f"hubproxy_streams_total {m['streams_total']}",
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
        "# HELP hubproxy_tunnel_handshake_failures_total Agent connections refused before a "
        "session, by reason (expired, not_yet_valid, unknown_ca, wrong_name, no_certificate, "
        "bad_certificate, protocol, timeout, aborted).",
        "# TYPE hubproxy_tunnel_handshake_failures_total counter",
    ]
    for reason, count in sorted(m["handshake_failures"].items()):
        lines.append(
            f'hubproxy_tunnel_handshake_failures_total{{reason="{_escape(reason)}"}} {count}')
    lines += [
        "# HELP hubproxy_tunnel_refused_total Agent connections refused after TLS (not TLS "
        "1.3, wrong ALPN, no cluster in the certificate); by reason in "
        "hubproxy_tunnel_handshake_failures_total.",
        "# TYPE hubproxy_tunnel_refused_total counter",
        f"hubproxy_tunnel_refused_total {m['tunnel_refused']}",
        *_admission_lines(m.get("tunnel_admission") or {}),
        "# HELP hubproxy_request_duration_seconds Requests by class: short (its whole "
        "exchange), watch and stream (how long they stayed open); per cluster with "
        "--cluster-metrics detailed (hubproxy_cluster_request_duration_seconds).",
        "# TYPE hubproxy_request_duration_seconds histogram",
    ]
    for kind, histogram in sorted(m["latency"].items()):
        lines += histogram.lines("hubproxy_request_duration_seconds",
                                 f'class="{_escape(kind)}"')
    lines += [
        "# HELP hubproxy_hub_request_duration_seconds TokenReviews and SubjectAccessReviews "
        "sent to the hub (cache misses), by call.",
        "# TYPE hubproxy_hub_request_duration_seconds histogram",
    ]
    for call, histogram in sorted(m["hub_latency"].items()):
        lines += histogram.lines("hubproxy_hub_request_duration_seconds",
                                 f'call="{_escape(call)}"')
    lines += [
        "# HELP hubproxy_hub_requests_total Hub calls by outcome: ok (the hub answered, yes or "
        "no) or error (unreachable, timeout, refused the gateway's credential).",
        "# TYPE hubproxy_hub_requests_total counter",
    ]
    for (call, outcome), count in sorted(m["hub_calls"].items()):
        lines.append(f'hubproxy_hub_requests_total{{call="{_escape(call)}",'
                     f'outcome="{_escape(outcome)}"}} {count}')
    sars = sum(count for (call, _), count in m["hub_calls"].items()
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
    lines += _fairness_lines(m)
    lines += _audit_lines(m)
    lines += _hub_write_lines(m)
    return lines


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


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("ascii") if lines else b""


def _chunks(names: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(names), CHUNK):
        yield names[start:start + CHUNK]


def _union(mappings: Iterable[Mapping[str, Any]]) -> list[str]:
    names: set[str] = set()
    for mapping in mappings:
        names.update(mapping)
    return sorted(names)


def render_parts(parts: list[dict[str, Any]], own_certificates: dict[str, float],
                 fleet_stats: Callable[[list[dict[str, Any]]], TunnelStats], *,
                 detail: bool = False, now: float | None = None) -> Iterator[bytes]:
    """The Prometheus text of a gateway's parts (its workers'), as chunks: each step of the
    generator handles at most :data:`CHUNK` clusters. Every family's lines are contiguous and
    its TYPE line appears once."""
    import time

    now = time.time() if now is None else now
    m = merge_scalars(part.get("scalars") or {} for part in parts)
    yield _text(_scalar_lines(m))

    requests = [part.get("requests") or {} for part in parts]
    names = _union(requests)
    yield b""  # a turn of the event loop between two steps of work
    lines = ["# HELP hubproxy_requests_total Requests answered, by cluster and HTTP status "
             "class (1xx..5xx; exact codes in hubproxy_requests_by_code_total).",
             "# TYPE hubproxy_requests_total counter"]
    for chunk in _chunks(names):
        for name in chunk:
            total = [0] * len(CODE_CLASSES)
            for section in requests:
                counts = section.get(name)
                if counts:
                    for i, count in enumerate(counts[:len(CODE_CLASSES)]):
                        total[i] += int(count)
            label = _escape(name)
            lines += [f'hubproxy_requests_total{{cluster="{label}",code="{CODE_CLASSES[i]}"}} '
                      f"{count}" for i, count in enumerate(total) if count]
        yield _text(lines)
        lines = []

    if detail:
        latency = [part.get("cluster_latency") or {} for part in parts]
        lines = ["# HELP hubproxy_cluster_request_duration_seconds Requests by cluster and "
                 "class (--cluster-metrics detailed).",
                 "# TYPE hubproxy_cluster_request_duration_seconds histogram"]
        for chunk in _chunks(_union(latency)):
            for name in chunk:
                merged: dict[str, Histogram] = {}
                for section in latency:
                    for kind, values in (section.get(name) or {}).items():
                        merged.setdefault(kind, Histogram(REQUEST_BUCKETS)).add_json(values)
                for kind, histogram in sorted(merged.items()):
                    lines += histogram.lines("hubproxy_cluster_request_duration_seconds",
                                             f'cluster="{_escape(name)}",'
                                             f'class="{_escape(kind)}"')
            yield _text(lines)
            lines = []

    fleets = [part.get("fleet") or {} for part in parts]
    stats: list[tuple[str, TunnelStats]] = []
    names = _union(fleets)
    yield b""
    for chunk in _chunks(names):
        for name in chunk:
            entries = [entry for entry in (f.get(name) for f in fleets) if entry]
            stats.append((name, fleet_stats(entries)))
        yield b""
    for chunk_lines in _tunnel_lines(stats, own_certificates, detail, now):
        yield _text(chunk_lines)


def _tunnel_lines(stats: list[tuple[str, TunnelStats]], own_certificates: dict[str, float],
                  detail: bool, now: float) -> Iterator[list[str]]:
    connected = [s for _, s in stats if s.sessions]
    yield [
        "# HELP hubproxy_connected_agents Agent tunnel sessions connected.",
        "# TYPE hubproxy_connected_agents gauge",
        f"hubproxy_connected_agents {sum(s.sessions for s in connected)}",
        "# HELP hubproxy_connected_clusters Clusters with at least one agent session.",
        "# TYPE hubproxy_connected_clusters gauge",
        f"hubproxy_connected_clusters {len(connected)}",
    ]
    families: list[tuple[str, str, str, Callable[[str, TunnelStats], list[str]]]] = [
        ("hubproxy_tunnel_sessions", "gauge", "Agent tunnel sessions per cluster (all workers).",
         lambda label, s: [f"hubproxy_tunnel_sessions{{{label}}} {s.sessions}"]),
        ("hubproxy_tunnel_rtt_seconds", "gauge", "Tunnel round-trip time measured by PING, the "
         "slowest session of each cluster.",
         lambda label, s: [] if s.rtt_seconds is None else
         [f"hubproxy_tunnel_rtt_seconds{{{label}}} {s.rtt_seconds:.6f}"]),
        ("hubproxy_tunnel_active_streams", "gauge", "Streams open on each cluster's sessions.",
         lambda label, s: [f"hubproxy_tunnel_active_streams{{{label}}} {s.active_streams}"]),
        ("hubproxy_tunnel_streams_opened_total", "counter", "Streams opened toward each "
         "cluster.",
         lambda label, s: [f"hubproxy_tunnel_streams_opened_total{{{label}}} "
                           f"{s.streams_opened}"]),
        ("hubproxy_tunnel_bytes_total", "counter", "Tunnel bytes (TLS payload, frames "
         "included) per cluster and direction.",
         lambda label, s: [
             f'hubproxy_tunnel_bytes_total{{{label},direction="from_agent"}} '
             f"{s.bytes_from_agent}",
             f'hubproxy_tunnel_bytes_total{{{label},direction="to_agent"}} {s.bytes_to_agent}']),
        ("hubproxy_agent_info", "gauge", "Connected agent sessions by cluster and agent "
         "version.",
         lambda label, s: [f'hubproxy_agent_info{{{label},version="{_escape(v)}"}} {n}'
                           for v, n in sorted(s.versions.items())]),
    ]
    for name, kind, text, lines_of in families:
        lines = [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for start in range(0, len(stats), CHUNK):
            for cluster, s in stats[start:start + CHUNK]:
                lines += lines_of(f'cluster="{_escape(cluster)}"', s)
            yield lines
            lines = []
    yield from _certificate_lines(stats, own_certificates, detail, now)


def _certificate_lines(stats: list[tuple[str, TunnelStats]], own: dict[str, float],
                       detail: bool, now: float) -> Iterator[list[str]]:
    """This process's certificates and, per cluster only when detailed, the agents'; always
    the earliest agent certificate and how many clusters' expire within 7 and 30 days."""
    expiries = [(c, s.certificate_not_after) for c, s in stats
                if s.sessions and s.certificate_not_after is not None]
    if own or (detail and expiries):
        lines = [
            "# HELP hubproxy_certificate_expiry_timestamp_seconds When a certificate expires "
            "(Unix time): serving, tunnel, and with --cluster-metrics detailed each cluster's "
            "agent client certificate (earliest of its sessions).",
            "# TYPE hubproxy_certificate_expiry_timestamp_seconds gauge",
        ]
        for name, when in sorted(own.items()):
            lines.append(f'hubproxy_certificate_expiry_timestamp_seconds{{certificate='
                         f'"{_escape(name)}"}} {when:.0f}')
        if detail:
            for cluster, when in expiries:
                lines.append(f'hubproxy_certificate_expiry_timestamp_seconds{{'
                             f'certificate="agent",cluster="{_escape(cluster)}"}} {when:.0f}')
        yield lines
    if not expiries:
        return
    earliest = min(when for _, when in expiries)
    lines = [
        "# HELP hubproxy_agent_certificate_earliest_expiry_timestamp_seconds When the first of "
        "the connected agents' client certificates expires (Unix time).",
        "# TYPE hubproxy_agent_certificate_earliest_expiry_timestamp_seconds gauge",
        f"hubproxy_agent_certificate_earliest_expiry_timestamp_seconds {earliest:.0f}",
        "# HELP hubproxy_agent_certificates_expiring Connected clusters whose agent client "
        "certificate (the earliest of their sessions) expires within the window (or has).",
        "# TYPE hubproxy_agent_certificates_expiring gauge",
    ]
    for days, seconds in EXPIRY_WINDOWS:
        count = sum(1 for _, when in expiries if when - now <= seconds)
        lines.append(f'hubproxy_agent_certificates_expiring{{within="{days}d"}} {count}')
    yield lines
