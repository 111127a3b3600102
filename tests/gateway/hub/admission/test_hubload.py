"""The hub is not a free oracle: failed authentications per address, concurrent hub reviews."""

from __future__ import annotations

import asyncio

import pytest

from gateway.hub.admission.auth import AuthUnavailable
from gateway.hub.admission.hubload import (
    FailedAuthLimiter,
    HubCallLimit,
    TooManyFailures,
    address_key,
)
from tests.support import ManualClock


def test_rule7_failures_beyond_the_burst_are_refused_until_refilled() -> None:
    clock = ManualClock()
    limiter = FailedAuthLimiter(rate=0.5, burst=3, clock=clock)
    for _ in range(3):
        limiter.check("10.0.0.1")
        limiter.failed("10.0.0.1")
    with pytest.raises(TooManyFailures) as info:
        limiter.check("10.0.0.1")
    assert info.value.status == 429 and info.value.retry_after == 2  # 1 token at 0.5/s
    limiter.check("10.0.0.2")  # another address is not affected
    clock.now += 2.0
    limiter.check("10.0.0.1")  # one failure earned back
    limiter.failed("10.0.0.1")
    with pytest.raises(TooManyFailures):
        limiter.check("10.0.0.1")
    assert limiter.limited == 2


def test_ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() -> None:
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::2")
    assert address_key("2001:db8:1:2::1") != address_key("2001:db8:1:3::1")
    assert address_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert address_key("unknown") == "unknown"
    limiter = FailedAuthLimiter(rate=1, burst=1, clock=ManualClock())
    limiter.failed("2001:db8:1:2::1")
    with pytest.raises(TooManyFailures):
        limiter.check("2001:db8:1:2::ffff")


def test_rule7_memory_is_bounded() -> None:
    clock = ManualClock()
    limiter = FailedAuthLimiter(rate=1, burst=5, max_addresses=100, clock=clock)
    for i in range(10_000):
        limiter.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert len(limiter) == 100
    # the most recent offenders are the ones kept
    for _ in range(5):
        limiter.failed("10.0.39.15")
    with pytest.raises(TooManyFailures):
        limiter.check("10.0.39.15")


async def test_rule7_hub_calls_bounded_and_excess_fails_after_the_wait() -> None:
    limit = HubCallLimit(max_concurrent=2, max_wait=0.1)
    release = asyncio.Event()

    async def call() -> str:
        async with limit.slot():
            await release.wait()
            return "ok"

    held = [asyncio.ensure_future(call()) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(AuthUnavailable):
        await call()  # waited 0.1 s, no slot freed
    waiting = asyncio.ensure_future(call())
    await asyncio.sleep(0.02)
    release.set()
    assert await asyncio.gather(*held, waiting) == ["ok", "ok", "ok"]
    assert limit.peak == 2 and limit.refused == 1 and limit.in_flight == 0


async def test_rule7_subject_access_reviews_share_the_bound() -> None:
    from gateway.hub.admission.auth import UserInfo
    from gateway.hub.admission.authorize import SarAuthorizer

    async def slow(user: UserInfo, cluster: str) -> bool:
        await asyncio.sleep(0.3)
        return True

    limit = HubCallLimit(max_concurrent=1, max_wait=0.05)
    authorizer = SarAuthorizer(None, review=slow, hub_calls=limit)
    results = await asyncio.gather(authorizer.authorize(UserInfo("a"), "c1"),
                                   authorizer.authorize(UserInfo("b"), "c1"),
                                   return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["AuthUnavailable", "NoneType"]
    assert limit.peak == 1
    # the refusal was not cached: b is asked again (and allowed) once the hub has room
    await authorizer.authorize(UserInfo("b"), "c1")
