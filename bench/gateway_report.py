"""Figures, ratios, goals and the readable table of ``python -m bench gateway``."""

from __future__ import annotations

import statistics
from typing import Any

from bench import profiling

HUB = "hubproxy"
BASE = "hubproxy-base"  # --baseline-tree: another checkout, measured beside hubproxy
FLOOR = "floor-2hop"  # bench.hopfloor twice in series: the design's floor in Python
GOALS_TEXT = {
    "large_body_vs_nginx": ("large body >= 0.6 x nginx", 0.6, ">="),
    "large_body_vs_kubectl_proxy": ("large body >= 0.7 x kubectl proxy", 0.7, ">="),
    "small_get_c16_vs_kubectl_proxy": ("small GET c=16 >= 1.0 x kubectl proxy", 1.0, ">="),
    "small_get_c16_vs_aiohttp_proxy": ("small GET c=16 >= 2.0 x a naive aiohttp proxy", 2.0,
                                       ">="),
    "p50_added_ms_c1": ("c=1 p50 added over direct <= 0.4 ms", 0.4, "<="),
    "p99_added_ms_c1": ("c=1 p99 added over direct <= 1.5 ms", 1.5, "<="),
    "idle_watches_gateway_rss_10k_mib": ("10,000 idle watches <= 150 MiB gateway RSS", 150.0,
                                         "<="),
    "soak_gateway_rss_drift_pct": ("gateway RSS flat (+-5%) over the soak", 5.0, "abs<="),
    # Issue 15: HTTP/2 at the front door.
    "idle_watches_h2_gateway_rss_10k_mib": (
        "10,000 idle watches over HTTP/2 (100 connections) <= 150 MiB gateway RSS", 150.0, "<="),
    "idle_watches_h2_gateway_bytes_per_watch": (
        "idle watch over HTTP/2 <= 8 KiB of gateway RSS", 8192.0, "<="),
    "small_get_h2_m16_vs_h1_c16": ("small GETs, 16 streams of one h2 connection >= 1.0 x "
                                   "HTTP/1.1 c=16", 1.0, ">="),
    "p50_added_ms_c1_h2": ("c=1 over HTTP/2: p50 added over direct-h2 <= 0.4 ms", 0.4, "<="),
    "p99_added_ms_c1_h2": ("c=1 over HTTP/2: p99 added over direct-h2 <= 1.5 ms", 1.5, "<="),
    "idle_watches_h2_agent_bytes_per_watch": (
        "agent <= 8 KiB per idle watch with an HTTP/2 upstream (see the protocol the upstream "
        "saw)", 8192.0, "<="),
    # Issue 26: the hot path (keys of their own: the same ratios, other limits).
    "hotpath_watch_vs_kubectl_proxy": (
        "(issue 26) watch events/s >= 0.8 x kubectl proxy", 0.8, ">="),
    "hotpath_cpu_per_10k_vs_kubectl_proxy": (
        "(issue 26) proxy CPU per 10k small GETs <= 2 x kubectl proxy's", 2.0, "<="),
    "hotpath_small_get_c16_vs_kubectl_proxy": (
        "(issue 26) small GET c=16 >= 0.6 x kubectl proxy", 0.6, ">="),
    "hotpath_p50_added_ms_c1": ("(issue 26) c=1 p50 added over direct <= 0.4 ms", 0.4, "<="),
}
# The ratio each issue-26 goal reads.
HOTPATH_SOURCES = {
    "hotpath_watch_vs_kubectl_proxy": "watch_vs_kubectl_proxy",
    "hotpath_cpu_per_10k_vs_kubectl_proxy": "cpu_per_10k_vs_kubectl_proxy",
    "hotpath_small_get_c16_vs_kubectl_proxy": "small_get_c16_vs_kubectl_proxy",
    "hotpath_p50_added_ms_c1": "p50_added_ms_c1",
}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(raw: dict[str, Any], body_bytes: int) -> dict[str, Any]:
    """One configuration's figures from its raw runs."""
    out: dict[str, Any] = {"note": raw["note"], "small_get": {}}
    for key, runs in raw["small_get_runs"].items():
        out["small_get"][key] = {
            "rps": _median([r["rps"] for r in runs]),
            "p50_ms": _median([r["p50_ms"] for r in runs]),
            "p99_ms": _median([r["p99_ms"] for r in runs]),
            "errors": sum(r["errors"] for r in runs),
            "client_cpu_util_max": max(r["client_cpu_util"] for r in runs),
        }
    # h2load, one HTTP/2 connection: 16 streams beside wrk's c=16, 1 stream beside its c=1.
    for key, runs_key in (("h2_c1_m16", "h2_small_get_runs"), ("h2_c1_m1", "h2_c1_runs")):
        h2runs = raw.get(runs_key, [])
        if h2runs:
            out["small_get"][key] = {
                "rps": _median([r["rps"] for r in h2runs]),
                **{q: _median([r[q] for r in h2runs if r.get(q) is not None])
                   for q in ("mean_ms", "p50_ms", "p99_ms")},
                "errors": sum(r["errors"] for r in h2runs),
                "client_cpu_util_max": max(r["client_cpu_util"] for r in h2runs),
                # CPU per request of each process: unlike req/s, barely moved by what else
                # runs on the machine (the c=16 figure is under "cpu").
                "cpu_s_per_10k_requests": _cpu_per_10k(h2runs, raw["roles"]),
            }
    if raw.get("h2_body_runs"):
        out["large_body_h2"] = {"mb_s": _median([r["speed"] / 1e6 for r in raw["h2_body_runs"]]),
                                "samples_mb_s": [round(r["speed"] / 1e6, 1)
                                                 for r in raw["h2_body_runs"]]}
    body = raw["body_runs"]
    out["large_body"] = {
        "mb_s": _median([r["speed"] / 1e6 for r in body]),
        "samples_mb_s": [round(r["speed"] / 1e6, 1) for r in body],
        "bytes": body_bytes,
        "client_cpu_util_max": max((r["client_cpu_util"] for r in body), default=None),
    }
    watch = raw["watch_runs"]
    out["watch"] = {"events_per_s": _median([r["events_per_s"] for r in watch]),
                    "samples": [round(r["events_per_s"]) for r in watch]}
    ttfb = raw["ttfb_runs"]
    out["ttfb"] = {
        "ms": _median([r["ttfb"] * 1000 for r in ttfb]),
        "after_handshake_ms": _median([(r["ttfb"] - r["appconnect"]) * 1000 if r["appconnect"]
                                       else (r["ttfb"] - r["connect"]) * 1000 for r in ttfb]),
        "samples": len(ttfb),
    }
    # CPU per role: per 10k requests from the c=16 runs, per GB from the body runs.
    c16 = raw["small_get_runs"].get("c16", [])
    requests = sum(r["requests"] for r in c16)
    moved = sum(r["size"] for r in body)
    cpu: dict[str, dict[str, float | None]] = {}
    for role in raw["roles"]:
        req_cpu = sum(r["cpu_s"].get(role, 0.0) for r in c16)
        body_cpu = sum(r["cpu_s"].get(role, 0.0) for r in body)
        cpu[role] = {"s_per_10k_requests": 1e4 * req_cpu / requests if requests else None,
                     "s_per_gb": 1e9 * body_cpu / moved if moved else None}
    total = {k: sum(v[k] or 0.0 for v in cpu.values()) if cpu else None
             for k in ("s_per_10k_requests", "s_per_gb")}
    out["cpu"] = {**cpu, "total": total}
    out["peak_rss_mib"] = raw.get("peak_rss_mib", {})
    return out


