"""The agent's ``/metrics`` (Prometheus text) on its health port.

What an operator of a managed cluster asks of the agent: how long its upstreams take to answer
(time from the stream's OPEN to the upstream's response head, by upstream kind), how full its
connection pool is, how streams end (errors included: refusals by code, upstream failures,
resets), and its tunnel sessions to the hub (count, RTT, bytes) and certificate expiry.

Labels are bounded: ``upstream`` is ``kube-apiserver``, ``service`` or ``tcp`` (never a Service
name or an address), ``outcome`` one of the agent's fixed outcome kinds. No identities, no
paths. Recording is one histogram observation and one counter per stream, at its end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from gateway.ops.metrics import Histogram

# Upstream response-head latency (seconds): apiserver answers are milliseconds; slow lists and
# a hung upstream reach the last buckets.
UPSTREAM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)
UPSTREAMS = ("kube-apiserver", "service", "tcp")
PROFILES = ("legacy", "constrained", "none", "unknown")  # gateway.agent.impersonation


def outcome_kind(outcome: str) -> str:
    """``refused OVERLOAD`` -> ``refused_overload``; ``reset: why`` -> ``reset``: a bounded
    label (the free text after the kind never becomes a label)."""
    if outcome == "complete":  # most streams
        return outcome
    outcome = outcome or "closed"
    if outcome.startswith("refused "):
        return "refused_" + outcome[len("refused "):].strip().lower()
    return outcome.split(":")[0].strip().replace(" ", "_")


class AgentMetrics:
    """Counters the agent updates per stream; the rest is read at scrape time."""

    def __init__(self) -> None:
        self.upstream_latency: dict[str, Histogram] = {
            kind: Histogram(UPSTREAM_BUCKETS) for kind in UPSTREAMS}
        self.outcomes: Counter[tuple[str, str]] = Counter()
        # Live values, wired by the agent command.
        self.pool: Any = None  # gateway.agent.pool.UpstreamPool
        self.sessions: Callable[[], Iterable[Any]] = lambda: ()
        self.stats: Any = None  # gateway.agent.agent.AgentStats
        self.certificates: Callable[[], dict[str, float]] = dict
        self.version = ""
        # gateway.agent.impersonation: legacy, constrained, none or unknown (not asked yet).
        self.impersonation_profile: Callable[[], str] | None = None

    def stream_done(self, kind: str, outcome: str, started: float,
                    response_at: float = 0.0) -> None:
        if response_at:
            self.upstream_latency[kind].observe(max(0.0, response_at - started))
        self.outcomes[(kind, outcome_kind(outcome))] += 1

    def render(self) -> bytes:
        lines = [
            "# HELP hubproxy_agent_upstream_response_seconds From the hub's OPEN to the "
            "upstream's response head, by upstream kind.",
            "# TYPE hubproxy_agent_upstream_response_seconds histogram",
        ]
        for kind in UPSTREAMS:
            lines += self.upstream_latency[kind].lines(
                "hubproxy_agent_upstream_response_seconds", f'upstream="{kind}"')
        lines += [
            "# HELP hubproxy_agent_streams_finished_total Streams by upstream kind and how they "
            "ended (complete, upgraded, closed, cancelled, refused_<code>, upstream_failed, "
            "reset).",
            "# TYPE hubproxy_agent_streams_finished_total counter",
        ]
        for (kind, outcome), count in sorted(self.outcomes.items()):
            lines.append(f'hubproxy_agent_streams_finished_total{{upstream="{kind}",'
                         f'outcome="{outcome}"}} {count}')
        stats = self.stats
        if stats is not None:
            lines += [
                "# HELP hubproxy_agent_streams_total Streams the hub opened.",
                "# TYPE hubproxy_agent_streams_total counter",
                f"hubproxy_agent_streams_total {stats.streams}",
                "# HELP hubproxy_agent_streams_refused_total Streams refused at OPEN (policy, "
                "no identity).",
                "# TYPE hubproxy_agent_streams_refused_total counter",
                f"hubproxy_agent_streams_refused_total {stats.refused}",
                "# HELP hubproxy_agent_active_streams HTTP exchanges in progress.",
                "# TYPE hubproxy_agent_active_streams gauge",
                f"hubproxy_agent_active_streams {stats.active}",
            ]
        pool = self.pool
        if pool is not None:
            lines += [
                "# HELP hubproxy_agent_upstream_connections Upstream connections by state.",
                "# TYPE hubproxy_agent_upstream_connections gauge",
                f'hubproxy_agent_upstream_connections{{state="in_use"}} {pool.in_use}',
                f'hubproxy_agent_upstream_connections{{state="idle"}} {pool.idle}',
                "# HELP hubproxy_agent_upstream_connections_limit --max-upstream-connections.",
                "# TYPE hubproxy_agent_upstream_connections_limit gauge",
                f"hubproxy_agent_upstream_connections_limit {pool.max_connections}",
                "# HELP hubproxy_agent_upstream_dials_total New upstream connections made.",
                "# TYPE hubproxy_agent_upstream_dials_total counter",
                f"hubproxy_agent_upstream_dials_total {pool.dials}",
                "# HELP hubproxy_agent_upstream_protocol_dials_total New upstream connections "
                "by the protocol they speak (h1, h2: as TLS ALPN settled it).",
                "# TYPE hubproxy_agent_upstream_protocol_dials_total counter",
                *(f'hubproxy_agent_upstream_protocol_dials_total{{protocol="{proto}"}} '
                  f"{pool.protocol_dials[proto]}" for proto in ("h1", "h2")),
            ]
            h2conns = pool.h2_connections()
            lines += [
                "# HELP hubproxy_agent_upstream_h2_connections HTTP/2 connections to the "
                "apiserver.",
                "# TYPE hubproxy_agent_upstream_h2_connections gauge",
                f"hubproxy_agent_upstream_h2_connections {len(h2conns)}",
                "# HELP hubproxy_agent_upstream_h2_streams Requests in progress (watches "
                "included) on HTTP/2 connections to the apiserver.",
                "# TYPE hubproxy_agent_upstream_h2_streams gauge",
                f"hubproxy_agent_upstream_h2_streams {sum(len(c.handles) for c in h2conns)}",
                "# HELP hubproxy_agent_upstream_h2_streams_max Most requests in progress on "
                "one HTTP/2 connection now, and the limit per connection (the lower of "
                "--apiserver-h2-streams and the server's SETTINGS_MAX_CONCURRENT_STREAMS).",
                "# TYPE hubproxy_agent_upstream_h2_streams_max gauge",
                f'hubproxy_agent_upstream_h2_streams_max{{of="busiest"}} '
                f"{max((len(c.handles) for c in h2conns), default=0)}",
                f'hubproxy_agent_upstream_h2_streams_max{{of="limit"}} '
                f"{min((c.stream_limit for c in h2conns), default=pool.h2_max_streams)}",
            ]
        sessions = [s for s in self.sessions() if not getattr(s, "closed", False)]
        rtts = [s.rtt for s in sessions if getattr(s, "rtt", None) is not None]
        usable = [s for s in sessions if not getattr(s, "draining", False)]
        lines += [
            # Readiness says "connected" too, but a PodDisruptionBudget with AlwaysAllow (and a
            # drain) may ignore it: alert on this instead.
            "# HELP hubproxy_agent_hub_connected 1 while the agent holds a usable session to "
            "the hub.",
            "# TYPE hubproxy_agent_hub_connected gauge",
            f"hubproxy_agent_hub_connected {1 if usable else 0}",
            "# HELP hubproxy_agent_tunnel_sessions Tunnel sessions to the hub.",
            "# TYPE hubproxy_agent_tunnel_sessions gauge",
            f"hubproxy_agent_tunnel_sessions {len(sessions)}",
            "# HELP hubproxy_agent_tunnel_rtt_seconds Tunnel round-trip time, the slowest "
            "session.",
            "# TYPE hubproxy_agent_tunnel_rtt_seconds gauge",
            *([f"hubproxy_agent_tunnel_rtt_seconds {max(rtts):.6f}"] if rtts else []),
            "# HELP hubproxy_agent_tunnel_session_bytes Bytes carried by the current tunnel "
            "sessions (restarts at 0 with a new session).",
            "# TYPE hubproxy_agent_tunnel_session_bytes gauge",
            f'hubproxy_agent_tunnel_session_bytes{{direction="from_hub"}} '
            f'{sum(getattr(s, "bytes_received", 0) for s in sessions)}',
            f'hubproxy_agent_tunnel_session_bytes{{direction="to_hub"}} '
            f'{sum(getattr(s, "bytes_sent", 0) for s in sessions)}',
        ]
        certificates = self.certificates()
        if certificates:
            lines += [
                "# HELP hubproxy_certificate_expiry_timestamp_seconds When a certificate "
                "expires (Unix time).",
                "# TYPE hubproxy_certificate_expiry_timestamp_seconds gauge",
                *(f'hubproxy_certificate_expiry_timestamp_seconds{{certificate="{name}"}} '
                  f"{when:.0f}" for name, when in sorted(certificates.items())),
            ]
        if self.impersonation_profile is not None:
            held = self.impersonation_profile()
            lines += [
                "# HELP hubproxy_agent_impersonation_profile What the agent's credential may "
                "impersonate, as its apiserver answered at start: 1 for the profile held "
                "(legacy: any request; constrained: only the granted impersonate-on verbs; "
                "none; unknown: not answered yet).",
                "# TYPE hubproxy_agent_impersonation_profile gauge",
                *(f'hubproxy_agent_impersonation_profile{{profile="{name}"}} '
                  f"{1 if name == held else 0}" for name in PROFILES),
            ]
        if self.version:
            lines += [
                "# HELP hubproxy_agent_info The agent's version.",
                "# TYPE hubproxy_agent_info gauge",
                f'hubproxy_agent_info{{version="{self.version}"}} 1',
            ]
        return ("\n".join(lines) + "\n").encode("ascii")

