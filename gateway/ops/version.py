"""This program's version, from the installed package's metadata (``pyproject.toml``).

One source of truth: ``hubproxy --version``, ``hubproxy-creds --version``, the agent's version
in the tunnel SETTINGS and the ``hubproxy_build_info`` metric all read it here.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

DISTRIBUTION = "hubproxy"


@functools.cache
def version() -> str:
    """``0.1.0``, or ``unknown`` when run from a tree that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def pack_release(text: str) -> int:
    """``1.2.3`` (and ``1.2.3.dev4``: suffixes are dropped) -> the tunnel's AGENT_VERSION
    value ``major << 24 | minor << 16 | patch``; 0 (not sent) if it does not fit."""
    match = _RELEASE.match(text)
    if match is None:
        return 0
    major, minor, patch = (int(part) for part in match.groups())
    if major > 255 or minor > 255 or patch > 65535:
        return 0
    return (major << 24) | (minor << 16) | patch


def release_name(packed: int) -> str | None:
    """The inverse of :func:`pack_release`; None for 0 (an agent that did not say)."""
    if not packed:
        return None
    return f"{packed >> 24}.{(packed >> 16) & 0xFF}.{packed & 0xFFFF}"
