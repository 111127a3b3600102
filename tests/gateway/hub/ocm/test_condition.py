"""The TunnelConnected condition patch: ours changes, nobody else's does, time moves only on a
change of status."""

from __future__ import annotations

from typing import Any

from gateway.hub.ocm.condition import CONDITION, status_patch

OTHER = {"type": "Available", "status": "True", "reason": "Ok", "message": "m",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}


def addon(*conditions: dict[str, Any], generation: int = 3) -> dict[str, Any]:
    return {"metadata": {"name": "hubproxy", "namespace": "c1", "resourceVersion": "42",
                         "generation": generation},
            "status": {"conditions": list(conditions)}}


def ours(patch: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in patch["status"]["conditions"] if c["type"] == CONDITION)


def test_first_write_keeps_other_conditions_and_guards_the_version() -> None:
    patch = status_patch(addon(OTHER), True, "2026-11-24T10:00:00Z")
    assert patch is not None
    assert patch["metadata"] == {"resourceVersion": "42"}
    assert patch["status"]["conditions"][0] == OTHER
    assert ours(patch) == {"type": CONDITION, "status": "True", "reason": "TunnelUp",
                           "message": ours(patch)["message"], "observedGeneration": 3,
                           "lastTransitionTime": "2026-11-24T10:00:00Z"}


def test_nothing_to_write_when_it_already_says_so() -> None:
    first = ours(status_patch(addon(), False, "2026-11-24T10:00:00Z") or {})
    assert status_patch(addon(OTHER, first), False, "2026-11-24T11:00:00Z") is None


def test_transition_time_moves_only_with_the_status() -> None:
    up = ours(status_patch(addon(), True, "2026-11-24T10:00:00Z") or {})
    newer_generation = status_patch(addon(up, generation=4), True, "2026-11-24T11:00:00Z")
    assert newer_generation is not None
    assert ours(newer_generation)["lastTransitionTime"] == "2026-11-24T10:00:00Z"
    down = status_patch(addon(up), False, "2026-11-24T12:00:00Z")
    assert down is not None
    assert ours(down)["status"] == "False" and ours(down)["reason"] == "TunnelDown"
    assert ours(down)["lastTransitionTime"] == "2026-11-24T12:00:00Z"
    assert [c["type"] for c in down["status"]["conditions"]] == [CONDITION]
