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

import base64
import bisect
import json
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.ops.metrics import LazyMapping, TunnelStats
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
    """One gateway process's sessions, kept current by the registry's session events.

    ``on_change(cluster)`` is called when a cluster's sessions come or go (the metrics link
    sends worker 0 what changed).
    """

    def __init__(self, registry: SessionRegistry, worker: int = 0,
                 clock: Any = time.time,
                 on_change: Callable[[str], None] | None = None) -> None:
        self.registry = registry
        self.worker = worker
        self.clock = clock
        self.on_change = on_change
        self._sessions: dict[Any, _Session] = {}
        self._clusters: dict[str, _Cluster] = {}
        registry.subscribe_sessions(self._session_changed)

    def _session_changed(self, cluster: str, session: Any, added: bool) -> None:
        state = self._clusters.setdefault(cluster, _Cluster())
        now = self.clock()
        if self.on_change is not None:
            self.on_change(cluster)
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

    def names(self) -> list[str]:
        """Every cluster that connected here since start."""
        return list(self._clusters)

    def entry(self, cluster: str) -> dict[str, Any] | None:
        """One cluster's part as plain JSON values (None: never connected here)."""
        state = self._clusters.get(cluster)
        if state is None:
            return None
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
        return {
            "sessions": sessions,
            "last_error": state.last_error,
            "last_error_at": state.last_error_at,
            "disconnected_at": state.disconnected_at,
            "ended_bytes_in": state.ended_bytes_in,
            "ended_bytes_out": state.ended_bytes_out,
            "ended_streams": state.ended_streams,
        }

    def entries(self) -> LazyMapping:
        """Every cluster's :meth:`entry`, computed when read (never copied as a whole)."""
        return LazyMapping(self.names, self.entry)

    def snapshot(self) -> dict[str, Any]:
        """This worker's clusters and sessions as plain JSON values (O(clusters))."""
        return {name: self.entry(name) for name in self.names()}


