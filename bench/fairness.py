"""``python -m bench fairness``: one identity floods the gateway; what happens to another's p99?

    python -m bench fairness [--quick | --smoke] [--json FILE] [--seats N] [--flood C]
                             [--seconds S] [--rounds R] [--queue-length N] [--keep]

Issue 14 item 7: "with one identity flooding at c=64, another identity's p99 stays within 2x its
unloaded p99". One run starts, on 127.0.0.1, the benchmark upstream (``bench.upstream``) as the
managed apiserver, kubesim as the hub (TokenReview for three static tokens: the gateway's own, a
*flood* identity and a *victim* identity), and two ``hubproxy gateway`` + ``hubproxy agent``
pairs in front of the same upstream, identical but for fair queuing:

- ``on``: ``--max-executing-requests N`` (``--seats``, default 4): at most N short requests
  execute at once, the rest wait in per-identity fair queues (``gateway.hub.admission.seats``);
- ``off``: ``--max-executing-requests 0``: every request executes at once, in arrival order.

Each round, for each configuration in turn (on, off, on, off, ... so drift hits both):

1. *unloaded*: the victim alone, ``wrk -c1`` small GETs for S seconds: its p50/p99;
2. *loaded*: the flood identity runs ``wrk -c<flood>`` (default 64) small GETs; after one second
   the victim runs the same ``wrk -c1`` for S seconds; then the flood ends. The victim's p99, the
   flood's req/s and how many of its requests were refused (429).

The figure is ``ratio`` = loaded victim p99 / unloaded victim p99 (medians over rounds), per
configuration; the goal is ``ratio <= 2`` with fair queuing on. A table goes to stdout, progress
to stderr, ``--json`` writes everything with machine info.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.configs import (
    CLUSTER,
    POD_PATH,
    Config,
    Lab,
    _wait_ok,
    start_hub_stub,
    start_upstream,
)
from bench.loadgen import WRK, Target, wrk
from bench.procs import LOOPBACK, Procs, free_port
from bench.procstats import tree

FLOOD_USER = "bench-flood"
VICTIM_USER = "bench-victim"
GOAL_RATIO = 2.0


@dataclass
class Plan:
    seconds: float  # each victim measurement
    rounds: int
    flood: int  # flood connections
    seats: int  # --max-executing-requests with fair queuing on


FULL = Plan(10.0, 3, 64, 4)
QUICK = Plan(4.0, 2, 64, 4)
SMOKE = Plan(1.0, 1, 16, 4)


def log(msg: str) -> None:
    print(f"[bench fairness] {msg}", file=sys.stderr, flush=True)


@dataclass
class Tokens:
    flood: str
    victim: str


def start_hub(lab: Lab) -> Tokens:
    """kubesim as the hub, with the gateway's token and two user tokens."""
    tokens = Tokens("flood-" + secrets.token_hex(16), "victim-" + secrets.token_hex(16))
    start_hub_stub(lab, users=[(tokens.flood, FLOOD_USER, "flood-uid", "bench"),
                               (tokens.victim, VICTIM_USER, "victim-uid", "bench")])
    return tokens


@dataclass
class Gateway:
    victim: Config  # how the victim reaches the gateway (its processes, for the logs)
    flood: Target
    health_port: int  # /metrics


