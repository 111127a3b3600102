from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.hub.admission.auth import AuthUnavailable, UserInfo, build_hub_api_client
from gateway.hub.admission.authorize import (
    PROXY_GROUP,
    NoAuthorizer,
    NotAuthorized,
    SarAuthorizer,
)
from kubesim.testing import run_kubesim
from tests.support import ManualClock

ALICE = UserInfo("alice", "uid-a", ("devs",), {"k": ("v",)})
BOB = UserInfo("bob", "uid-b", ("ops",))


class FakeReview:
    def __init__(self, allowed: set[tuple[str, str]]) -> None:
        self.allowed = allowed
        self.calls: list[tuple[str, str]] = []
        self.fail: BaseException | None = None
        self.gate: asyncio.Event | None = None

    async def __call__(self, user: UserInfo, cluster: str) -> bool:
        self.calls.append((user.username, cluster))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return (user.username, cluster) in self.allowed


async def test_allow_and_deny_are_cached_per_user_and_cluster() -> None:
    review = FakeReview({("alice", "c1")})
    clock = ManualClock(0.0)
    authz = SarAuthorizer(None, ttl=10.0, review=review, clock=clock)
    await authz.authorize(ALICE, "c1")
    await authz.authorize(ALICE, "c1")
    for _ in range(2):
        with pytest.raises(NotAuthorized) as info:
            await authz.authorize(ALICE, "c2")
        assert info.value.status == 403
        assert "c2" in str(info.value) and "managedclusters/proxy" in str(info.value)
    with pytest.raises(NotAuthorized):
        await authz.authorize(BOB, "c1")
    assert review.calls == [("alice", "c1"), ("alice", "c2"), ("bob", "c1")]
    clock.now += 11
    await authz.authorize(ALICE, "c1")
    assert len(review.calls) == 4


async def test_key_includes_groups() -> None:
    other_groups = UserInfo("alice", "uid-a", ("admins",), {"k": ("v",)})
    assert SarAuthorizer.cache_key(ALICE, "c1") != SarAuthorizer.cache_key(other_groups, "c1")
    assert SarAuthorizer.cache_key(ALICE, "c1") != SarAuthorizer.cache_key(ALICE, "c2")


def test_key_kept_per_user_object_is_the_cache_key() -> None:
    """The key kept per user object and cluster is :meth:`SarAuthorizer.cache_key` of them:
    another user (object or fields) or cluster never gets one it does not own; bounded."""
    authz = SarAuthorizer(None, review=FakeReview(set()), max_entries=3)
    twin = UserInfo(ALICE.username, ALICE.uid, ALICE.groups, dict(ALICE.extra))
    other_groups = UserInfo("alice", "uid-a", ("admins",), {"k": ("v",)})
    for _ in range(2):
        for user in (ALICE, twin, other_groups, BOB):
            for cluster in ("c1", "c2"):
                assert authz.key(user, cluster) == SarAuthorizer.cache_key(user, cluster)
        assert len(authz._keys) <= 3
    assert authz.key(twin, "c1") == authz.key(ALICE, "c1") != authz.key(other_groups, "c1")


async def test_rule6_errors_not_cached() -> None:
    review = FakeReview({("alice", "c1")})
    review.fail = AuthUnavailable("down")
    authz = SarAuthorizer(None, review=review)
    for _ in range(2):
        with pytest.raises(AuthUnavailable):
            await authz.authorize(ALICE, "c1")
    review.fail = None
    await authz.authorize(ALICE, "c1")
    assert len(review.calls) == 3


async def test_through_a_hub_outage_a_confirmed_allow_is_served_within_the_grace() -> None:
    review = FakeReview({("alice", "c1")})
    clock = ManualClock(0.0)
    authz = SarAuthorizer(None, ttl=10.0, review=review, clock=clock, stale_grace=60.0)
    await authz.authorize(ALICE, "c1")
    with pytest.raises(NotAuthorized):
        await authz.authorize(ALICE, "c2")
    review.fail = AuthUnavailable("down")
    clock.now += 11
    await authz.authorize(ALICE, "c1")  # the last allow answers while the hub cannot
    assert authz.allowed_cached(ALICE, "c1")
    with pytest.raises(AuthUnavailable):  # a deny is never turned into anything else
        await authz.authorize(ALICE, "c2")
    clock.now += 60
    with pytest.raises(AuthUnavailable):  # past TTL + grace: fail closed
        await authz.authorize(ALICE, "c1")


async def test_coalesced() -> None:
    review = FakeReview({("alice", "c1")})
    review.gate = asyncio.Event()
    authz = SarAuthorizer(None, review=review)
    tasks = [asyncio.create_task(authz.authorize(ALICE, "c1")) for _ in range(10)]
    await asyncio.sleep(0.01)
    review.gate.set()
    await asyncio.gather(*tasks)
    assert len(review.calls) == 1


async def test_no_authorizer_allows() -> None:
    await NoAuthorizer().authorize(ALICE, "anything")


async def test_sar_against_kubesim(tmp_path: Path) -> None:
    async with run_kubesim(tmp_path) as sim:
        sim.grant(
            "Group:proxy-users",
            verbs=["get"],
            resources=["managedclusters/proxy"],
            api_groups=[PROXY_GROUP],
            resource_names=["c1"],
        )
        kubeconfig = sim.write_kubeconfig(tmp_path / "hub.kubeconfig", sim.admin_token)
        api = await build_hub_api_client(str(kubeconfig))
        try:
            authz = SarAuthorizer(api, ttl=10.0)
            member = UserInfo("system:serviceaccount:ns:sa", "u1", ("proxy-users",))
            await authz.authorize(member, "c1")
            with pytest.raises(NotAuthorized):
                await authz.authorize(member, "c2")
            with pytest.raises(NotAuthorized):
                await authz.authorize(UserInfo("eve", "u2", ("devs",)), "c1")
            assert authz.reviews == 3
            sars = sim.requests_to("/apis/authorization.k8s.io/v1/subjectaccessreviews")
            assert len(sars) == 3
        finally:
            await api.close()
