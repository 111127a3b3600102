"""``python -m bench gateway``: hubproxy against direct, nginx and kubectl proxy, side by side.

    python -m bench gateway [--quick | --smoke] [--json FILE] [--profile [--profile-dir DIR]]
                            [--soak-seconds S] [--idle-watches N] [--only NAME,...]

One run starts, on 127.0.0.1, one fast TLS upstream (``bench.upstream``) and in front of it:

- ``direct``: the client talks TLS to the upstream;
- ``nginx``: nginx as a TLS-terminating reverse proxy (1 worker; ``nginx-auto`` = worker_processes
  auto is also measured on small GETs and large bodies);
- ``kubectl-proxy``: ``kubectl proxy`` (plain HTTP on the client side, as users run it);
- ``aiohttp-proxy``: a naive single-hop aiohttp reverse proxy (``bench.naiveproxy``), measured on
  small GETs at c=16 and large bodies;
- ``hubproxy``: ``hubproxy gateway`` (bearer token, TokenReview against a kubesim hub, cached;
  ``--authorize none``) -> tunnel -> ``hubproxy agent`` -> upstream: the production path;
- ``relay``: the same tunnel and agent with raw TCP relays at both ends (``bench.relayhub`` +
  ``agent --allow-tcp``), the client speaking TLS end to end with the upstream.
- ``floor-2hop``: two ``bench.hopfloor`` processes in series, each terminating TLS on both sides
  and relaying HTTP/1.1 by its framing only: the floor under hubproxy's two hops (issue 26),
  measured on small GETs and large bodies.
- over HTTP/2 (``h2load``, one connection): ``direct-h2`` (the upstream offers ALPN h2, as
  kube-apiserver), ``nginx-h2`` (``listen ... ssl http2``, HTTP/1.1 keep-alive upstream) and
  hubproxy, 16 streams beside wrk's c=16 and one beside its c=1.

Measurements alternate between configurations (A B C D E A B C ...) so drift hits all alike:
small GETs with ``wrk`` at concurrency 1/16/64, large ``pods/log`` bodies and watches with
``curl``, time to first byte, CPU seconds (``/proc``) per GB and per 10k requests, peak RSS; then,
for hubproxy only, RSS with many idle watches (HTTP/2 streams, then HTTP/1.1 connections) through
one agent, the agent's share and what the upstream saw of it, and a mixed-traffic soak; with
``--profile`` py-spy flamegraphs of gateway and agent. A table with ratios goes to stdout; progress
to stderr; ``--json`` writes everything, with machine info.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import configs, profiling
from bench.configs import POD_PATH, Config, Lab
from bench.gateway_report import BASE, HUB, goals, ratios, summarize, table
from bench.loadgen import H2LOAD, WRK, Target, curl, h2load, wrk
from bench.procs import Procs
from bench.procstats import CpuMeter, peak_rss_mib, rss_mib
from bench.upstream import read_stats
from gateway.ops.rlimits import raise_open_file_limit

MiB = 1024 * 1024
LOG_PATH = "/api/v1/namespaces/default/pods/bench/log?bytes={n}"
WATCH_PATH = "/api/v1/namespaces/default/pods?watch=1&events={n}"
ORDER = ("direct", "nginx", "kubectl-proxy", "aiohttp-proxy", "hubproxy", "relay", "floor-2hop")


@dataclass
class Plan:
    wrk_seconds: float
    wrk_rounds: int
    concurrencies: tuple[int, ...]
    body_bytes: int
    body_repeats: int
    watch_events: int
    watch_repeats: int
    ttfb_samples: int
    idle_watches: int
    soak_seconds: float
    profile_seconds: float
    upstream_workers: int


FULL = Plan(5.0, 2, (1, 16, 64), 256 * MiB, 5, 100_000, 3, 20, 10_000, 600.0, 15.0, 2)
QUICK = Plan(2.0, 1, (1, 16, 64), 64 * MiB, 5, 20_000, 7, 8, 2_000, 20.0, 6.0, 2)
SMOKE = Plan(1.0, 1, (1, 16), 4 * MiB, 5, 500, 1, 2, 40, 2.0, 2.0, 1)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# Measurements ---------------------------------------------------------------------------------

def in_turn(cfgs: list[Config], rep: int) -> list[Config]:
    """The configurations in the order of repetition ``rep``: hubproxy and hubproxy-base swap
    places every other repetition, so neither always runs right after the other (a warm cache,
    a neighbour's burst on a shared machine would otherwise favour one side of the A/B)."""
    names = [c.name for c in cfgs]
    if rep % 2 == 0 or HUB not in names or BASE not in names:
        return cfgs
    out = list(cfgs)
    i, j = names.index(HUB), names.index(BASE)
    out[i], out[j] = out[j], out[i]
    return out


def measure_small_gets(cfgs: list[Config], plan: Plan, work: Path,
                       results: dict[str, Any]) -> None:
    """wrk, alternating configurations; CPU of every proxy process during each run."""
    for rnd in range(plan.wrk_rounds):
        for conc in plan.concurrencies:
            for cfg in in_turn(cfgs, rnd):
                if cfg.extra and conc != 16:
                    continue
                meter = CpuMeter(cfg.roles).start()
                run = wrk(cfg.target, POD_PATH, connections=conc, threads=1 if conc == 1 else 2,
                          seconds=plan.wrk_seconds, workdir=work)
                run["cpu_s"] = meter.stop()
                results[cfg.name]["small_get_runs"].setdefault(f"c{conc}", []).append(run)
                log(f"  round {rnd + 1} c={conc:<3} {cfg.name:<14} {run['rps']:>9.0f} req/s  "
                    f"p50 {run['p50_ms']:.3f} ms  p99 {run['p99_ms']:.3f} ms"
                    + (f"  ERRORS {run['error_detail']}" if run["errors"] else ""))
                if conc in (1, 16) and speaks_h2(cfg) and H2LOAD is not None:
                    # Side by side with HTTP/1.1: one HTTP/2 connection, 16 streams beside
                    # c=16, one stream at a time beside c=1 (latency).
                    streams = 16 if conc == 16 else 1
                    meter = CpuMeter(cfg.roles).start()
                    h2run = h2load(cfg.target, POD_PATH, clients=1, streams=streams,
                                   seconds=plan.wrk_seconds)
                    h2run["cpu_s"] = meter.stop()
                    key = "h2_small_get_runs" if streams == 16 else "h2_c1_runs"
                    results[cfg.name].setdefault(key, []).append(h2run)
                    p50, p99 = h2run["p50_ms"], h2run["p99_ms"]
                    log(f"  round {rnd + 1} h2 1x{streams:<2} {cfg.name + '-h2':<14} "
                        f"{h2run['rps']:>9.0f} req/s  p50 {p50 or 0:.3f} ms  p99 {p99 or 0:.3f} "
                        f"ms  ({h2run['protocol']})"
                        + (f"  ERRORS {h2run['errors']}" if h2run["errors"] else ""))


def speaks_h2(cfg: Config) -> bool:
    """``direct-h2``, ``nginx-h2`` and hubproxy over HTTP/2: the same processes as their HTTP/1.1
    twins, which offer ALPN h2 (kubectl proxy serves plain HTTP; the relay is TLS end to end)."""
    return cfg.name in ("direct", "nginx") or cfg.name.startswith("hubproxy")


def measure_bodies(cfgs: list[Config], plan: Plan, results: dict[str, Any]) -> None:
    path = LOG_PATH.format(n=plan.body_bytes)
    for rep in range(plan.body_repeats):
        for cfg in in_turn(cfgs, rep):
            meter = CpuMeter(cfg.roles).start()
            run = curl(cfg.target, path, timeout=300)
            run["cpu_s"] = meter.stop()
            if run["size"] != plan.body_bytes:
                raise RuntimeError(f"{cfg.name}: {run['size']} of {plan.body_bytes} body bytes")
            results[cfg.name]["body_runs"].append(run)
            log(f"  body {rep + 1}/{plan.body_repeats} {cfg.name:<14} "
                f"{run['speed'] / 1e6:8.1f} MB/s  (curl CPU {run['client_cpu_util']:.0%})")
            if cfg.name in (HUB, BASE):  # the same body over HTTP/2, side by side
                h2run = curl(cfg.target, path, timeout=300, http2=True)
                if h2run["size"] != plan.body_bytes:
                    raise RuntimeError(f"{cfg.name} h2: {h2run['size']} body bytes")
                results[cfg.name].setdefault("h2_body_runs", []).append(h2run)
                log(f"  body {rep + 1}/{plan.body_repeats} {cfg.name + ' h2':<14} "
                    f"{h2run['speed'] / 1e6:8.1f} MB/s  (curl CPU {h2run['client_cpu_util']:.0%})")


def measure_watches(cfgs: list[Config], plan: Plan, results: dict[str, Any]) -> None:
    path = WATCH_PATH.format(n=plan.watch_events)
    for rep in range(plan.watch_repeats):
        for cfg in in_turn(cfgs, rep):
            if cfg.extra:
                continue
            run = curl(cfg.target, path, timeout=300)
            streaming = max(run["total"] - run["ttfb"], 1e-6)
            run["events_per_s"] = plan.watch_events / streaming
            results[cfg.name]["watch_runs"].append(run)
            log(f"  watch {rep + 1}/{plan.watch_repeats} {cfg.name:<14} "
                f"{run['events_per_s']:10.0f} events/s")


def measure_ttfb(cfgs: list[Config], plan: Plan, results: dict[str, Any]) -> None:
    for rep in range(plan.ttfb_samples):
        for cfg in in_turn(cfgs, rep):
            if not cfg.extra:
                results[cfg.name]["ttfb_runs"].append(curl(cfg.target, POD_PATH, timeout=30))


def upstream_check(lab: Lab, static: Target | None, plan: Plan, work: Path) -> dict[str, Any]:
    """Our upstream vs nginx serving the same 1 KiB file itself, c=16: who is faster?"""
    out: dict[str, Any] = {}
    direct = Target(f"https://127.0.0.1:{lab.upstream_port}", lab.upstream_ca)
    for name, target, path in (("upstream", direct, "/bench.json"),
                               ("nginx_static", static, "/bench.json")):
        if target is None:
            continue
        run = wrk(target, path, connections=16, threads=2, seconds=plan.wrk_seconds, workdir=work)
        out[name] = {"rps": run["rps"], "p50_ms": run["p50_ms"], "p99_ms": run["p99_ms"],
                     "client_cpu_util": run["client_cpu_util"], "errors": run["errors"]}
        log(f"  {name:<14} {run['rps']:9.0f} req/s (c=16)"
            + (f"  ERRORS {run['errors']} (not a valid comparison)" if run["errors"] else ""))
    return out


def upstream_stats(lab: Lab) -> dict[str, int]:
    return read_stats(lab.upstream_stats, lab.upstream_workers)


def upstream_seen(before: dict[str, int], during: dict[str, int]) -> dict[str, Any]:
    """Connections and streams the upstream gained while the watches were open: how the agent
    reached it (the agent does not say which protocol it negotiated)."""
    h1 = during["h1_open"] - before["h1_open"]
    h2 = during["h2_open"] - before["h2_open"]
    streams = during["h2_streams_open"] - before["h2_streams_open"]
    # The agent may reuse connections its pool kept from earlier watches (no new ones): then
    # what the upstream held during the watches says it.
    held_h1, held_streams = during["h1_open"], during["h2_streams_open"]
    protocol = ("h2" if streams > 0 and streams >= h1 else "h1" if h1 > 0
                else "h2" if held_streams > held_h1 else "h1" if held_h1 > 0 else "?")
    return {"protocol": protocol, "h1_connections": h1, "h2_connections": h2,
            "h2_streams": streams, "held_h1_connections": held_h1,
            "held_h2_connections": during["h2_open"], "held_h2_streams": held_streams}


def idle_watches(lab: Lab, cfg: Config, count: int, hold_timeout: float,
                 h2_connections: int = 0) -> dict[str, Any]:
    """Open ``count`` watches through the gateway from a separate process; RSS before/with them,
    and what the upstream saw (HTTP/1.1 connections or HTTP/2 streams from the agent).
    ``h2_connections``: as HTTP/2 streams over that many connections (0: one HTTP/1.1
    connection per watch)."""
    gw, agent = cfg.roles["gateway"][0], cfg.roles["agent"][0]
    before = {"gateway": rss_mib(gw), "agent": rss_mib(agent)}
    seen_before = upstream_stats(lab)
    token_file = Path(tempfile.mkstemp(prefix="bench-token-")[1])
    token_file.write_text(cfg.target.token or "")
    url = cfg.target.url(WATCH_PATH.format(n=1) + "&hold=1")
    args = [sys.executable, "-m", "bench.loadgen", "idle-watches", url, "--count", str(count),
            "--cafile", cfg.target.cafile or "", "--token-file", str(token_file),
            "--hold", str(hold_timeout + 60), "--h2-connections", str(h2_connections)]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    info: dict[str, Any] = {"requested": count}
    try:
        deadline = time.monotonic() + hold_timeout
        line = ""
        assert proc.stdout is not None and proc.stdin is not None
        while time.monotonic() < deadline:
            # The client prints IDLEJSON once every watch is open or refused.
            ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
            if not ready:
                break
            line = proc.stdout.readline()
            if not line or line.startswith("IDLEJSON "):
                break
        if not line.startswith("IDLEJSON "):
            raise RuntimeError(f"idle-watch client failed: {proc.stderr.read()[-1000:]}")
        info.update(json.loads(line[len("IDLEJSON "):]))
        time.sleep(1.0)  # let buffers settle
        during = {"gateway": rss_mib(gw), "agent": rss_mib(agent)}
        info["upstream_seen"] = upstream_seen(seen_before, upstream_stats(lab))
        info["rss_before_mib"] = before
        info["rss_with_watches_mib"] = during
        opened = max(1, info["open"])
        info["gateway_bytes_per_watch"] = (during["gateway"] - before["gateway"]) * MiB / opened
        info["agent_bytes_per_watch"] = (during["agent"] - before["agent"]) * MiB / opened
        # What 10,000 would cost at the measured per-watch rate (exact when count >= 10,000).
        info["gateway_rss_at_10k_mib"] = (before["gateway"]
                                          + info["gateway_bytes_per_watch"] * 10_000 / MiB)
        info["agent_rss_at_10k_mib"] = (before["agent"]
                                        + info["agent_bytes_per_watch"] * 10_000 / MiB)
        info["extrapolated"] = info["open"] < 10_000
        proc.stdin.write("close\n")
        proc.stdin.flush()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        token_file.unlink(missing_ok=True)
    return info


def tls_floor(lab: Lab, count: int) -> dict[str, Any]:
    """``bench.tlsfloor`` with the gateway's certificate: what TLS alone costs per connection."""
    front = lab.pki / "gateway"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.tlsfloor", "--count", str(count),
             "--cert", str(front / "tls.crt"), "--key", str(front / "tls.key"),
             "--cafile", str(front / "ca.crt")],
            capture_output=True, text=True, timeout=600, start_new_session=True)
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def soak(cfg: Config, seconds: float, work: Path) -> dict[str, Any]:
    """Mixed traffic (GETs, watches, 1 MiB logs) for ``seconds``, gateway/agent RSS every 0.5 s."""
    prefix = urlsplit(cfg.target.base).path  # wrk's Lua paths are absolute: /<cluster>/...
    origin = Target(cfg.target.base[:len(cfg.target.base) - len(prefix)], cfg.target.cafile,
                    cfg.target.token)
    paths = [prefix + p for p in [POD_PATH] * 8 + [WATCH_PATH.format(n=200),
                                                   LOG_PATH.format(n=MiB)]]
    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["wrk"] = wrk(origin, paths[0], connections=16, threads=2, seconds=seconds,
                             workdir=work, paths=paths)
        except Exception as exc:  # reported, not raised from a thread
            box["error"] = str(exc)

    gw, agent = cfg.roles["gateway"][0], cfg.roles["agent"][0]
    samples: list[tuple[float, float, float]] = []
    thread = threading.Thread(target=load, daemon=True)
    start = time.monotonic()
    thread.start()
    while thread.is_alive() and time.monotonic() - start < seconds + 40:
        samples.append((round(time.monotonic() - start, 2), rss_mib(gw), rss_mib(agent)))
        time.sleep(0.5)
    thread.join(5)
    if "error" in box:
        raise RuntimeError(f"soak load failed: {box['error']}")
    gw_rss = [s[1] for s in samples]
    q = max(1, len(gw_rss) // 4)
    baseline = statistics.median(gw_rss[q:2 * q]) if len(gw_rss) >= 4 else gw_rss[0]
    end = statistics.median(gw_rss[-q:])
    tail = gw_rss[q:]
    return {
        "seconds": seconds, "requests": box["wrk"]["requests"], "rps": box["wrk"]["rps"],
        "errors": box["wrk"]["errors"], "gateway_rss_baseline_mib": baseline,
        "gateway_rss_end_mib": end, "gateway_rss_drift_pct": 100 * (end - baseline) / baseline,
        "gateway_rss_span_pct": 100 * (max(tail) - min(tail)) / baseline,
        "gateway_rss_max_mib": max(gw_rss), "agent_rss_end_mib": statistics.median(
            [s[2] for s in samples][-q:]), "samples": samples,
    }


PROFILE_WATCH_EVENTS = 20_000  # events per watch in the profile's watch workload


def run_profile(cfg: Config, plan: Plan, outdir: Path, work: Path) -> dict[str, Any]:
    """py-spy on the gateway and the agent during each workload in turn (small GETs at c=16
    over HTTP/1.1, the same as 16 streams of one HTTP/2 connection, watches of 20,000 small
    events one after the other, large bodies), with each process's CPU µs per request, per
    watch event or per MB (see :func:`bench.profiling.record`)."""
    pids = {role: pids[0] for role, pids in cfg.roles.items()}
    out: dict[str, Any] = {"dir": str(outdir)}
    seconds = plan.profile_seconds

    def small_gets() -> dict[str, Any]:
        run = wrk(cfg.target, POD_PATH, connections=16, threads=2, seconds=seconds,
                  workdir=work)
        return {"ops": run["requests"], "unit": "request", "rps": run["rps"]}

    log(f"profile: small GETs c=16 for {seconds:g}s (py-spy on gateway, agent)")
    out["small_get"] = profiling.record(pids, seconds, outdir, "small-get", small_gets)
    if H2LOAD is not None:  # the same GETs as 16 streams of one HTTP/2 connection
        def small_gets_h2() -> dict[str, Any]:
            run = h2load(cfg.target, POD_PATH, clients=1, streams=16, seconds=seconds)
            return {"ops": run["requests"], "unit": "request", "rps": run["rps"]}

        log(f"profile: small GETs over HTTP/2 (h2load 1x16) for {seconds:g}s")
        out["small_get_h2"] = profiling.record(pids, seconds, outdir, "small-get-h2",
                                               small_gets_h2)

    def watches() -> dict[str, Any]:
        end, events, streaming = time.monotonic() + seconds, 0, 0.0
        while time.monotonic() < end:
            run = curl(cfg.target, WATCH_PATH.format(n=PROFILE_WATCH_EVENTS), timeout=120)
            events += PROFILE_WATCH_EVENTS
            streaming += max(run["total"] - run["ttfb"], 1e-6)
        return {"ops": events, "unit": "watch event", "events_per_s": events / streaming}

    log(f"profile: watches of {PROFILE_WATCH_EVENTS} events for {seconds:g}s")
    out["watch"] = profiling.record(pids, seconds, outdir, "watch", watches)
    log(f"profile: large bodies for {seconds:g}s")

    def bodies() -> dict[str, Any]:
        end, total = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            total += curl(cfg.target, LOG_PATH.format(n=plan.body_bytes), timeout=120)["size"]
        return {"ops": total / 1e6, "unit": "MB", "bytes": total}

    out["large_body"] = profiling.record(pids, seconds, outdir, "large-body", bodies)
    return out


# Orchestration --------------------------------------------------------------------------------

def start_configs(lab: Lab, wanted: set[str], skipped: dict[str, str], log_level: str,
                  workers: int, idle_watches: int = 0,
                  baseline_tree: Path | None = None) -> tuple[list[Config], Target | None]:
    cfgs: list[Config] = []
    static = None
    missing = configs.missing_tools()
    cfgs.append(configs.start_upstream(lab, workers))
    starters = {
        "nginx": lambda: configs.start_nginx(lab),
        "kubectl-proxy": lambda: configs.start_kubectl_proxy(lab),
        "aiohttp-proxy": lambda: configs.start_aiohttp_proxy(lab),
        # Each idle watch holds an apiserver connection in the agent (default cap 2048).
        "hubproxy": lambda: configs.start_hubproxy(
            lab, log_level, upstream_connections=max(2048, idle_watches + 1024)),
        "relay": lambda: configs.start_relay(lab),
        "floor-2hop": lambda: configs.start_hop_floor(lab),
    }
    for name in ORDER[1:]:
        if name not in wanted:
            continue
        if name in missing:
            skipped[name] = missing[name]
            log(f"skip {name}: {missing[name]}")
            continue
        try:
            started = starters[name]()
        except Exception as exc:  # one broken configuration must not hide the others
            skipped[name] = f"did not start: {str(exc)[:2000]}"
            log(f"skip {name}: {skipped[name]}")
            continue
        if name == "nginx":
            cfg, static = started  # type: ignore[misc]
            cfgs.append(cfg)
            if "nginx-auto" in wanted:
                with contextlib.suppress(Exception):
                    cfgs.append(configs.start_nginx(lab, "auto", "nginx-auto")[0])
        elif name == "hubproxy" and baseline_tree is not None:
            cfgs.append(started)  # type: ignore[arg-type]
            log(f"started {cfgs[-1].name}: {cfgs[-1].note}")
            try:
                # Measured on every workload, beside hubproxy: the before of a change.
                cfgs.append(configs.start_hubproxy(
                    lab, log_level, upstream_connections=max(2048, idle_watches + 1024),
                    name=BASE, code_tree=baseline_tree, extra=False))
                cfgs[-1].note += f"; the code of {baseline_tree}"
            except Exception as exc:
                skipped[BASE] = f"did not start: {str(exc)[:2000]}"
                log(f"skip {BASE}: {skipped[BASE]}")
                continue
        elif name == "hubproxy" and "hubproxy-2w" in wanted:
            cfgs.append(started)  # type: ignore[arg-type]
            try:
                cfgs.append(configs.start_hubproxy(lab, log_level, workers=2,
                                                   name="hubproxy-2w"))
            except Exception as exc:
                skipped["hubproxy-2w"] = f"did not start: {str(exc)[:2000]}"
        else:
            cfgs.append(started)  # type: ignore[arg-type]
        log(f"started {cfgs[-1].name}: {cfgs[-1].note}")
    return cfgs, static


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        import uvloop
        uv: str | None = uvloop.__version__
    except ImportError:
        uv = None
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "kernel": platform.release(), "uvloop": uv, "openssl": ssl.OPENSSL_VERSION,
            **configs.tool_versions()}


