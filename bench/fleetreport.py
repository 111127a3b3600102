"""Figures, goals and the table of ``python -m bench fleet`` (pure: no processes).

:func:`summarize` turns one run's raw material into its figures: the clock marks the benchmark
took, what it measured on the way, the steady load's records (:mod:`bench.fleetload`) and the
agents' up/down events (:mod:`bench.fleetagents`). Times "until connected" and "until back"
come from the events (when the number of clusters up reached N), not from polling. A request
of the storm counts as "to a cluster already back" when its cluster had come up on the new
gateway before the request was sent.
"""

from __future__ import annotations

import math
import resource
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEAD_LINE = "declaring it dead"  # tunnel.connection's warning when the liveness rule fires
GOAL_CLUSTERS = 10000
RSS_PER_CLUSTER_KIB = 64
IDLE_CPU_PCT = 5.0
FORM_SECONDS = 60.0
CONVERGE_SECONDS = 120.0
P99_RATIO = 2.0
METRICS_SECONDS = 1.0


@dataclass(frozen=True)
class Event:
    at: float
    cluster: int
    up: bool
    reason: str = ""


def missing_tools() -> str | None:
    from tests.realkube.binaries import MissingBinaries, find_binaries

    try:
        find_binaries()
    except MissingBinaries as exc:
        return f"the real kube-apiserver tier's binaries: {exc}"
    return None


def nofile_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def dead_declared(log: str) -> int:
    return sum(1 for line in log.splitlines() if DEAD_LINE in line)


def parse_event(line: str) -> Event | None:
    """One line of :mod:`bench.fleetagents`' ``--events``: ``<time> <index> up|down [why]``."""
    parts = line.split()
    if len(parts) < 3:
        return None
    return Event(float(parts[0]), int(parts[1]), parts[2] == "up", " ".join(parts[3:]))


