"""The gateway's view of its fleet: which clusters are connected, through which agent sessions,
and how those sessions are doing. Served as ``GET /clusters`` on the health port, printed by
``hubproxy clusters``, and the source of the per-cluster tunnel metrics.

Per session: the agent's version and process id (from its tunnel SETTINGS; an agent that
predates them shows ``null``), the gateway worker holding it, when it connected, the tunnel's
measured RTT, streams open and opened, bytes each way, and when the agent's client certificate
expires (read once from the TLS handshake). Per cluster: the last abnormal end of a session
(peer dead, connection lost, protocol error) and when, and when the cluster last lost its last
session -- kept after it disconnects, so an operator sees *why* a cluster is gone.

Every value is a name, a number or a time: no tokens, no identities (DESIGN §6 rule 5).
Clusters appear only once an agent with a valid certificate for them connected, so the view is
bounded by the certificates the operator issued. Sessions are read with ``getattr`` defaults:
tests register stand-in sessions without the tunnel's counters.

Layout: :meth:`FleetView.snapshot` is one worker's part as plain JSON values (what a worker sends
worker 0 with ``--workers``); :func:`merge` joins the workers' parts; :func:`summarize` turns a
merged part into the ``/clusters`` document. The last two are pure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.ops.version import release_name, version
from tunnel.registry import SessionRegistry

# Session ends that are not errors: a drain (ours or the agent's), our own close, or the agent
# closing its side cleanly (its SIGTERM, a certificate rotation).
CLEAN_ENDS = ("drained", "closed", "connection closed")


def iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def peer_certificate_expiry(session: Any) -> float | None:
    """When the agent's client certificate expires (epoch seconds), from the handshake."""
    get_extra_info = getattr(session, "get_extra_info", None)
    ssl_object = get_extra_info("ssl_object") if get_extra_info is not None else None
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    from cryptography import x509

    try:
        return x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp()
    except ValueError:
        return None


@dataclass(slots=True)
class _Session:
    connected_at: float
    certificate_not_after: float | None


@dataclass(slots=True)
class _Cluster:
    last_error: str | None = None
    last_error_at: float | None = None
    disconnected_at: float | None = None
    # Totals of sessions that ended, so the per-cluster counters never go backwards.
    ended_bytes_in: int = 0
    ended_bytes_out: int = 0
    ended_streams: int = 0


class FleetView:
    """One gateway process's sessions, kept current by the registry's session events."""

    def __init__(self, registry: SessionRegistry, worker: int = 0,
                 clock: Any = time.time) -> None:
        self.registry = registry
        self.worker = worker
        self.clock = clock
        self._sessions: dict[Any, _Session] = {}
        self._clusters: dict[str, _Cluster] = {}
        registry.subscribe_sessions(self._session_changed)

    def _session_changed(self, cluster: str, session: Any, added: bool) -> None:
        state = self._clusters.setdefault(cluster, _Cluster())
        now = self.clock()
        if added:
            self._sessions[session] = _Session(now, peer_certificate_expiry(session))
            return
        self._sessions.pop(session, None)
        state.ended_bytes_in += getattr(session, "bytes_received", 0)
        state.ended_bytes_out += getattr(session, "bytes_sent", 0)
        state.ended_streams += getattr(session, "streams_opened", 0)
        reason = getattr(session, "close_reason", "") or "closed"
        if reason not in CLEAN_ENDS:
            state.last_error, state.last_error_at = reason, now
        if not self.registry.sessions(cluster):
            state.disconnected_at = now

    def snapshot(self) -> dict[str, Any]:
        """This worker's clusters and sessions as plain JSON values."""
        out: dict[str, Any] = {}
        for cluster, state in self._clusters.items():
            sessions = []
            for session in self.registry.sessions(cluster):
                facts = self._sessions.get(session)
                rtt = getattr(session, "rtt", None)
                instance = getattr(session, "agent_instance", 0)
                sessions.append({
                    "agent_version": release_name(getattr(session, "agent_version", 0)),
                    "agent_instance": f"{instance:08x}" if instance else None,
                    "hub_worker": self.worker,
                    "connected_at": facts.connected_at if facts else None,
                    "rtt_ms": round(rtt * 1000, 3) if rtt is not None else None,
                    "active_streams": getattr(session, "active_streams", 0),
                    "streams_total": getattr(session, "streams_opened", 0),
                    "bytes_in": getattr(session, "bytes_received", 0),
                    "bytes_out": getattr(session, "bytes_sent", 0),
                    "certificate_not_after": facts.certificate_not_after if facts else None,
                    "draining": bool(getattr(session, "draining", False)),
                })
            out[cluster] = {
                "sessions": sessions,
                "last_error": state.last_error,
                "last_error_at": state.last_error_at,
                "disconnected_at": state.disconnected_at,
                "ended_bytes_in": state.ended_bytes_in,
                "ended_bytes_out": state.ended_bytes_out,
                "ended_streams": state.ended_streams,
            }
        return out


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Workers' snapshots -> one: sessions and totals add up; the latest error wins."""
    merged: dict[str, Any] = {}
    for part in parts:
        for cluster, entry in part.items():
            into = merged.get(cluster)
            if into is None:
                merged[cluster] = {**entry, "sessions": list(entry.get("sessions", ()))}
                continue
            into["sessions"].extend(entry.get("sessions", ()))
            for key in ("ended_bytes_in", "ended_bytes_out", "ended_streams"):
                into[key] = into.get(key, 0) + entry.get(key, 0)
            if (entry.get("last_error_at") or 0) > (into.get("last_error_at") or 0):
                into["last_error"], into["last_error_at"] = (entry["last_error"],
                                                             entry["last_error_at"])
            if (entry.get("disconnected_at") or 0) > (into.get("disconnected_at") or 0):
                into["disconnected_at"] = entry["disconnected_at"]
    return merged


