"""Run kubesim, a kube-apiserver stand-in for tests and demos (not a production component).

Not implemented yet: this placeholder exits 2 and says so rather than pretend to work.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    print("hubproxy: this command is not implemented yet", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubesim", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
