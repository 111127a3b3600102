"""How a managed cluster's name is written into, and checked for, an agent certificate.

The tunnel reads the cluster of an agent **only** from a URI SAN ``hubproxy://cluster/<name>``
(the CN repeats it for humans and tools that show subjects). The prefix and the rule for valid
names come from ``tunnel.identity``, so issuing and checking cannot disagree.
"""

from __future__ import annotations

from tunnel.identity import CLUSTER_URI_PREFIX, validate_cluster_name

__all__ = ["CLUSTER_URI_PREFIX", "cluster_uri", "validate_cluster_name"]


def cluster_uri(name: str) -> str:
    """The URI SAN that names ``name`` in an agent certificate (name validated)."""
    return CLUSTER_URI_PREFIX + validate_cluster_name(name)