def summarize(merged: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The ``/clusters`` document: one entry per cluster, sorted by name, each with a summary
    (what ``hubproxy clusters`` prints) and its sessions."""
    now = time.time() if now is None else now
    clusters = []
    for name in sorted(merged):
        entry = merged[name]
        sessions = sorted(entry.get("sessions", ()),
                          key=lambda s: (s.get("hub_worker") or 0, s.get("connected_at") or 0))
        instances = {s.get("agent_instance") or f"session-{i}" for i, s in enumerate(sessions)}
        rtts = [s["rtt_ms"] for s in sessions if s.get("rtt_ms") is not None]
        expiries = [s["certificate_not_after"] for s in sessions
                    if s.get("certificate_not_after") is not None]
        clusters.append({
            "name": name,
            "connected": bool(sessions),
            "sessions": len(sessions),
            "instances": len(instances),
            "agent_versions": sorted({s.get("agent_version") or "unknown" for s in sessions}),
            "rtt_ms": max(rtts) if rtts else None,
            "certificate_not_after": iso(min(expiries)) if expiries else None,
            "active_streams": sum(s.get("active_streams", 0) for s in sessions),
            "last_error": entry.get("last_error"),
            "last_error_at": iso(entry.get("last_error_at")),
            "disconnected_at": None if sessions else iso(entry.get("disconnected_at")),
            "session_details": [{**s, "connected_at": iso(s.get("connected_at")),
                                 "certificate_not_after": iso(s.get("certificate_not_after"))}
                                for s in sessions],
        })
    return {"kind": "HubproxyClusterList", "gateway_version": version(), "time": iso(now),
            "clusters": clusters}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_lines(parts: list[dict[str, Any]]) -> list[str]:
    """Per-cluster tunnel series from the workers' parts (sessions of all workers add up)."""
    merged = merge(parts)
    sessions, rtt, streams, opened, bytes_io, info = [], [], [], [], [], []
    for name in sorted(merged):
        entry = merged[name]
        live = entry.get("sessions", ())
        label = f'cluster="{_escape(name)}"'
        sessions.append(f"hubproxy_tunnel_sessions{{{label}}} {len(live)}")
        rtts = [s["rtt_ms"] for s in live if s.get("rtt_ms") is not None]
        if rtts:
            rtt.append(f"hubproxy_tunnel_rtt_seconds{{{label}}} {max(rtts) / 1000:.6f}")
        streams.append(f"hubproxy_tunnel_active_streams{{{label}}} "
                       f"{sum(s.get('active_streams', 0) for s in live)}")
        total_opened = entry.get("ended_streams", 0) + sum(s.get("streams_total", 0)
                                                          for s in live)
        opened.append(f"hubproxy_tunnel_streams_opened_total{{{label}}} {total_opened}")
        received = entry.get("ended_bytes_in", 0) + sum(s.get("bytes_in", 0) for s in live)
        sent = entry.get("ended_bytes_out", 0) + sum(s.get("bytes_out", 0) for s in live)
        bytes_io.append(f'hubproxy_tunnel_bytes_total{{{label},direction="from_agent"}} '
                        f"{received}")
        bytes_io.append(f'hubproxy_tunnel_bytes_total{{{label},direction="to_agent"}} {sent}')
        versions: dict[str, int] = {}
        for s in live:
            version_name = s.get("agent_version") or "unknown"
            versions[version_name] = versions.get(version_name, 0) + 1
        for version_name, count in sorted(versions.items()):
            info.append(f'hubproxy_agent_info{{{label},version="{_escape(version_name)}"}} '
                        f"{count}")
    return [
        "# HELP hubproxy_tunnel_sessions Agent tunnel sessions per cluster (all workers).",
        "# TYPE hubproxy_tunnel_sessions gauge", *sessions,
        "# HELP hubproxy_tunnel_rtt_seconds Tunnel round-trip time measured by PING, the "
        "slowest session of each cluster.",
        "# TYPE hubproxy_tunnel_rtt_seconds gauge", *rtt,
        "# HELP hubproxy_tunnel_active_streams Streams open on each cluster's sessions.",
        "# TYPE hubproxy_tunnel_active_streams gauge", *streams,
        "# HELP hubproxy_tunnel_streams_opened_total Streams opened toward each cluster.",
        "# TYPE hubproxy_tunnel_streams_opened_total counter", *opened,
        "# HELP hubproxy_tunnel_bytes_total Tunnel bytes (TLS payload, frames included) per "
        "cluster and direction.",
        "# TYPE hubproxy_tunnel_bytes_total counter", *bytes_io,
        "# HELP hubproxy_agent_info Connected agent sessions by cluster and agent version.",
        "# TYPE hubproxy_agent_info gauge", *info,
    ]


def agent_certificates(parts: list[dict[str, Any]]) -> dict[str, float]:
    """Each connected cluster's earliest agent certificate expiry (epoch seconds)."""
    out: dict[str, float] = {}
    for name, entry in merge(parts).items():
        expiries = [s["certificate_not_after"] for s in entry.get("sessions", ())
                    if s.get("certificate_not_after") is not None]
        if expiries:
            out[name] = min(expiries)
    return out
