"""``python -m bench <name> [options]``: run one benchmark (modules imported only when chosen)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "tunnel": "bench.tunnel",
    "gateway": "bench.gateway",
    "fairness": "bench.fairness",  # issue 14: one identity flooding, another's p99
    "ha": "bench.ha",  # issue 13: rollouts, scaling, crashes and a hub outage behind HAProxy
    "hpackdecode": "bench.hpackdecode",  # HPACK decoding, ours against hpack's
    "h2core": "bench.h2core",  # the front door's HTTP/2 connection, ours against h2
    "h2client": "bench.h2client",  # the agent's HTTP/2 connection, ours against h2
    "agentproto": "bench.agentproto",  # the agent's CPU with h1 and h2 to its apiserver
    "fleet": "bench.fleet",  # issue 22: N clusters' agents on one gateway, a reconnect storm
    "kubeaudit": "bench.kubeaudit",  # issue 24: what Kubernetes-format audit costs per request
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
