"""hubproxy-creds: a client-go exec credential plugin for reaching clusters through the gateway.

Not implemented yet (ClusterProfile issue): it exits 2 and says so rather than pretend to work.
"""

from __future__ import annotations

import sys


def main() -> int:
    print("hubproxy-creds: not implemented yet", file=sys.stderr)
    return 2