def _cpu_per_10k(runs: list[dict[str, Any]], roles: dict[str, Any]) -> dict[str, float | None]:
    requests = sum(r["requests"] for r in runs)
    out: dict[str, float | None] = {
        role: 1e4 * sum(r.get("cpu_s", {}).get(role, 0.0) for r in runs) / requests
        if requests else None for role in roles}
    out["total"] = sum(v or 0.0 for v in out.values()) if requests else None
    return out


def _get(cfgs: dict[str, Any], name: str, *path: str) -> float | None:
    node: Any = cfgs.get(name)
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node if isinstance(node, int | float) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(cfgs: dict[str, Any]) -> dict[str, float | None]:
    """hubproxy against the others (and the relay against direct: the framing cost)."""
    out: dict[str, float | None] = {}
    body = ("large_body", "mb_s")
    for other, key in (("direct", "direct"), ("nginx", "nginx"),
                       ("kubectl-proxy", "kubectl_proxy")):
        out[f"large_body_vs_{key}"] = _ratio(_get(cfgs, HUB, *body), _get(cfgs, other, *body))
        for conc in ("c1", "c16", "c64"):
            out[f"small_get_{conc}_vs_{key}"] = _ratio(_get(cfgs, HUB, "small_get", conc, "rps"),
                                                      _get(cfgs, other, "small_get", conc, "rps"))
        out[f"watch_vs_{key}"] = _ratio(_get(cfgs, HUB, "watch", "events_per_s"),
                                        _get(cfgs, other, "watch", "events_per_s"))
    for q in ("p50", "p99"):
        hub = _get(cfgs, HUB, "small_get", "c1", f"{q}_ms")
        direct = _get(cfgs, "direct", "small_get", "c1", f"{q}_ms")
        out[f"{q}_added_ms_c1"] = round(hub - direct, 3) if hub is not None and direct is not None \
            else None
    # HTTP/2 (1 connection x 16 streams) against HTTP/1.1 c=16, both through hubproxy.
    out["small_get_h2_m16_vs_h1_c16"] = _ratio(_get(cfgs, HUB, "small_get", "h2_c1_m16", "rps"),
                                               _get(cfgs, HUB, "small_get", "c16", "rps"))
    # ... and against nginx-h2 and direct-h2 (the same processes spoken to over HTTP/2).
    for other in ("nginx", "direct"):
        out[f"small_get_h2_m16_vs_{other}_h2"] = _ratio(
            _get(cfgs, HUB, "small_get", "h2_c1_m16", "rps"),
            _get(cfgs, other, "small_get", "h2_c1_m16", "rps"))
    for q in ("p50", "p99"):  # c=1 over HTTP/2: added over direct-h2, and against our h1
        hub = _get(cfgs, HUB, "small_get", "h2_c1_m1", f"{q}_ms")
        direct = _get(cfgs, "direct", "small_get", "h2_c1_m1", f"{q}_ms")
        out[f"{q}_added_ms_c1_h2"] = round(hub - direct, 3) \
            if hub is not None and direct is not None else None
        out[f"{q}_ms_c1_h2_vs_h1"] = _ratio(hub, _get(cfgs, HUB, "small_get", "c1", f"{q}_ms"))
    out["large_body_h2_vs_h1"] = _ratio(_get(cfgs, HUB, "large_body_h2", "mb_s"),
                                        _get(cfgs, HUB, "large_body", "mb_s"))
    out["relay_large_body_vs_direct"] = _ratio(_get(cfgs, "relay", *body),
                                               _get(cfgs, "direct", *body))
    out["relay_small_get_c16_vs_direct"] = _ratio(_get(cfgs, "relay", "small_get", "c16", "rps"),
                                                  _get(cfgs, "direct", "small_get", "c16", "rps"))
    out["large_body_vs_relay"] = _ratio(_get(cfgs, HUB, *body), _get(cfgs, "relay", *body))
    # Two bare Python hops (bench.hopfloor): the floor under hubproxy's two processes.
    cpu = ("cpu", "total", "s_per_10k_requests")
    out["floor_cpu_per_10k_vs_kubectl_proxy"] = _ratio(_get(cfgs, FLOOR, *cpu),
                                                       _get(cfgs, "kubectl-proxy", *cpu))
    out["cpu_per_10k_vs_floor"] = _ratio(_get(cfgs, HUB, *cpu), _get(cfgs, FLOOR, *cpu))
    out["floor_small_get_c16_vs_kubectl_proxy"] = _ratio(
        _get(cfgs, FLOOR, "small_get", "c16", "rps"),
        _get(cfgs, "kubectl-proxy", "small_get", "c16", "rps"))
    naive = "aiohttp-proxy"  # measured on small GETs at c=16 and bodies
    out["small_get_c16_vs_aiohttp_proxy"] = _ratio(_get(cfgs, HUB, "small_get", "c16", "rps"),
                                                   _get(cfgs, naive, "small_get", "c16", "rps"))
    out["large_body_vs_aiohttp_proxy"] = _ratio(_get(cfgs, HUB, *body), _get(cfgs, naive, *body))
    cpu = ("cpu", "total", "s_per_10k_requests")
    out["cpu_per_10k_vs_kubectl_proxy"] = _ratio(_get(cfgs, HUB, *cpu),
                                                 _get(cfgs, "kubectl-proxy", *cpu))
    # After (hubproxy) against before (hubproxy-base, --baseline-tree), one run.
    for key, path in (("small_get_c1", ("small_get", "c1", "rps")),
                      ("small_get_c16", ("small_get", "c16", "rps")),
                      ("small_get_h2_m16", ("small_get", "h2_c1_m16", "rps")),
                      ("watch", ("watch", "events_per_s")), ("large_body", body),
                      ("cpu_per_10k", cpu), ("cpu_per_gb", ("cpu", "total", "s_per_gb"))):
        out[f"{key}_vs_base"] = _ratio(_get(cfgs, HUB, *path), _get(cfgs, BASE, *path))
    two = "hubproxy-2w"  # gateway --workers 2 (measured on small GETs and bodies)
    for other, key in (("nginx", "nginx"), ("kubectl-proxy", "kubectl_proxy")):
        out[f"workers2_small_get_c16_vs_{key}"] = _ratio(
            _get(cfgs, two, "small_get", "c16", "rps"),
            _get(cfgs, other, "small_get", "c16", "rps"))
        out[f"workers2_large_body_vs_{key}"] = _ratio(_get(cfgs, two, *body),
                                                      _get(cfgs, other, *body))
    return out