def start_gateway(lab: Lab, name: str, seats: int, queue_length: int | None,
                  tokens: Tokens) -> Gateway:
    """``hubproxy gateway`` (fair queuing per ``seats``) + ``hubproxy agent`` -> upstream."""
    front, tunnel, health = free_port(), free_port(), free_port()
    fair = ["--max-executing-requests", str(seats)]
    if queue_length is not None:
        fair += ["--fair-queue-length", str(queue_length)]
    gateway = lab.procs.start(f"gateway-{name}", [
        sys.executable, "-m", "gateway.cli", "gateway",
        "--listen", f"{LOOPBACK}:{front}", "--tunnel-listen", f"{LOOPBACK}:{tunnel}",
        "--health-listen", f"{LOOPBACK}:{health}", "--tls-dir", str(lab.pki / "gateway"),
        "--tunnel-tls-dir", str(lab.pki / "tunnel-server"),
        "--agent-ca", str(lab.pki / "tunnel-ca" / "ca.crt"),
        "--hub-kubeconfig", str(lab.hub_kubeconfig), "--authorize", "none",
        "--token-cache-ttl", "1h", "--max-connections", "30000", "--max-inflight", "30000",
        *fair])
    gateway.wait_for_line("hubproxy gateway ready", 30)
    agent = lab.procs.start(f"agent-{name}", [
        sys.executable, "-m", "gateway.cli", "agent", "--hub", f"{LOOPBACK}:{tunnel}",
        "--cluster", CLUSTER, "--tls-dir", str(lab.pki / "agents" / CLUSTER),
        "--kubeconfig", str(lab.upstream_kubeconfig()), "--health-listen", "off"])
    base = f"https://{LOOPBACK}:{front}/{CLUSTER}"
    ca = str(lab.pki / "gateway" / "ca.crt")
    victim = Config(name, Target(base, ca, tokens.victim),
                    f"gateway --max-executing-requests {seats}",
                    {"gateway": tree(gateway.pid), "agent": [agent.pid]}, [gateway, agent])
    flood = Target(base, ca, tokens.flood)
    _wait_ok(victim)
    _wait_ok(Config(name, flood, "", procs=[gateway, agent]))  # both tokens' reviews cached
    return Gateway(victim, flood, health)


def measure(victim: Config, flood: Target, plan: Plan, work: Path) -> dict[str, Any]:
    """One round on one configuration: the victim alone, then under the flood."""
    unloaded = wrk(victim.target, POD_PATH, connections=1, threads=1, seconds=plan.seconds,
                   workdir=work)
    flood_result: dict[str, Any] = {}

    def run_flood() -> None:
        try:
            flood_result.update(wrk(flood, POD_PATH, connections=plan.flood, threads=2,
                                    seconds=plan.seconds + 2, workdir=work))
        except RuntimeError as exc:
            flood_result["failed"] = str(exc)

    thread = threading.Thread(target=run_flood, daemon=True)
    thread.start()
    time.sleep(1.0)
    loaded = wrk(victim.target, POD_PATH, connections=1, threads=1, seconds=plan.seconds,
                 workdir=work)
    thread.join(plan.seconds + 60)
    if "failed" in flood_result or not flood_result:
        raise RuntimeError(f"the flood's wrk failed: {flood_result.get('failed', 'no result')}")
    return {"unloaded": _victim(unloaded), "loaded": _victim(loaded),
            "flood": {"rps": round(flood_result["rps"], 1),
                      "requests": flood_result["requests"],
                      "refused_429": flood_result["error_detail"].get("err_status", 0),
                      "other_errors": flood_result["errors"]
                      - flood_result["error_detail"].get("err_status", 0),
                      "p50_ms": flood_result["p50_ms"], "p99_ms": flood_result["p99_ms"],
                      "connections": plan.flood}}


def fair_queuing_figures(gateway: Gateway) -> dict[str, float]:
    """The gateway's own fair-queuing counters (``/metrics``): proof the flood was queued."""
    url = f"http://{LOOPBACK}:{gateway.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    figures: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("hubproxy_fair_requests_queued_total ",
                            "hubproxy_fair_rejected_total{")):
            name, _, value = line.rpartition(" ")
            figures[name] = float(value)
    return figures


