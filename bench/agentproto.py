"""``python -m bench agentproto``: what the agent's protocol to its apiserver costs, side by side.

One upstream (``bench.upstream``, ALPN ``h2`` and ``http/1.1`` as kube-apiserver) and, in
front of it, one ``hubproxy gateway`` + ``hubproxy agent`` stack per ``--apiserver-protocol``
asked for (default ``h1`` and ``h2``), identical otherwise. In turns (A B A B ...), each round:

- small GETs, ``wrk`` at c=16 for ``--seconds``;
- one watch of ``--events`` small events, ``curl``;
- one large body (a pod log of ``--body-mib`` MiB, streamed without a length), ``curl``.

It prints the CPU seconds per 10k small GETs, the CPU µs per watch event and the CPU seconds
per GB of each agent (and gateway), from ``/proc``, medians over ``--rounds``, the agents'
ratios to the first protocol, and the large body's MB/s. The throughput of one stack is no
guide on a shared machine; CPU per request is.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import configs
from bench.configs import POD_PATH, Lab
from bench.loadgen import WRK, curl, wrk
from bench.procs import Procs
from bench.procstats import CpuMeter
from gateway.ops.rlimits import raise_open_file_limit

WATCH_PATH = "/api/v1/namespaces/default/pods?watch=1&events={n}"
LOG_PATH = "/api/v1/namespaces/default/pods/bench/log?bytes={n}"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_open_file_limit()
    root = Path(tempfile.mkdtemp(prefix="bench-agentproto-"))
    procs = Procs(root)
    lab = Lab(root, procs)
    protocols = args.protocols.split(",")
    samples: dict[str, dict[str, list[float]]] = {
        p: {"agent_s_per_10k": [], "gateway_s_per_10k": [], "rps": [],
            "agent_us_per_event": [], "gateway_us_per_event": [], "events_per_s": [],
            "agent_s_per_gb": [], "gateway_s_per_gb": [], "body_mb_s": []}
        for p in protocols}
    try:
        lab.make_certs()
        configs.start_upstream(lab, 2)
        stacks = {p: configs.start_hubproxy(lab, "info", name=f"hubproxy-{p}",
                                            agent_args=("--apiserver-protocol", p))
                  for p in protocols}
        for rnd in range(args.rounds):
            for p, cfg in stacks.items():
                meter = CpuMeter(cfg.roles).start()
                result = wrk(cfg.target, POD_PATH, connections=16, threads=2,
                             seconds=args.seconds, workdir=root)
                cpu = meter.stop()
                n = max(1, result["requests"])
                s = samples[p]
                s["agent_s_per_10k"].append(cpu["agent"] * 1e4 / n)
                s["gateway_s_per_10k"].append(cpu["gateway"] * 1e4 / n)
                s["rps"].append(result["rps"])
                meter = CpuMeter(cfg.roles).start()
                watch = curl(cfg.target, WATCH_PATH.format(n=args.events), timeout=300)
                cpu = meter.stop()
                s["agent_us_per_event"].append(cpu["agent"] * 1e6 / args.events)
                s["gateway_us_per_event"].append(cpu["gateway"] * 1e6 / args.events)
                s["events_per_s"].append(args.events / max(watch["total"] - watch["ttfb"], 1e-6))
                meter = CpuMeter(cfg.roles).start()
                body = curl(cfg.target, LOG_PATH.format(n=args.body_mib << 20), timeout=300)
                cpu = meter.stop()
                gb = max(body["size"], 1) / 1e9
                s["agent_s_per_gb"].append(cpu["agent"] / gb)
                s["gateway_s_per_gb"].append(cpu["gateway"] / gb)
                s["body_mb_s"].append(body["size"] / 1e6 / max(body["total"], 1e-6))
                log(f"  round {rnd + 1} {p:<4} GETs {result['rps']:7.0f} req/s, agent "
                    f"{s['agent_s_per_10k'][-1]:.2f} s/10k; watch {s['events_per_s'][-1]:8.0f} "
                    f"events/s, agent {s['agent_us_per_event'][-1]:.1f} us/event; body "
                    f"{s['body_mb_s'][-1]:.0f} MB/s, agent {s['agent_s_per_gb'][-1]:.2f} s/GB")
    finally:
        procs.stop_all()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return {p: {k: statistics.median(v) for k, v in s.items()} for p, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench agentproto", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocols", default="h1,h2",
                        help="--apiserver-protocol of each stack (default h1,h2)")
    parser.add_argument("--rounds", type=int, default=4, help="default 4")
    parser.add_argument("--seconds", type=float, default=5.0, help="wrk run (default 5)")
    parser.add_argument("--events", type=int, default=20_000, help="watch events (default 20000)")
    parser.add_argument("--body-mib", type=int, default=64, help="large body (default 64)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    if WRK is None or shutil.which("curl") is None:
        print("needs wrk and curl (apt-get install -y wrk curl)", file=sys.stderr)
        return 2
    result = run(args)
    first = next(iter(result.values()))

    def ratio(value: float, reference: float) -> float:
        return value / reference if reference else float("nan")

    print(f"{'protocol':<9}{'agent s/10k GETs':>17}{'ratio':>7}{'gateway s/10k':>15}"
          f"{'req/s':>8}{'agent us/event':>16}{'ratio':>7}{'gateway us/event':>18}"
          f"{'events/s':>10}{'agent s/GB':>12}{'ratio':>7}{'gateway s/GB':>14}{'MB/s':>7}")
    for p, r in result.items():
        print(f"{p:<9}{r['agent_s_per_10k']:>17.2f}"
              f"{ratio(r['agent_s_per_10k'], first['agent_s_per_10k']):>7.2f}"
              f"{r['gateway_s_per_10k']:>15.2f}{r['rps']:>8.0f}{r['agent_us_per_event']:>16.2f}"
              f"{ratio(r['agent_us_per_event'], first['agent_us_per_event']):>7.2f}"
              f"{r['gateway_us_per_event']:>18.2f}{r['events_per_s']:>10.0f}"
              f"{r['agent_s_per_gb']:>12.2f}"
              f"{ratio(r['agent_s_per_gb'], first['agent_s_per_gb']):>7.2f}"
              f"{r['gateway_s_per_gb']:>14.2f}{r['body_mb_s']:>7.0f}")
    return 0
