"""Run the managed-cluster agent.

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
