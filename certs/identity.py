"""How a managed cluster's name is written into, and checked for, an agent certificate.

The tunnel reads the cluster of an agent **only** from a URI SAN ``hubproxy://cluster/<name>``
(the CN repeats it for humans and tools that show subjects). This module owns the prefix and
the rule for valid names so that issuing and checking agree.
"""

from __future__ import annotations

import re

CLUSTER_URI_PREFIX = "hubproxy://cluster/"

# Kubernetes IsDNS1123Subdomain: lower-case labels joined by dots, at most 253 characters.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
MAX_NAME_LENGTH = 253
MAX_LABEL_LENGTH = 63


def validate_cluster_name(name: str) -> str:
    """Return ``name`` unchanged if it is a DNS-1123 subdomain, else raise ValueError.

    The message says which rule was broken and repeats the name (cluster names are not
    secrets), so a CLI can print it as is.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("cluster name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"invalid cluster name {name[:40]!r}...: longer than {MAX_NAME_LENGTH} characters"
        )
    if not _SUBDOMAIN.fullmatch(name):
        raise ValueError(
            f"invalid cluster name {name!r}: must be a DNS-1123 subdomain (lower-case letters, "
            "digits, '-' and '.', starting and ending with a letter or digit, e.g. 'cluster1' "
            "or 'prod.eu-west')"
        )
    for label in name.split("."):
        if len(label) > MAX_LABEL_LENGTH:
            raise ValueError(
                f"invalid cluster name {name!r}: label {label[:20]!r}... is longer than "
                f"{MAX_LABEL_LENGTH} characters"
            )
    return name


def cluster_uri(name: str) -> str:
    """The URI SAN that names ``name`` in an agent certificate (name validated)."""
    return CLUSTER_URI_PREFIX + validate_cluster_name(name)