def goals(result: dict[str, Any]) -> dict[str, Any]:
    values = dict(result.get("ratios", {}))
    idle = result.get("idle_watches") or {}
    values["idle_watches_gateway_rss_10k_mib"] = idle.get("gateway_rss_at_10k_mib")
    idle_h2 = result.get("idle_watches_h2") or {}
    values["idle_watches_h2_gateway_rss_10k_mib"] = idle_h2.get("gateway_rss_at_10k_mib")
    values["idle_watches_h2_gateway_bytes_per_watch"] = idle_h2.get("gateway_bytes_per_watch")
    values["idle_watches_h2_agent_bytes_per_watch"] = idle_h2.get("agent_bytes_per_watch")
    values["soak_gateway_rss_drift_pct"] = (result.get("soak") or {}).get("gateway_rss_drift_pct")
    for goal, source in HOTPATH_SOURCES.items():
        values[goal] = values.get(source)
    out = {}
    for key, (text, limit, op) in GOALS_TEXT.items():
        value = values.get(key)
        if value is None:
            out[key] = {"goal": text, "value": None, "limit": limit, "pass": None}
            continue
        ok = (value >= limit if op == ">=" else value <= limit if op == "<="
              else abs(value) <= limit)
        out[key] = {"goal": text, "value": round(value, 3), "limit": limit, "pass": ok}
    return out


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _upstream_seen(seen: dict[str, Any] | None) -> str:
    """What the upstream counted while the watches were open: the agent's protocol."""
    if not seen:
        return "an upstream protocol not recorded"
    held = (f"; it held {seen['held_h1_connections']} HTTP/1.1 connections and "
            f"{seen['held_h2_streams']} h2 streams in all" if "held_h1_connections" in seen
            else "")
    return (f"{seen['protocol']} to the upstream (it saw +{seen['h1_connections']} HTTP/1.1 "
            f"connections, +{seen['h2_connections']} HTTP/2 connections carrying "
            f"+{seen['h2_streams']} streams{held})")


