"""The ``TunnelConnected`` condition on a ``ManagedClusterAddOn`` (pure).

Open Cluster Management reports an add-on's health from its agent's Deployment. That says the
agent runs, not that its tunnel to us is up; this condition says the second thing, so an
operator (or a Placement, or an alert on ``status.conditions``) sees an add-on whose agent
cannot reach the hub.

:func:`status_patch` computes the merge patch that makes the add-on's ``status.conditions``
carry our condition, leaving every other condition as it is, or None when nothing changes.
``lastTransitionTime`` moves only when the status does, as Kubernetes conventions require. The
patch carries ``metadata.resourceVersion``, so a concurrent writer (the addon-manager) makes it
fail with 409 instead of being overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "addon.open-cluster-management.io"
VERSION = "v1alpha1"
PLURAL = "managedclusteraddons"
CONDITION = "TunnelConnected"


def tunnel_condition(connected: bool, now: str, generation: int | None) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": CONDITION,
        "status": "True" if connected else "False",
        "reason": "TunnelUp" if connected else "TunnelDown",
        "message": ("the agent holds a tunnel session to the hub gateway" if connected else
                    "no agent of this cluster holds a tunnel session to the hub gateway"),
        "lastTransitionTime": now,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def status_patch(addon: Mapping[str, Any], connected: bool, now: str) -> dict[str, Any] | None:
    """The merge patch for ``addon``'s status, or None when it already says ``connected``."""
    metadata = addon.get("metadata") or {}
    status = addon.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    current = next((c for c in conditions if c.get("type") == CONDITION), None)
    wanted = tunnel_condition(connected, now, metadata.get("generation"))
    if current is not None:
        if all(current.get(k) == wanted[k] for k in ("status", "reason", "message")) and \
                current.get("observedGeneration") == wanted.get("observedGeneration"):
            return None
        if current.get("status") == wanted["status"] and current.get("lastTransitionTime"):
            wanted["lastTransitionTime"] = current["lastTransitionTime"]
    others = [c for c in conditions if c.get("type") != CONDITION]
    return {
        "metadata": {"resourceVersion": metadata.get("resourceVersion")},
        "status": {"conditions": [*others, wanted]},
    }
