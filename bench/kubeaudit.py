"""``python -m bench kubeaudit``: what Kubernetes-format audit costs the gateway per request.

Two measurements, each off and on side by side:

* **in process** -- µs to record one finished request (``AuditTrail.request_done``) for a
  typical admitted GET: the gateway's JSON line alone (as deployed) against the JSON line plus an
  ``audit.k8s.io/v1`` event written to a log file; best of ``--repeat`` runs of ``--events``
  requests, the per-loop-turn writes included.
* **end to end** -- two ``hubproxy gateway`` + ``hubproxy agent`` pairs in front of the bench
  upstream, as ``bench gateway``'s ``hubproxy`` config runs them, one as deployed and one also
  with ``--audit-log-path``; ``wrk`` small GETs at c=16 through each, alternating A B A B for
  ``--rounds`` rounds; req/s and the gateway's CPU per request (ms of CPU / requests).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench import configs
from bench.configs import POD_PATH, Lab
from bench.loadgen import wrk
from bench.procs import Procs
from bench.procstats import CpuMeter


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def in_process(events: int, repeat: int, workdir: Path) -> dict[str, float]:
    """µs per request of the audit trail alone: JSON line, and JSON line + Kubernetes event."""
    from gateway.hub.admission.auth import UserInfo
    from gateway.hub.admission.chain import Admitted
    from gateway.hub.audittrail import AuditTrail, KubeAudit
    from gateway.ops import audit
    from gateway.ops.k8saudit.backends import LogBackend
    from gateway.wire.http1 import parse_request_head
    from tunnel.targets import KubeAPITarget

    head = parse_request_head(
        b"GET /bench/api/v1/namespaces/default/pods/bench HTTP/1.1\r\nHost: gw:9092\r\n"
        b"User-Agent: kubectl/v1.36.0 (linux/amd64) kubernetes/abcdef\r\n"
        b"Authorization: Bearer bench-0123456789abcdef\r\nAccept: application/json\r\n\r\n")
    user = UserInfo("system:serviceaccount:bench:client", "6f1c-uid",
                    ("system:serviceaccounts", "system:serviceaccounts:bench",
                     "system:authenticated"),
                    {"authentication.kubernetes.io/credential-id": ("JTI=0123",)})
    admitted = Admitted("bench", None, KubeAPITarget(), b"", b"",  # type: ignore[arg-type]
                        user.username, False, user_info=user,
                        user_agent=head.get(b"user-agent") or b"")
    sink = open(os.devnull, "w")  # noqa: SIM115 - closed below
    audit.install_writer(audit.AuditWriter(sink))

    async def run(trail: AuditTrail) -> float:
        started = time.perf_counter()
        for i in range(events):
            trail.request_done(request_id=f"{i:016x}", head=head, admitted=admitted,
                               status=200, bytes_in=0, bytes_out=1100, duration=0.0012,
                               stream=False, protocol="h1", source_ips=("203.0.113.7",),
                               message=None, started=time.monotonic())
            if i % 16 == 15:
                await asyncio.sleep(0)  # a loop turn: the per-turn writes happen
        await asyncio.sleep(0)
        return (time.perf_counter() - started) / events * 1e6

    results: dict[str, list[float]] = {"json_line": [], "json_line+k8s_event": []}
    log_path = workdir / "inprocess-audit.log"
    for _ in range(repeat):
        results["json_line"].append(asyncio.run(run(AuditTrail(lines=True))))
        backend = LogBackend.to_file(str(log_path))
        trail = AuditTrail(lines=True, kube=KubeAudit([backend]))
        results["json_line+k8s_event"].append(asyncio.run(run(trail)))
        asyncio.run(backend.close())
        log_path.unlink()
    audit.install_writer(None)
    sink.close()
    return {name: min(samples) for name, samples in results.items()}


def end_to_end(rounds: int, seconds: float, workdir: Path) -> dict[str, Any]:
    procs = Procs(workdir)
    lab = Lab(workdir, procs)
    try:
        lab.make_certs()
        configs.start_upstream(lab, 2)
        off = configs.start_hubproxy(lab)
        on = configs.start_hubproxy(lab, name="hubproxy-k8saudit", gateway_args=(
            "--audit-log-path", str(workdir / "k8s-audit.log")))
        runs: dict[str, list[dict[str, float]]] = {off.name: [], on.name: []}
        for rnd in range(rounds):
            for cfg in (off, on):
                meter = CpuMeter(cfg.roles).start()
                run = wrk(cfg.target, POD_PATH, connections=16, threads=2, seconds=seconds,
                          workdir=workdir)
                cpu = meter.stop()
                sample = {"rps": run["rps"],
                          "gateway_cpu_us": cpu["gateway"] / run["requests"] * 1e6,
                          "agent_cpu_us": cpu["agent"] / run["requests"] * 1e6,
                          "errors": run["errors"]}
                runs[cfg.name].append(sample)
                log(f"  round {rnd + 1} {cfg.name:<18} {sample['rps']:>8.0f} req/s  gateway "
                    f"{sample['gateway_cpu_us']:.1f} us CPU/request")
        events = len((workdir / "k8s-audit.log").read_text(encoding="ascii").splitlines())
        return {"runs": runs, "k8s_events_written": events,
                "median": {name: {key: median(s[key] for s in samples)
                                  for key in ("rps", "gateway_cpu_us", "agent_cpu_us")}
                           for name, samples in runs.items()}}
    finally:
        procs.stop_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench kubeaudit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20000, help="in process (default 20000)")
    parser.add_argument("--repeat", type=int, default=5, help="in process (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="end to end (default 3)")
    parser.add_argument("--seconds", type=float, default=10, help="per wrk run (default 10)")
    parser.add_argument("--smoke", action="store_true", help="a few seconds in all")
    args = parser.parse_args(argv)
    if args.smoke:
        args.events, args.repeat, args.rounds, args.seconds = 500, 1, 1, 1
    workdir = Path(tempfile.mkdtemp(prefix="bench-kubeaudit-"))
    log(f"in process: {args.events} requests, best of {args.repeat}")
    per_event = in_process(args.events, args.repeat, workdir)
    for name, us in per_event.items():
        log(f"  {name:<22} {us:6.2f} us per request")
    added = per_event["json_line+k8s_event"] - per_event["json_line"]
    log(f"  the Kubernetes event adds {added:.2f} us per request")
    log(f"end to end: wrk c=16 small GETs, {args.rounds} round(s) of {args.seconds:g}s each:")
    e2e = end_to_end(args.rounds, args.seconds, workdir)
    for name, m in e2e["median"].items():
        log(f"  median {name:<18} {m['rps']:>8.0f} req/s  gateway {m['gateway_cpu_us']:.1f} us "
            f"CPU/request")
    log(f"  {e2e['k8s_events_written']} Kubernetes events written")
    return 0