def run_all(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    wanted = (set(args.only.split(",")) if args.only
              else set(ORDER) | {"nginx-auto", "hubproxy-2w"})
    if args.smoke and not args.only:
        wanted = {"direct", "hubproxy"}
    raise_open_file_limit()
    skipped: dict[str, str] = {}
    root = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    procs = Procs(root)
    lab = Lab(root, procs)
    out: dict[str, Any] = {"skipped": skipped, "logs": str(root)}
    try:
        lab.make_certs()
        count = args.idle_watches if args.idle_watches is not None else plan.idle_watches
        baseline = Path(args.baseline_tree).resolve() if args.baseline_tree else None
        cfgs, static = start_configs(lab, wanted, skipped, args.log_level,
                                     plan.upstream_workers, count, baseline)
        results: dict[str, Any] = {
            c.name: {"note": c.note, "roles": {r: list(p) for r, p in c.roles.items()},
                     "small_get_runs": {}, "body_runs": [], "watch_runs": [], "ttfb_runs": []}
            for c in cfgs}
        log("upstream check (is our upstream faster than nginx serving the file itself?):")
        out["upstream_check"] = upstream_check(lab, static, plan, root)
        log(f"small GETs ({', '.join(f'c={c}' for c in plan.concurrencies)}), wrk "
            f"{plan.wrk_seconds:g}s each, {plan.wrk_rounds} round(s):")
        measure_small_gets(cfgs, plan, root, results)
        log(f"large bodies ({plan.body_bytes // MiB} MiB pods/log, curl):")
        measure_bodies(cfgs, plan, results)
        log(f"watches ({plan.watch_events} events, curl):")
        measure_watches(cfgs, plan, results)
        log("time to first byte (fresh connection each, curl):")
        measure_ttfb(cfgs, plan, results)
        for cfg in cfgs:
            results[cfg.name]["peak_rss_mib"] = {
                role: sum(peak_rss_mib(p) for p in pids) for role, pids in cfg.roles.items()}
        hub = next((c for c in cfgs if c.name == "hubproxy"), None)
        if hub is not None:
            seconds = args.soak_seconds if args.soak_seconds is not None else plan.soak_seconds
            if seconds > 0:
                log(f"soak: {seconds:g}s mixed traffic through hubproxy, sampling RSS:")
                out["soak"] = soak(hub, seconds, root)
                s = out["soak"]
                log(f"  {s['requests']} requests, gateway RSS {s['gateway_rss_baseline_mib']:.1f}"
                    f" -> {s['gateway_rss_end_mib']:.1f} MiB ({s['gateway_rss_drift_pct']:+.1f}%)")
            # After the soak: the watches' memory, once freed, would otherwise leave the heap
            # room that hides growth during the soak.
            idle_protocols = args.idle_protocols.split(",")
            if count > 0 and "h2" in idle_protocols:
                # First: the HTTP/1.1 watches' freed pages would stay in the heap and hide
                # the h2 cost (the h1 figure after these is the absolute RSS all the same).
                h2_connections = max(1, count // 100)
                log(f"idle watches over HTTP/2: {count} as streams of {h2_connections} "
                    "connections:")
                try:
                    out["idle_watches_h2"] = idle_watches(lab, hub, count, 240, h2_connections)
                except Exception as exc:
                    out["idle_watches_h2"] = {"error": str(exc)[:2000]}
                log(f"  {json.dumps(out['idle_watches_h2'])[:600]}")
            if count > 0 and "h1" in idle_protocols:
                log(f"idle watches: {count} through the gateway and one agent:")
                try:
                    out["idle_watches"] = idle_watches(lab, hub, count, 240)
                except Exception as exc:
                    out["idle_watches"] = {"error": str(exc)[:2000]}
                log(f"  {json.dumps({k: v for k, v in out['idle_watches'].items()})[:600]}")
            if count > 0:
                log(f"idle TLS floor: {count} connections to a bare uvloop TLS server:")
                out["tls_floor"] = tls_floor(lab, count)
                log(f"  {json.dumps(out['tls_floor'])[:300]}")
            results["hubproxy"]["peak_rss_after_idle_and_soak_mib"] = {
                role: peak_rss_mib(pids[0]) for role, pids in hub.roles.items()}
            if args.profile:
                outdir = Path(args.profile_dir or root / "profiles")
                out["profile"] = run_profile(hub, plan, outdir, root)
        out["configs"] = {name: summarize(r, plan.body_bytes) for name, r in results.items()}
        out["raw"] = results
    finally:
        procs.stop_all()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="write every figure as JSON here")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="short run (< 2 minutes)")
    mode.add_argument("--smoke", action="store_true",
                      help="tiny run for tests: direct + hubproxy only, a few seconds")
    parser.add_argument("--profile", action="store_true",
                        help="also record py-spy profiles/flamegraphs of gateway and agent")
    parser.add_argument("--profile-dir", metavar="DIR",
                        help="where profiles go (default: a folder printed at the end)")
    parser.add_argument("--soak-seconds", type=float,
                        help="mixed-traffic soak length (default 600, --quick 20)")
    parser.add_argument("--idle-watches", type=int,
                        help="idle watches to hold open (default 10000, --quick 2000)")
    parser.add_argument("--idle-protocols", default="h1,h2", metavar="LIST",
                        help="idle watches over h1 (one HTTP/1.1 connection each), h2 (streams "
                        "of one HTTP/2 connection per 100 watches) or both (default: "
                        "%(default)s; one alone gives a figure the other's heap does not blur)")
    parser.add_argument("--only", metavar="NAMES",
                        help=f"comma-separated subset of {','.join(ORDER)},nginx-auto,"
                        "hubproxy-2w (gateway --workers 2)")
    parser.add_argument("--baseline-tree", metavar="DIR",
                        help="also measure the gateway and agent of another checkout (e.g. a "
                        "git worktree of main), as the column hubproxy-base, on every workload "
                        "beside hubproxy: a change's before and after in one run")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"],
                        help="gateway/agent log level (default info: production, audit lines)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    parser.add_argument("--plot", metavar="DIR",
                        help="also write PNG charts of the comparison to DIR (needs matplotlib: "
                        "pip install -e '.[bench]')")


def run(args: argparse.Namespace) -> int:
    if WRK is None or shutil.which("curl") is None:
        print("python -m bench gateway needs wrk and curl: apt-get install -y wrk curl "
              "(and nginx-light for the nginx configuration)", file=sys.stderr)
        return 2
    if args.plot:
        from bench.plots import _pyplot

        _pyplot()  # no matplotlib: say so now, not after a long run
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.baseline_tree:  # an A/B: both orders of every measurement (see in_turn)
        plan = replace(plan, wrk_rounds=max(2, plan.wrk_rounds),
                       watch_repeats=max(2, plan.watch_repeats))
    if args.profile and args.profile_dir is None:
        args.profile_dir = tempfile.mkdtemp(prefix="bench-gateway-profiles-")
    started = time.monotonic()
    result = run_all(args, plan)
    result["ratios"] = ratios(result.get("configs", {}))
    result["goals"] = goals(result)
    result["mode"] = "smoke" if args.smoke else "quick" if args.quick else "full"
    result["plan"] = asdict(replace(plan))
    result["machine"] = machine_info()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        log(f"wrote {args.json}")
    if args.plot:
        from bench.plots import gateway_charts

        for chart in gateway_charts(result, args.plot):
            log(f"wrote {chart}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gateway",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