def table(result: dict[str, Any]) -> str:
    cfgs: dict[str, Any] = result.get("configs", {})
    names = [n for n in ("direct", "nginx", "nginx-auto", "kubectl-proxy", "aiohttp-proxy",
                         "hubproxy", BASE, "hubproxy-2w", "relay", FLOOR) if n in cfgs]
    against = ["direct", "nginx", "kubectl-proxy"] + ([BASE] if BASE in cfgs else [])

    def row(label: str, path: tuple[str, ...], digits: int = 0,
            higher_better: bool = True) -> list[str]:
        cells = [_fmt(_get(cfgs, n, *path), digits) for n in names]
        hub = _get(cfgs, HUB, *path)
        ratio_cells = []
        for other in against:
            ratio_cells.append(_fmt(_ratio(hub, _get(cfgs, other, *path)), 2))
        return [label, *cells, *ratio_cells]

    rows = []
    for conc in ("c1", "c16", "c64", "h2_c1_m16"):
        if conc == "h2_c1_m16" and any(conc in cfgs[n]["small_get"] for n in names):
            for key, label in (("h2_c1_m1", "h2 1x1"), ("h2_c1_m16", "h2 1x16")):
                rows.append(row(f"small GET req/s {label}", ("small_get", key, "rps")))
                rows.append(row(f"  p50 ms {label}", ("small_get", key, "p50_ms"), 3))
                rows.append(row(f"  p99 ms {label}", ("small_get", key, "p99_ms"), 3))
        elif any(conc in cfgs[n]["small_get"] for n in names):
            rows.append(row(f"small GET req/s {conc}", ("small_get", conc, "rps")))
            rows.append(row(f"  p50 ms {conc}", ("small_get", conc, "p50_ms"), 3))
            rows.append(row(f"  p99 ms {conc}", ("small_get", conc, "p99_ms"), 3))
    rows += [
        row("large body MB/s (median)", ("large_body", "mb_s"), 1),
        row("  over h2 (curl --http2)", ("large_body_h2", "mb_s"), 1),
        row("watch events/s (median)", ("watch", "events_per_s")),
        row("TTFB ms (new conn, median)", ("ttfb", "ms"), 2),
        row("TTFB ms after handshake", ("ttfb", "after_handshake_ms"), 2),
        row("proxy CPU s / 10k req", ("cpu", "total", "s_per_10k_requests"), 2),
        row("  over h2 1x16", ("small_get", "h2_c1_m16", "cpu_s_per_10k_requests", "total"), 2),
        row("proxy CPU s / GB", ("cpu", "total", "s_per_gb"), 2),
    ]
    headers = ["", *names, "hub/direct", "hub/nginx", "hub/kubectl"] \
        + (["hub/base"] if BASE in cfgs else [])
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in [headers, *rows]]
    lines.append("(direct's CPU row is the upstream's own; kubectl-proxy is plain HTTP on the "
                 "client side; h2 rows: h2load, one connection, in the direct and nginx columns "
                 "direct-h2 and nginx-h2)")

    for name in (HUB, BASE):
        if name not in cfgs:
            continue
        lines.append("")
        lines.append(f"{name} processes:")
        for role in ("gateway", "agent"):
            c = cfgs[name]["cpu"].get(role, {})
            h2cpu = (cfgs[name]["small_get"].get("h2_c1_m16") or {}).get(
                "cpu_s_per_10k_requests") or {}
            lines.append(f"  {role:<8} CPU {_fmt(c.get('s_per_10k_requests'), 2)} s/10k req "
                         f"(h2 1x16: {_fmt(h2cpu.get(role), 2)}), "
                         f"{_fmt(c.get('s_per_gb'), 2)} s/GB, peak RSS "
                         f"{_fmt(cfgs[name]['peak_rss_mib'].get(role), 1)} MiB")
        if name == HUB:  # measured on hubproxy alone: under its heading, not the base's
            lines += _hub_extras(result)
    if "relay" in cfgs:
        r = result.get("ratios", {})
        lines.append(f"relay only (tunnel framing, no HTTP): large body "
                     f"{_fmt(r.get('relay_large_body_vs_direct'), 2)} x direct, small GET c=16 "
                     f"{_fmt(r.get('relay_small_get_c16_vs_direct'), 2)} x direct")

    if FLOOR in cfgs:
        r = result.get("ratios", {})
        lines.append(f"floor (two bare Python hops, TLS on both sides of each): CPU per 10k "
                     f"{_fmt(r.get('floor_cpu_per_10k_vs_kubectl_proxy'), 2)} x kubectl proxy, "
                     f"c=16 {_fmt(r.get('floor_small_get_c16_vs_kubectl_proxy'), 2)} x; "
                     f"hubproxy's CPU per 10k {_fmt(r.get('cpu_per_10k_vs_floor'), 2)} x the floor")

    check = result.get("upstream_check") or {}
    if check:
        parts = [f"{k} {v['rps']:,.0f} req/s" for k, v in check.items()]
        lines.append("upstream check, 1 KiB file c=16: " + ", ".join(parts))
    clients = []
    for n in names:
        c = cfgs[n]
        wrk_util = max((v["client_cpu_util_max"] for v in c["small_get"].values()), default=0)
        curl_util = c["large_body"]["client_cpu_util_max"] or 0
        clients.append(f"{n} wrk {wrk_util:.0%} curl {curl_util:.0%}")
    lines.append("client CPU use (max; < 100% = not saturated): " + ", ".join(clients))
    for name, why in (result.get("skipped") or {}).items():
        lines.append(f"skipped {name}: {why.splitlines()[0][:200]}")

    lines.append("")
    lines.append("goals (issue 5 unless said):")
    for g in (result.get("goals") or {}).values():
        verdict = "n/a " if g["pass"] is None else "PASS" if g["pass"] else "MISS"
        lines.append(f"  {verdict}  {g['goal']} (measured {_fmt(g['value'], 3)})")
    prof = result.get("profile")
    if prof:
        lines.append("")
        lines.append(f"profiles in {prof['dir']}:")
        for label in ("small_get", "small_get_h2", "watch", "large_body"):
            p = prof.get(label) or {}
            if "skipped" in p:
                lines.append(f"  {label}: {p['skipped']}")
                continue
            work = p.get("workload") if isinstance(p.get("workload"), dict) else {}
            unit = work.get("unit", "op")
            for role, top in (p.get("top") or {}).items():
                per_op = (p.get("us_per_op") or {}).get(role)
                cost = f", {per_op} CPU us per {unit}" if per_op is not None else ""
                hot = "; ".join(f"{f} {pct}%" for f, pct in top["self_pct"][:6])
                lines.append(f"  {label} {role} ({top['samples']} samples{cost}) self: {hot}")
                native = (p.get("native") or {}).get(role) or {}
                lines += profiling.stack_lines(native, per_op)
                if "us" in native:
                    lines.append("    by binary (perf): " + "; ".join(
                        f"{group} {us:g} us" for group, us in native["us"]))
                layer_us = dict(top.get("layer_us") or [])
                if layer_us:
                    lines.append("    by layer (py-spy: compiled code counts as the event "
                                 "loop): " + "; ".join(
                                     f"{layer} {us:g} us" for layer, us in layer_us.items()))
    m = result.get("machine", {})
    if m:
        lines.append("")
        lines.append(f"machine: {m.get('nproc')} cpu, {m.get('cpu_model')}, Python "
                     f"{m.get('python')}, uvloop {m.get('uvloop')}, {m.get('openssl')}; "
                     f"nginx {m.get('nginx')}; {m.get('wrk')}; kubectl {m.get('kubectl')}")
    lines.append(f"mode {result.get('mode')}, {result.get('elapsed_s')} s")
    return "\n".join(lines)