class EventLog:
    """The agents' events files, read as they grow (complete lines only)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.offsets = dict.fromkeys(paths, 0)
        self.events: list[Event] = []
        self.last_up: dict[int, float] = {}  # clusters up now -> when they came up

    def poll(self) -> None:
        fresh = []
        for path, offset in self.offsets.items():
            try:
                with path.open("rb") as log:
                    log.seek(offset)
                    data = log.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            self.offsets[path] = offset + end
            fresh += [e for line in data[:end].decode().splitlines()
                      if (e := parse_event(line)) is not None]
        fresh.sort(key=lambda e: e.at)
        for event in fresh:
            if event.up:
                self.last_up[event.cluster] = event.at
            else:
                self.last_up.pop(event.cluster, None)
        self.events += fresh

    def up_since(self, since: float) -> int:
        """Clusters up now whose session came up at or after ``since``."""
        return sum(1 for at in self.last_up.values() if at >= since)

    def all_events(self) -> list[Event]:
        self.poll()
        return sorted(self.events, key=lambda e: e.at)


def all_up_after(events: list[Event], since: float, clusters: int) -> float | None:
    """Seconds from ``since`` until every cluster had come up at least once after it."""
    seen: set[int] = set()
    for event in events:
        if event.at >= since and event.up:
            seen.add(event.cluster)
            if len(seen) >= clusters:
                return event.at - since
    return None


def first_up(events: list[Event], since: float) -> dict[int, float]:
    out: dict[int, float] = {}
    for event in events:
        if event.at >= since and event.up and event.cluster not in out:
            out[event.cluster] = event.at
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def requests(load: dict[str, Any], start: float, end: float,
             back: dict[int, float] | None = None, done_by: float | None = None
             ) -> dict[str, Any]:
    """The steady load's requests sent in [start, end): outcomes, p50/p99 of the successful.
    With ``back``: only those to clusters already back when sent (and how many were not).
    With ``done_by``: only those answered before it (and how many were still in flight)."""
    ok_latency: list[float] = []
    outcomes: Counter[str] = Counter()
    not_back = in_flight = 0
    for sent, latency, cluster, outcome in zip(load["sent"], load["latency"], load["cluster"],
                                               load["outcome"], strict=True):
        if not start <= sent < end:
            continue
        if done_by is not None and sent + latency >= done_by:
            in_flight += 1
            continue
        if back is not None and not (cluster in back and back[cluster] <= sent):
            not_back += 1
            continue
        outcomes[str(outcome) if outcome > 0 else
                 {-1: "connection error", -2: "timeout"}.get(outcome, str(outcome))] += 1
        if outcome == 200:
            ok_latency.append(latency)
    total = sum(outcomes.values())
    out: dict[str, Any] = {
        "requests": total, "ok": len(ok_latency), "failed": total - len(ok_latency),
        "outcomes": dict(sorted(outcomes.items())),
        "p50_ms": _ms(percentile(ok_latency, 50)), "p99_ms": _ms(percentile(ok_latency, 99))}
    if back is not None:
        out["to_clusters_not_back"] = not_back
    if done_by is not None:
        out["in_flight_at_end"] = in_flight
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def summarize(plan: Any, marks: dict[str, float], figures: dict[str, Any],
              load: dict[str, Any], events: list[Event]) -> dict[str, Any]:
    n = plan.clusters
    formed = all_up_after(events, marks["go"], n)
    back_s = all_up_after(events, marks["restart"], n)
    back = first_up(events, marks["restart"])
    connect, storm = figures["connect"], figures["storm"]
    connected = figures["connected_after_settle"]
    rss_delta = figures["gateway_rss_mib"] - figures["gateway_rss_before_mib"]
    agents = figures.get("agents", [])
    ended: Counter[str] = Counter()
    for status in agents:
        ended.update(status.get("ended", {}))
    return {
        "clusters": n,
        "all_connected_s": None if formed is None else round(formed, 2),
        "connect": connect,
        "gateway_rss_before_mib": figures["gateway_rss_before_mib"],
        "gateway_rss_mib": figures["gateway_rss_mib"],
        "gateway_rss_per_cluster_kib": round(rss_delta * 1024 / connected, 1)
        if connected else None,
        "gateway_cpu_ms_per_agent_admitted": round(
            connect["gateway_cpu_s"] * 1000 / max(1, connect["connected"]), 2),
        "agents_rss_mib": figures["agents_rss_mib"],
        "idle": figures["idle"],
        "closed_loop": figures.get("closed_loop"),
        "metrics": figures["metrics"],
        "clusters_endpoint": figures["clusters_endpoint"],
        "gateway_connected_clusters": figures.get("gateway_connected_clusters"),
        "converge_start": figures["converge_start"],
        "hub_start": figures["hub_start"],
        "storm": {**storm, "all_back_s": None if back_s is None else round(back_s, 2),
                  "requests_to_clusters_back": requests(load, marks["kill"],
                                                        marks["storm_end"], back)},
        "converge_storm": figures["converge_storm"],
        "hub_storm": figures["hub_storm"],
        "steady": {
            "during_start": requests(load, marks["go"], marks["formed"]),
            "connected": requests(load, marks["formed"], marks["kill"],
                                  done_by=marks["kill"]),
            "skipped": load.get("skipped", 0)},
        "dead_declared": {"gateway": figures["gateway_dead_declared"],
                          "agents": ended.get("peer dead", 0)},
        "sessions_ended_by_agents_reason": dict(ended),
        "agent_dials": sum(s.get("dials", 0) for s in agents),
        "agent_failed_dials": sum(s.get("failed_dials", 0) for s in agents),
        "hub_objects_s": figures["hub_objects_s"],
        "hub_write_limit": figures.get("hub_write_limit"),
        "seconds": figures["seconds"],
    }


def baseline_p99(runs: list[dict[str, Any]], path: Path | None) -> float | None:
    """The closed loop's p99 of the first run (of ``path``'s report if given)."""
    import json

    if path is not None:
        runs = json.loads(path.read_text())["runs"]
    if not runs or not runs[0].get("closed_loop"):
        return None
    return float(runs[0]["closed_loop"]["p99_ms"])


def _verdict(ok: bool | None, measured: str, goal: str) -> dict[str, Any]:
    return {"pass": ok, "measured": measured, "goal": goal}


def goals(run: dict[str, Any], baseline: float | None) -> dict[str, dict[str, Any]]:
    """Issue 22's goals, judged at this run's N (they are stated for 10,000 clusters)."""
    n = run["clusters"]
    out = {}
    connected = run["connect"]["connected"]
    out["clusters_connected"] = _verdict(
        connected >= n, f"{connected:,} of {n:,}",
        f"all {n:,} clusters connected to one gateway process (issue: {GOAL_CLUSTERS:,})")
    per = run["gateway_rss_per_cluster_kib"]
    out["rss_per_cluster"] = _verdict(
        per is not None and per <= RSS_PER_CLUSTER_KIB, f"{per} KiB",
        f"<= {RSS_PER_CLUSTER_KIB} KiB of gateway RSS per idle connected cluster")
    idle = run["idle"]["gateway_cpu_pct"]
    out["idle_cpu"] = _verdict(idle <= IDLE_CPU_PCT, f"{idle} % of one core",
                               f"idle CPU <= {IDLE_CPU_PCT:g} % of one core")
    formed = run["all_connected_s"]
    paced = run.get("plan", {}).get("pace")
    out["formed_at_once"] = _verdict(
        formed is not None and formed <= FORM_SECONDS,
        "never (deadline)" if formed is None else f"{formed} s"
        + (f" (paced at {paced:g}/s)" if paced else ""),
        f"all connected within {FORM_SECONDS:g} s, every agent dialling at once")
    storm = run["storm"]
    back_requests = storm["requests_to_clusters_back"]
    dead = sum(run["dead_declared"]["gateway"]) + run["dead_declared"]["agents"]
    back = storm["all_back_s"]
    out["restart"] = _verdict(
        back is not None and back <= FORM_SECONDS and back_requests["failed"] == 0
        and dead == 0,
        f"{'never (deadline)' if back is None else f'{back} s'}, "
        f"{back_requests['failed']} of {back_requests['requests']} requests to clusters back "
        f"failed, {dead} sessions declared dead",
        f"all back within {FORM_SECONDS:g} s of a gateway restart, 0 failed requests to "
        "clusters already back, no healthy session declared dead")
    p99 = (run.get("closed_loop") or {}).get("p99_ms")
    out["p99_vs_baseline"] = _verdict(
        None if p99 is None or baseline is None else p99 <= P99_RATIO * baseline,
        f"{p99} ms vs {baseline} ms at the first N" if p99 is not None else "no wrk",
        f"small-GET p99 <= {P99_RATIO:g}x the p99 with the fewest clusters (issue: 100)")
    limit = run.get("hub_write_limit")
    hub = run["hub_storm"]
    # A token bucket lets at most burst + qps * t through in any t seconds.
    bounded = None if limit is None else (
        hub["writes_per_s_peak"] <= limit["burst"] + limit["qps"]
        and hub["writes"] <= limit["burst"] + limit["qps"] * hub["seconds"])
    converge = [run["converge_start"]["seconds"], run["converge_storm"]["seconds"]]
    skipped = "skipped" in run["converge_start"]
    converged = None if skipped else all(
        s is not None and s <= CONVERGE_SECONDS for s in converge)
    out["hub_writes"] = _verdict(
        bounded,
        f"peak {hub['writes_per_s_peak']}/s, {hub['writes']} writes in {hub['seconds']} s; "
        + ("no write rate configured" if limit is None else
           f"--hub-write-qps {limit['qps']:g}, --hub-write-burst {limit['burst']:g}"),
        "hub writes during the storm bounded by the configured rate")
    out["converged"] = _verdict(
        converged, run["converge_start"]["skipped"] if skipped else
        f"{converge[0]} s after start, {converge[1]} s after the restart "
        f"(fewest right meanwhile: {run['converge_storm']['fewest']})",
        f"every ClusterProfile and condition right within {CONVERGE_SECONDS:g} s")
    scrape = run["metrics"]["seconds_max"]
    out["metrics_scrape"] = _verdict(
        scrape <= METRICS_SECONDS, f"{scrape} s for {run['metrics']['bytes']:,} bytes",
        f"/metrics <= {METRICS_SECONDS:g} s to scrape")
    return out


def table(runs: list[dict[str, Any]]) -> str:
    rows = [("clusters", "connected after", "gateway RSS (per cluster)", "idle CPU",
             "c=16 req/s, p99", "back after restart", "storm: failed/back, p99",
             "hub writes/s peak", "right after start/restart", "/metrics", "dead")]
    for r in runs:
        closed = r.get("closed_loop") or {}
        storm = r["storm"]
        back = storm["requests_to_clusters_back"]
        metrics = r["metrics"]
        rows.append((
            f"{r['clusters']:,}",
            _seconds(r["all_connected_s"], r["connect"]["connected"]),
            f"{r['gateway_rss_mib']:,.0f} MiB ({r['gateway_rss_per_cluster_kib']} KiB)",
            f"{r['idle']['gateway_cpu_pct']} %",
            f"{closed.get('rps', '-'):,}/s, {closed.get('p99_ms', '-')} ms" if closed else "-",
            _seconds(storm["all_back_s"], storm["connected"]),
            f"{back['failed']}/{back['requests']}, {back['p99_ms']} ms",
            f"{r['hub_storm']['writes_per_s_peak']} ({r['hub_storm']['writes']} in all)",
            "writers off" if "skipped" in r["converge_start"] else
            f"{_seconds(r['converge_start']['seconds'])} / "
            f"{_seconds(r['converge_storm']['seconds'])}",
            f"{metrics['bytes'] / 1e6:.1f} MB, {metrics['seconds_max']} s",
            f"{sum(r['dead_declared']['gateway'])}+{r['dead_declared']['agents']}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
                     for row in rows)


def _seconds(value: float | None, connected: int | None = None) -> str:
    if value is not None:
        return f"{value} s"
    return "never" + ("" if connected is None else f" ({connected:,} by the deadline)")