def merge_entries(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One cluster's entries from several workers -> one: sessions and totals add up; the
    latest error wins."""
    merged: dict[str, Any] = {}
    for entry in entries:
        if not merged:
            merged = {**entry, "sessions": list(entry.get("sessions", ()))}
            continue
        merged["sessions"].extend(entry.get("sessions", ()))
        for key in ("ended_bytes_in", "ended_bytes_out", "ended_streams"):
            merged[key] = merged.get(key, 0) + entry.get(key, 0)
        if (entry.get("last_error_at") or 0) > (merged.get("last_error_at") or 0):
            merged["last_error"], merged["last_error_at"] = (entry["last_error"],
                                                             entry["last_error_at"])
        if (entry.get("disconnected_at") or 0) > (merged.get("disconnected_at") or 0):
            merged["disconnected_at"] = entry["disconnected_at"]
    return merged


def merge(parts: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Workers' fleet parts -> one, cluster by cluster (see :func:`merge_entries`)."""
    names: set[str] = set()
    for part in parts:
        names.update(part)
    return {name: merge_entries([e for e in (part.get(name) for part in parts) if e])
            for name in names}


def cluster_row(name: str, entry: dict[str, Any], details: bool = True) -> dict[str, Any]:
    """One cluster of the ``/clusters`` document: its summary (what ``hubproxy clusters``
    prints) and, with ``details``, its sessions."""
    sessions = sorted(entry.get("sessions", ()),
                      key=lambda s: (s.get("hub_worker") or 0, s.get("connected_at") or 0))
    instances = {s.get("agent_instance") or f"session-{i}" for i, s in enumerate(sessions)}
    rtts = [s["rtt_ms"] for s in sessions if s.get("rtt_ms") is not None]
    expiries = [s["certificate_not_after"] for s in sessions
                if s.get("certificate_not_after") is not None]
    row = {
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
    }
    if details:
        row["session_details"] = [{**s, "connected_at": iso(s.get("connected_at")),
                                   "certificate_not_after": iso(s.get("certificate_not_after"))}
                                  for s in sessions]
    return row


def summarize(merged: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The whole ``/clusters`` document of a merged fleet in one piece (small fleets, tests):
    one entry per cluster, sorted by name, each with its summary and its sessions."""
    now = time.time() if now is None else now
    return {"kind": KIND, "gateway_version": version(), "time": iso(now),
            "clusters": [cluster_row(name, merged[name]) for name in sorted(merged)]}


def tunnel_stats(entries: list[dict[str, Any]]) -> TunnelStats:
    """One cluster's tunnel figures (``/metrics``) from its entries, one per worker."""
    sessions = rtt = active = opened = received = sent = 0
    slowest: float | None = None
    earliest: float | None = None
    versions: dict[str, int] = {}
    for entry in entries:
        opened += entry.get("ended_streams", 0)
        received += entry.get("ended_bytes_in", 0)
        sent += entry.get("ended_bytes_out", 0)
        for s in entry.get("sessions", ()):
            sessions += 1
            rtt = s.get("rtt_ms")
            if rtt is not None and (slowest is None or rtt > slowest):
                slowest = rtt
            active += s.get("active_streams", 0)
            opened += s.get("streams_total", 0)
            received += s.get("bytes_in", 0)
            sent += s.get("bytes_out", 0)
            name = s.get("agent_version") or "unknown"
            versions[name] = versions.get(name, 0) + 1
            not_after = s.get("certificate_not_after")
            if not_after is not None and (earliest is None or not_after < earliest):
                earliest = not_after
    return TunnelStats(sessions, None if slowest is None else slowest / 1000, active, opened,
                       received, sent, versions, earliest)


# --- GET /clusters: pages, filters, a summary ---------------------------------------------------

KIND = "HubproxyClusterList"
DEFAULT_LIMIT = 500  # clusters per page when the client does not say
MAX_LIMIT = 1000  # a larger limit is served as this (the client follows `continue`)
COMPACT_ABOVE = 100  # larger fleets leave session details out unless ?details=true
STATES = ("connected", "disconnected")
STEP = 128  # clusters handled between two turns of the event loop (1-3 ms)


@dataclass(frozen=True)
class ListQuery:
    """What a ``GET /clusters`` asks for (``?limit=&continue=&cluster=&state=&details=``)."""

    limit: int = DEFAULT_LIMIT
    after: str = ""  # from `continue`: the last cluster of the previous page
    cluster: str = ""  # exactly this cluster
    state: str = ""  # connected | disconnected | "" (both)
    details: bool | None = None  # None: only for a fleet of at most COMPACT_ABOVE clusters


def encode_continue(after: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": after}).encode()).decode().rstrip("=")


def parse_query(query: str) -> ListQuery:
    """A :class:`ListQuery` from the query string; ValueError (a 400) for a bad value."""
    values = urllib.parse.parse_qs(query, keep_blank_values=True)

    def one(key: str) -> str:
        given = values.get(key) or [""]
        return given[-1]

    limit = DEFAULT_LIMIT
    if one("limit"):
        if not one("limit").isdigit() or int(one("limit")) < 1:
            raise ValueError("limit must be a positive integer")
        limit = min(int(one("limit")), MAX_LIMIT)
    after = ""
    if one("continue"):
        token = one("continue")
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            after = str(decoded["after"])
        except (ValueError, KeyError, TypeError):
            raise ValueError("continue is not a token this gateway gave") from None
    state = one("state")
    if state not in ("", *STATES):
        raise ValueError(f"state must be one of {', '.join(STATES)}")
    details = {"": None, "true": True, "1": True, "false": False, "0": False}.get(one("details"))
    if one("details") and details is None:
        raise ValueError("details must be true or false")
    return ListQuery(limit=limit, after=after, cluster=one("cluster"), state=state,
                     details=details)


class _Summary:
    """Totals over the whole fleet (the first page of ``/clusters`` carries them)."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.clusters = self.connected = self.sessions = self.with_error = 0
        self.versions: dict[str, int] = {}
        self.earliest: float | None = None
        self.expiring = dict.fromkeys(EXPIRY_DAYS, 0)

    def add(self, entry: dict[str, Any]) -> None:
        stats = tunnel_stats([entry])
        self.clusters += 1
        if entry.get("last_error"):
            self.with_error += 1
        if not stats.sessions:
            return
        self.connected += 1
        self.sessions += stats.sessions
        for name, count in stats.versions.items():
            self.versions[name] = self.versions.get(name, 0) + count
        when = stats.certificate_not_after
        if when is not None:
            self.earliest = when if self.earliest is None else min(self.earliest, when)
            for days in EXPIRY_DAYS:
                if when - self.now <= days * 86400:
                    self.expiring[days] += 1

    def document(self) -> dict[str, Any]:
        return {"clusters": self.clusters, "connected": self.connected,
                "disconnected": self.clusters - self.connected, "sessions": self.sessions,
                "with_last_error": self.with_error,
                "agent_versions": dict(sorted(self.versions.items())),
                "certificates": {"earliest_not_after": iso(self.earliest),
                                 **{f"expiring_within_{d}d": n
                                    for d, n in self.expiring.items()}}}


EXPIRY_DAYS = (7, 30)


def cluster_list(fleets: list[Mapping[str, Any]], query: ListQuery,
                 now: float | None = None) -> Iterator[bytes]:
    """The ``/clusters`` answer for ``query``, built a step at a time: the generator yields
    after every :data:`STEP` clusters (``b""`` while working, the document's bytes at the end),
    so a 10,000-cluster fleet never holds the event loop for long.

    Pages follow Kubernetes lists: clusters sorted by name, at most ``limit`` of them, and
    ``metadata.continue`` when more follow (the token names the last cluster sent, so a
    cluster that exists throughout appears exactly once however the fleet changes between
    pages). The first page carries ``summary``, totals over the whole fleet.
    """
    now = time.time() if now is None else now
    names: set[str] = set()
    for fleet in fleets:
        names.update(fleet)
    ordered = sorted(names)
    yield b""  # 10,000 names gathered and sorted: a few milliseconds
    details = query.details
    if details is None:  # one cluster asked for by name: all of it
        details = bool(query.cluster) or len(ordered) <= COMPACT_ABOVE
    if query.cluster:
        candidates = [query.cluster] if query.cluster in names else []
    else:
        candidates = ordered[bisect.bisect_right(ordered, query.after):] if query.after \
            else ordered
    # The first page (no cursor, no name) walks the whole fleet for the summary; the others
    # stop once their page is full.
    summary = _Summary(now) if not query.after and not query.cluster else None
    rows: list[str] = []
    last = ""
    more = False
    for start in range(0, len(candidates), STEP):
        for name in candidates[start:start + STEP]:
            entry = merge_entries([e for e in (f.get(name) for f in fleets) if e])
            if summary is not None:
                summary.add(entry)
            if more:
                continue
            if query.state and (query.state == "connected") != bool(entry.get("sessions")):
                continue
            if len(rows) == query.limit:
                more = True
                if summary is None:
                    break
                continue
            rows.append(json.dumps(cluster_row(name, entry, details), indent=1))
            last = name
        if more and summary is None:
            break
        yield b""
    document: dict[str, Any] = {"kind": KIND, "gateway_version": version(), "time": iso(now)}
    if more:
        document["metadata"] = {"continue": encode_continue(last)}
        if not query.state and not query.cluster:
            document["metadata"]["remainingItemCount"] = (
                len(ordered) - bisect.bisect_right(ordered, last))
    if summary is not None:
        document["summary"] = summary.document()
    head = json.dumps(document, indent=1)[:-2]  # without the closing "\n}"
    yield (head + ',\n "clusters": [\n' + ",\n".join(rows) + "\n ]\n}\n").encode()

