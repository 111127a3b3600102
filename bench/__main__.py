"""``python -m bench <name> [options]``: run one benchmark (modules imported only when chosen)."""

from __future__ import annotations

import importlib
import sys

# The gateway benchmark (issue 5) joins here as "gateway": "bench.gateway" when it lands.
BENCHMARKS = {"tunnel": "bench.tunnel", "gateway": "bench.gateway"}
# Issue 13: rollouts, scaling, crashes and a hub outage behind HAProxy.
BENCHMARKS["ha"] = "bench.ha"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
