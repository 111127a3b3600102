"""The cluster inventory's decisions (gateway.hub.inventory) against a scripted hub API.

The real hub (list + watch of ManagedClusters and ClusterProfiles, RBAC) is in
tests/realkube/test_cluster_inventory.py; here how ``auto`` chooses, and the bookkeeping.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.hub.inventory import ClusterInventory


class ApiError(Exception):
    def __init__(self, status: int | None) -> None:
        super().__init__(status)
        self.status = status


class Steps(list):
    """Answers given one per call, in order."""


class ScriptedApi:
    """list_cluster_custom_object answers per plural: names, an exception, or Steps of them."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def list_cluster_custom_object(self, group: str, version: str, plural: str,
                                         **_: Any) -> dict[str, Any]:
        self.calls.append(plural)
        answer = self.answers[plural]
        if isinstance(answer, Steps):
            answer = answer.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {"items": [{"metadata": {"name": n}} for n in answer],
                "metadata": {"resourceVersion": "1"}}


def inventory(mode: str, answers: dict[str, Any]) -> ClusterInventory:
    inv = ClusterInventory(None, mode, max_backoff=0.01)
    inv._api = ScriptedApi(answers)  # type: ignore[assignment]
    return inv


@pytest.mark.parametrize(("answers", "chosen"), [
    ({"managedclusters": ["c1"], "clusterprofiles": ["c2"]}, "managedclusters"),
    ({"managedclusters": ApiError(404), "clusterprofiles": ["c2"]}, "clusterprofiles"),
    ({"managedclusters": ApiError(403), "clusterprofiles": ["c2"]}, "clusterprofiles"),
    # An installed CRD nobody uses is not an inventory.
    ({"managedclusters": [], "clusterprofiles": ["c2"]}, "clusterprofiles"),
    ({"managedclusters": [], "clusterprofiles": ApiError(404)}, None),
])
async def test_auto_takes_the_first_usable_inventory(answers: dict[str, Any],
                                                     chosen: str | None) -> None:
    inv = inventory("auto", answers)
    assert await inv._detect() == chosen


async def test_auto_retries_while_the_hub_cannot_answer() -> None:
    inv = inventory("auto", {"managedclusters": Steps([ApiError(500), ApiError(None), ["c1"]]),
                             "clusterprofiles": []})
    assert await asyncio.wait_for(inv._detect(), 5) == "managedclusters"
    assert inv._api.calls == ["managedclusters"] * 3


async def test_no_answer_until_listed_then_names_follow_events() -> None:
    inv = ClusterInventory(None, "managedclusters")
    assert inv.listed("c1") is None  # not listed yet: the grace applies
    inv._replace("", [{"metadata": {"name": "c1"}}])
    assert (inv.listed("c1"), inv.listed("c2")) == (True, False)
    inv._apply({"type": "ADDED", "object": {"metadata": {"name": "c2"}}})
    inv._apply({"type": "DELETED", "object": {"metadata": {"name": "c1"}}})
    assert (inv.listed("c1"), inv.listed("c2")) == (False, True)


async def test_clusterprofiles_of_the_same_name_in_two_namespaces() -> None:
    inv = ClusterInventory(None, "clusterprofiles", ["a", "b"])
    inv._replace("a", [{"metadata": {"name": "c1", "namespace": "a"}}])
    assert inv.listed("c1") is None  # namespace b not listed yet
    inv._replace("b", [{"metadata": {"name": "c1", "namespace": "b"}}])
    inv._apply({"type": "DELETED", "object": {"metadata": {"name": "c1", "namespace": "a"}}})
    assert inv.listed("c1") is True  # still listed in b
    inv._replace("b", [])
    assert inv.listed("c1") is False


async def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of"):
        ClusterInventory(None, "inventory-of-everything")
