"""This program's version, from the installed package's metadata (``pyproject.toml``).

One source of truth: ``hubproxy --version``, ``hubproxy-creds --version``, the agent's version
in the tunnel SETTINGS and the ``hubproxy_build_info`` metric all read it here.
"""

from __future__ import annotations

import functools
from importlib import metadata

DISTRIBUTION = "hubproxy"


@functools.cache
def version() -> str:
    """``0.1.0``, or ``unknown`` when run from a tree that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