def _hub_extras(result: dict[str, Any]) -> list[str]:
    """The hubproxy block's lines measured on hubproxy alone: idle watches, the TLS
    floor, the soak."""
    lines: list[str] = []
    for key, clients in (("idle_watches", "HTTP/1.1"), ("idle_watches_h2", "HTTP/2")):
        idle = result.get(key)
        if idle and "error" not in idle:
            est = " (extrapolated)" if idle.get("extrapolated") else ""
            lines.append(
                f"  idle watches, {clients} clients: {idle['open']}/{idle['requested']} open "
                f"{idle['outcomes']}; gateway {idle['rss_before_mib']['gateway']:.1f} -> "
                f"{idle['rss_with_watches_mib']['gateway']:.1f} MiB "
                f"({idle['gateway_bytes_per_watch']:.0f} B/watch); gateway RSS at "
                f"10k{est}: {idle['gateway_rss_at_10k_mib']:.1f} MiB")
            lines.append(
                f"    agent {idle['rss_before_mib']['agent']:.1f} -> "
                f"{idle['rss_with_watches_mib']['agent']:.1f} MiB "
                f"({idle['agent_bytes_per_watch']:.0f} B/watch) over "
                f"{_upstream_seen(idle.get('upstream_seen'))}")
        elif idle:
            lines.append(f"  idle watches, {clients} clients: FAILED {idle['error'][:300]}")
    floor = result.get("tls_floor")
    if floor and "error" not in floor:
        ossl = floor.get("openssl_bytes_per_connection")
        of_which = f", of which OpenSSL's own state {ossl:.0f} B" if ossl else ""
        lines.append(
            f"  floor: a bare uvloop TLS server holds {floor['bytes_per_connection']:.0f} B "
            f"per idle connection{of_which} ({floor['connections']} connections, one small "
            "request answered each)")
    elif floor:
        lines.append(f"  floor: FAILED {floor['error'][:300]}")
    soak = result.get("soak")
    if soak:
        lines.append(f"  soak {soak['seconds']:g}s: {soak['requests']} mixed requests "
                     f"({soak['errors']} errors), gateway RSS "
                     f"{soak['gateway_rss_baseline_mib']:.1f} -> "
                     f"{soak['gateway_rss_end_mib']:.1f} MiB "
                     f"(drift {soak['gateway_rss_drift_pct']:+.1f}%, span "
                     f"{soak['gateway_rss_span_pct']:.1f}%)")
    return lines
