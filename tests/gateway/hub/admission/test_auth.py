from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.hub.admission.auth import (
    MAX_TOKEN_BYTES,
    AuthUnavailable,
    KubeTokenReviewer,
    TokenAuthenticator,
    Unauthenticated,
    UserInfo,
    build_hub_api_client,
)
from gateway.hub.admission.identity import map_identity
from kubesim.testing import run_kubesim
from tests.support import ManualClock

GOOD = "good-token"
BAD = "bad-token"


def ok_status(username: str = "system:serviceaccount:ns:sa", audiences: list[str] | None = None):
    return {
        "authenticated": True,
        "user": {
            "username": username,
            "uid": "uid-1",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
        },
        "audiences": audiences or [],
    }


class FakeReviewer:
    """Counts calls; answers per token; can be slowed down or made to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.answers: dict[str, Mapping[str, Any]] = {
            GOOD: ok_status(),
            BAD: {"user": {}, "error": "invalid bearer token"},
        }
        self.fail: BaseException | None = None
        self.gate: asyncio.Event | None = None

    async def review(self, token: str, audiences: tuple[str, ...]) -> Mapping[str, Any]:
        self.calls.append((token, audiences))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return self.answers[token]


@pytest.fixture
def reviewer() -> FakeReviewer:
    return FakeReviewer()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def authn(reviewer: FakeReviewer, clock: ManualClock) -> TokenAuthenticator:
    return TokenAuthenticator(reviewer, ttl=10.0, clock=clock)


async def test_success_is_cached(authn: TokenAuthenticator, reviewer: FakeReviewer) -> None:
    first = await authn.authenticate(GOOD)
    second = await authn.authenticate(GOOD)
    assert first == second
    assert first.username == "system:serviceaccount:ns:sa"
    assert first.groups == ("system:serviceaccounts", "system:authenticated")
    assert first.extra == {"authentication.kubernetes.io/pod-name": ("p",)}
    assert len(reviewer.calls) == 1


async def test_clean_rejection_is_cached(authn: TokenAuthenticator, reviewer: FakeReviewer) -> None:
    for _ in range(3):
        with pytest.raises(Unauthenticated) as info:
            await authn.authenticate(BAD)
        assert BAD not in str(info.value)
        assert info.value.status == 401
    assert len(reviewer.calls) == 1


async def test_rule6_errors_are_never_cached(
    authn: TokenAuthenticator, reviewer: FakeReviewer
) -> None:
    reviewer.fail = AuthUnavailable("hub down")
    for _ in range(2):
        with pytest.raises(AuthUnavailable) as info:
            await authn.authenticate(GOOD)
        assert info.value.status == 503
    assert len(reviewer.calls) == 2
    reviewer.fail = None
    assert (await authn.authenticate(GOOD)).username
    assert len(reviewer.calls) == 3


async def test_unexpected_reviewer_exception_is_unavailable_not_401(
    authn: TokenAuthenticator, reviewer: FakeReviewer
) -> None:
    reviewer.fail = RuntimeError(f"boom {GOOD}")
    with pytest.raises(AuthUnavailable) as info:
        await authn.authenticate(GOOD)
    assert GOOD not in str(info.value)
    assert len(authn.cache) == 0


async def test_ttl_expiry(
    authn: TokenAuthenticator, reviewer: FakeReviewer, clock: ManualClock
) -> None:
    await authn.authenticate(GOOD)
    clock.now += 9.9
    await authn.authenticate(GOOD)
    assert len(reviewer.calls) == 1
    clock.now += 0.2
    await authn.authenticate(GOOD)
    assert len(reviewer.calls) == 2
    with pytest.raises(Unauthenticated):
        await authn.authenticate(BAD)
    clock.now += 11
    with pytest.raises(Unauthenticated):
        await authn.authenticate(BAD)
    assert len(reviewer.calls) == 4


async def test_through_a_hub_outage_a_confirmed_token_is_served_within_the_grace(
    reviewer: FakeReviewer, clock: ManualClock
) -> None:
    authn = TokenAuthenticator(reviewer, ttl=10.0, clock=clock, stale_grace=60.0)
    user = await authn.authenticate(GOOD)
    with pytest.raises(Unauthenticated):
        await authn.authenticate(BAD)
    reviewer.fail = AuthUnavailable("hub down")
    clock.now += 11  # both entries expired: each is asked again
    assert await authn.authenticate(GOOD) == user  # the hub failed: its last yes answers
    with pytest.raises(AuthUnavailable):  # a refusal is never extended into a 503-free pass
        await authn.authenticate(BAD)
    assert authn.cache.stale_served == 1
    asked = len(reviewer.calls)
    clock.now += 9  # the stale answer is trusted for one more TTL: no ask per request
    assert await authn.authenticate(GOOD) == user
    assert authn.cached(GOOD) == user  # the synchronous fast path sees it too
    assert len(reviewer.calls) == asked
    clock.now += 2  # asked again once per TTL, still failing, still within 10 + 60 s
    assert await authn.authenticate(GOOD) == user
    assert len(reviewer.calls) == asked + 1
    clock.now += 50  # 72 s after the hub's yes: past TTL + grace, fail closed
    with pytest.raises(AuthUnavailable):
        await authn.authenticate(GOOD)
    reviewer.fail = None
    assert await authn.authenticate(GOOD) == user  # the hub is back: asked, and fresh again


async def test_a_clean_no_after_a_yes_wins_over_the_grace(
    reviewer: FakeReviewer, clock: ManualClock
) -> None:
    authn = TokenAuthenticator(reviewer, ttl=10.0, clock=clock, stale_grace=60.0)
    await authn.authenticate(GOOD)
    reviewer.answers[GOOD] = {"user": {}, "error": "token revoked"}
    clock.now += 11
    with pytest.raises(Unauthenticated):
        await authn.authenticate(GOOD)
    reviewer.fail = AuthUnavailable("hub down")  # the revoked token's yes is gone for good
    clock.now += 11
    with pytest.raises(AuthUnavailable):
        await authn.authenticate(GOOD)


async def test_without_a_grace_an_outage_refuses_even_a_confirmed_token(
    authn: TokenAuthenticator, reviewer: FakeReviewer, clock: ManualClock
) -> None:
    await authn.authenticate(GOOD)
    reviewer.fail = AuthUnavailable("hub down")
    clock.now += 11
    with pytest.raises(AuthUnavailable):
        await authn.authenticate(GOOD)
    assert authn.cache.stale_served == 0


async def test_concurrent_reviews_coalesced(
    authn: TokenAuthenticator, reviewer: FakeReviewer
) -> None:
    reviewer.gate = asyncio.Event()
    tasks = [asyncio.create_task(authn.authenticate(GOOD)) for _ in range(20)]
    bad = [asyncio.create_task(authn.authenticate(BAD)) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert len(reviewer.calls) == 2
    reviewer.gate.set()
    results = await asyncio.gather(*tasks)
    assert len({r.username for r in results}) == 1
    for task in bad:
        with pytest.raises(Unauthenticated):
            await task
    assert len(reviewer.calls) == 2


async def test_coalesced_error_reaches_every_waiter_and_is_not_cached(
    authn: TokenAuthenticator, reviewer: FakeReviewer
) -> None:
    reviewer.gate = asyncio.Event()
    reviewer.fail = AuthUnavailable("down")
    tasks = [asyncio.create_task(authn.authenticate(GOOD)) for _ in range(5)]
    await asyncio.sleep(0.01)
    reviewer.gate.set()
    for task in tasks:
        with pytest.raises(AuthUnavailable):
            await task
    assert len(reviewer.calls) == 1
    assert len(authn.cache) == 0


async def test_cancelled_waiter_does_not_cancel_the_flight(
    authn: TokenAuthenticator, reviewer: FakeReviewer
) -> None:
    reviewer.gate = asyncio.Event()
    first = asyncio.create_task(authn.authenticate(GOOD))
    second = asyncio.create_task(authn.authenticate(GOOD))
    await asyncio.sleep(0.01)
    first.cancel()
    reviewer.gate.set()
    assert (await second).username
    assert first.cancelled()
    assert len(reviewer.calls) == 1


async def test_rule5_cache_keys_are_hmac_not_the_token(
    authn: TokenAuthenticator, reviewer: FakeReviewer
) -> None:
    await authn.authenticate(GOOD)
    with pytest.raises(Unauthenticated):
        await authn.authenticate(BAD)
    keys = authn.cache.keys()
    assert len(keys) == 2
    for key in keys:
        assert isinstance(key, bytes) and len(key) == 32
        assert GOOD.encode() not in key and BAD.encode() not in key
    assert authn.cache_key(GOOD) in keys
    # the key is secret per process: another authenticator derives different keys
    other = TokenAuthenticator(reviewer)
    assert other.cache_key(GOOD) != authn.cache_key(GOOD)
    # and it depends on the audiences
    aud = TokenAuthenticator(reviewer, audiences=["a"])
    aud._mac_key = authn._mac_key
    assert aud.cache_key(GOOD) != authn.cache_key(GOOD)
    for value in authn.cache._entries.values():
        assert GOOD not in repr(value) and BAD not in repr(value)


async def test_rule7_cache_is_bounded_lru(reviewer: FakeReviewer) -> None:
    for i in range(10):
        reviewer.answers[f"t{i}"] = ok_status(f"user{i}")
    authn = TokenAuthenticator(reviewer, max_entries=3)
    for i in range(5):
        await authn.authenticate(f"t{i}")
    assert len(authn.cache) == 3
    await authn.authenticate("t2")  # hit, becomes most recent
    await authn.authenticate("t5")  # evicts t3
    calls = len(reviewer.calls)
    await authn.authenticate("t2")
    assert len(reviewer.calls) == calls
    await authn.authenticate("t3")
    assert len(reviewer.calls) == calls + 1


@pytest.mark.parametrize(
    "status",
    [
        {"authenticated": False, "user": {"username": "alice"}},
        {"authenticated": True, "user": {"username": "alice"}, "error": "expired"},
        {"authenticated": True, "user": {"username": ""}},
        {"authenticated": True, "user": {}},
        {"authenticated": True, "user": {"username": "system:anonymous"}},
        {"authenticated": True, "user": {"username": "alice",
                                         "groups": ["system:authenticated",
                                                    "system:unauthenticated"]}},
        {"authenticated": True, "user": {"username": "system:anonymous",
                                         "groups": ["system:unauthenticated"]}},
        {"authenticated": "true", "user": {"username": "alice"}},
        {},
    ],
)
async def test_rule1_only_clean_authenticated_users_accepted(
    reviewer: FakeReviewer, status: Mapping[str, Any]
) -> None:
    reviewer.answers["t"] = status
    with pytest.raises(Unauthenticated):
        await TokenAuthenticator(reviewer).authenticate("t")


async def test_rule1_audience_matching(reviewer: FakeReviewer) -> None:
    authn = TokenAuthenticator(reviewer, audiences=["hubproxy", "other"])
    reviewer.answers["match"] = ok_status(audiences=["hubproxy"])
    reviewer.answers["wrong"] = ok_status(audiences=["kubernetes"])
    reviewer.answers["none"] = ok_status(audiences=[])
    assert (await authn.authenticate("match")).username
    assert reviewer.calls[0] == ("match", ("hubproxy", "other"))
    for token in ("wrong", "none"):
        with pytest.raises(Unauthenticated):
            await authn.authenticate(token)


async def test_rule7_empty_and_oversized_tokens_refused_without_review(
    authn: TokenAuthenticator, reviewer: FakeReviewer
) -> None:
    for token in ("", "x" * (MAX_TOKEN_BYTES + 1)):
        with pytest.raises(Unauthenticated):
            await authn.authenticate(token)
    assert reviewer.calls == []


def test_user_info_feeds_map_identity() -> None:
    user = UserInfo("system:serviceaccount:ns:sa", "u", ("system:serviceaccounts",),
                    {"authentication.kubernetes.io/pod-name": ("p",)})
    identity = map_identity(user, request_id="r")
    assert identity.user == "cluster:hub:system:serviceaccount:ns:sa"
    assert identity.extra == {"hubproxy.dev/hub-pod-name": ("p",)}


# --- against kubesim's real TokenReview, through kubernetes-asyncio ------------------------------


async def test_kube_token_reviewer_against_kubesim(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with run_kubesim(
        tmp_path, users=[("weak-token", "weak", "uid-w", ["devs"])], api_audiences=["hub-api"]
    ) as sim:
        token = sim.mint_token("team-a", "deployer", audiences=["hubproxy"])
        default_token = sim.mint_token("team-a", "other")
        kubeconfig = sim.write_kubeconfig(tmp_path / "hub.kubeconfig", sim.admin_token)
        api = await build_hub_api_client(str(kubeconfig))
        try:
            authn = TokenAuthenticator(KubeTokenReviewer(api), audiences=["hubproxy"])
            user = await authn.authenticate(token)
            assert user.username == "system:serviceaccount:team-a:deployer"
            assert "system:serviceaccounts:team-a" in user.groups
            assert user.uid
            with pytest.raises(Unauthenticated):
                await authn.authenticate("not-a-token")
            with pytest.raises(Unauthenticated):  # valid token, wrong audience
                await authn.authenticate(default_token)
            assert authn.reviews == 3
            await authn.authenticate(token)
            assert authn.reviews == 3
            reviews = sim.requests_to("/apis/authentication.k8s.io/v1/tokenreviews")
            assert len(reviews) == 3
        finally:
            await api.close()

        # Our own hub credential is refused (no RBAC for tokenreviews): 503, and a clear log line.
        weak = await build_hub_api_client(
            str(sim.write_kubeconfig(tmp_path / "weak.kubeconfig", "weak-token"))
        )
        try:
            authn = TokenAuthenticator(KubeTokenReviewer(weak))
            with (
                caplog.at_level(logging.ERROR, logger="gateway.hub.admission.auth"),
                pytest.raises(AuthUnavailable),
            ):
                await authn.authenticate(token)
            assert "gateway's own credential" in caplog.text
            assert token not in caplog.text
            assert len(authn.cache) == 0
        finally:
            await weak.close()

    # The hub is gone: 503, not 401.
    gone = await build_hub_api_client(str(kubeconfig))
    try:
        authn = TokenAuthenticator(KubeTokenReviewer(gone, timeout=3.0))
        with pytest.raises(AuthUnavailable):
            await authn.authenticate(token)
    finally:
        await gone.close()


def test_rule5_cache_key_of_the_last_token_is_its_own(authn: TokenAuthenticator) -> None:
    """The key of the last token is kept for the same token object: another token, or an
    equal one built afresh, never gets a key it does not own."""
    good = authn.cache_key(GOOD)
    bad = authn.cache_key(BAD)
    assert good != bad
    fresh = "".join(["good-", "token"])  # equal, another object
    assert fresh is not GOOD
    assert authn.cache_key(fresh) == good
    assert authn.cache_key(BAD) == bad
    assert authn.cache_key(GOOD) == good

