"""The command line of the bench's stand-in proxies (``bench.naiveproxy``, ``bench.hopfloor``)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Coroutine
from typing import Any


def proxy_arguments(prog: str, description: str,
                    argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of a bench proxy: TLS on ``--listen``, a TLS ``--upstream`` URL."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, help="HOST:PORT (TLS)")
    parser.add_argument("--cert", required=True, help="server certificate (PEM)")
    parser.add_argument("--key", required=True, help="server key (PEM)")
    parser.add_argument("--upstream", required=True, help="https://HOST:PORT")
    parser.add_argument("--upstream-ca", required=True, help="CA bundle for the upstream")
    return parser.parse_args(argv)


def run_until_interrupted(main: Coroutine[Any, Any, None]) -> int:
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(main)
    return 0