def _victim(run: dict[str, Any]) -> dict[str, Any]:
    return {k: run[k] for k in ("rps", "requests", "p50_ms", "p99_ms", "max_ms", "errors")}


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    unloaded = statistics.median(r["unloaded"]["p99_ms"] for r in rounds)
    loaded = statistics.median(r["loaded"]["p99_ms"] for r in rounds)
    return {
        "victim_unloaded_p50_ms": statistics.median(r["unloaded"]["p50_ms"] for r in rounds),
        "victim_unloaded_p99_ms": unloaded,
        "victim_loaded_p50_ms": statistics.median(r["loaded"]["p50_ms"] for r in rounds),
        "victim_loaded_p99_ms": loaded,
        "ratio": round(loaded / unloaded, 2) if unloaded else None,
        "victim_errors": sum(r["unloaded"]["errors"] + r["loaded"]["errors"] for r in rounds),
        "flood_rps": statistics.median(r["flood"]["rps"] for r in rounds),
        "flood_refused_429": sum(r["flood"]["refused_429"] for r in rounds),
        "flood_other_errors": sum(r["flood"]["other_errors"] for r in rounds),
        "rounds": rounds,
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"fairness: victim c=1 vs a flood at c={result['plan']['flood']} "
             f"(fair queuing on: --max-executing-requests {result['plan']['seats']})",
             f"{'config':<6} {'unloaded p99':>13} {'loaded p99':>11} {'ratio':>6} "
             f"{'flood req/s':>12} {'flood 429s':>11}"]
    for name, cfg in result["configs"].items():
        lines.append(f"{name:<6} {cfg['victim_unloaded_p99_ms']:>11.2f}ms "
                     f"{cfg['victim_loaded_p99_ms']:>9.2f}ms {cfg['ratio']:>6} "
                     f"{cfg['flood_rps']:>12.0f} {cfg['flood_refused_429']:>11}")
    on = result["configs"]["on"]["ratio"]
    verdict = "PASS" if on is not None and on <= GOAL_RATIO else "MISS"
    lines.append(f"{verdict} victim p99 under flood <= {GOAL_RATIO:g}x unloaded with fair "
                 f"queuing on ({on}x)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if WRK is None or shutil.which("curl") is None:
        print("python -m bench fairness needs wrk and curl: apt-get install -y wrk curl",
              file=sys.stderr)
        return 2
    base = SMOKE if args.smoke else QUICK if args.quick else FULL
    plan = Plan(args.seconds or base.seconds, args.rounds or base.rounds,
                args.flood or base.flood, args.seats or base.seats)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    procs = Procs(root)
    lab = Lab(root, procs)
    try:
        lab.make_certs()
        start_upstream(lab, 1)
        tokens = start_hub(lab)
        configs = {
            "on": start_gateway(lab, "on", plan.seats, args.queue_length, tokens),
            "off": start_gateway(lab, "off", 0, args.queue_length, tokens),
        }
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        for i in range(plan.rounds):
            for name, gateway in configs.items():
                log(f"round {i + 1}/{plan.rounds}: fair queuing {name}")
                rounds[name].append(measure(gateway.victim, gateway.flood, plan, root))
        gateway_figures = {name: fair_queuing_figures(gateway)
                           for name, gateway in configs.items()}
    finally:
        procs.stop_all()
        if args.keep:
            log(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    from bench.gateway import machine_info

    result = {
        "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
        "plan": asdict(plan),
        "queue_length": args.queue_length,
        "configs": {name: {**summarize(r), "gateway_metrics": gateway_figures[name]}
                    for name, r in rounds.items()},
        "goal": {"ratio_max": GOAL_RATIO},
        "machine": machine_info(),
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    on = result["configs"]["on"]["ratio"]
    result["goal"]["on_pass"] = on is not None and on <= GOAL_RATIO
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fairness",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write every figure as JSON here")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="short run (~1 minute)")
    mode.add_argument("--smoke", action="store_true",
                      help="tiny run for tests: 1 round, 1 s, flood c=16, 4 seats")
    parser.add_argument("--seats", type=int, help="--max-executing-requests with fair queuing "
                        "on (default 4)")
    parser.add_argument("--flood", type=int, help="flood connections (default 64; smoke 16)")
    parser.add_argument("--seconds", type=float, help="each victim measurement (default 10)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3)")
    parser.add_argument("--queue-length", type=int,
                        help="--fair-queue-length for both gateways (default: the gateway's)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
