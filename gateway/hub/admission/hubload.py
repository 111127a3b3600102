"""What a caller can make the gateway ask the hub: the hub is not a free oracle (DESIGN §6 rule 7).

Every uncached bearer token costs a TokenReview on the hub kube-apiserver, every uncached
(user, cluster) a SubjectAccessReview. Without limits, a stream of random tokens is a stream of
hub requests -- load on the hub, and a way to test guessed tokens at the hub's speed. Two limits:

* :class:`FailedAuthLimiter` -- failed authentications per client address, a token bucket:
  each request the hub's answer turns into a 401 takes one token (``burst`` at most, refilled at
  ``rate`` per second). With the bucket empty, that address's requests that would need the hub
  get 429 with ``Retry-After`` *before* the hub is asked; a token whose success is cached still
  passes (the common case for a legitimate client behind the same NAT). IPv6 addresses count
  per /64 (one host usually holds a whole /64). Memory is bounded: at most ``max_addresses``
  buckets, the least recently failed dropped first (in O(1): a scan for refilled buckets on each
  insert would let a caller cycling through addresses buy a 65k-entry scan per request). With
  ``--token-passthrough`` a token the hub rejects is forwarded, not answered 401, so it is not
  counted: rejected tokens are what passthrough is for (the hub-call bound still applies).
* :class:`HubCallLimit` -- concurrent TokenReview and SubjectAccessReview calls, one bound for
  both: past ``max_concurrent``, a call waits up to ``max_wait`` seconds for a slot, then fails
  with :class:`gateway.hub.admission.auth.AuthUnavailable` (503 with ``Retry-After``; never
  cached, like every hub error). Identical reviews are already coalesced by the caches, so this
  bounds *distinct* reviews in flight.

Both count per gateway process (``--workers`` and ``--replicas`` multiply them). Pure but for
the semaphore; the clock is injectable for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from gateway.hub.admission.auth import AuthUnavailable
from gateway.hub.config import GatewayConfig

# The defaults are the gateway's flags' (gateway.hub.config).
DEFAULT_FAILURE_RATE = GatewayConfig.auth_failure_rate  # per second and address, sustained
DEFAULT_FAILURE_BURST = GatewayConfig.auth_failure_burst
DEFAULT_MAX_ADDRESSES = 65536  # ~100 bytes each
DEFAULT_MAX_CONCURRENT_REVIEWS = GatewayConfig.hub_max_concurrent_reviews
DEFAULT_MAX_REVIEW_WAIT = GatewayConfig.hub_review_wait


class TooManyFailures(Exception):
    """This address failed to authenticate too often (429); ``retry_after`` in whole seconds."""

    status = 429

    def __init__(self, retry_after: int) -> None:
        super().__init__("too many failed authentications from this address, retry later")
        self.retry_after = retry_after


def address_key(client_ip: str) -> str:
    """The bucket of an address: itself for IPv4, its /64 for IPv6 (IPv4-mapped: the IPv4)."""
    try:
        ip = ipaddress.ip_address(client_ip)
    except ValueError:
        return client_ip
    if ip.version == 6:
        mapped = ip.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class FailedAuthLimiter:
    """Per-address token bucket of failed authentications; see the module docstring."""

    def __init__(self, *, rate: float = DEFAULT_FAILURE_RATE, burst: int = DEFAULT_FAILURE_BURST,
                 max_addresses: int = DEFAULT_MAX_ADDRESSES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1 or max_addresses < 1:
            raise ValueError("rate, burst and max_addresses must be positive")
        self.rate = rate
        self.burst = burst
        self.max_addresses = max_addresses
        self.clock = clock
        # key -> (tokens left, when they were counted)
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.limited = 0  # requests refused with 429 (for tests and metrics)

    def __len__(self) -> int:
        return len(self._buckets)

    def _tokens(self, key: str, now: float) -> float:
        entry = self._buckets.get(key)
        if entry is None:
            return float(self.burst)
        tokens, then = entry
        return min(float(self.burst), tokens + (now - then) * self.rate)

    def check(self, client_ip: str) -> None:
        """Raise :class:`TooManyFailures` when this address has no failure left to spend."""
        key = address_key(client_ip)
        if key not in self._buckets:
            return
        now = self.clock()
        tokens = self._tokens(key, now)
        if tokens >= 1.0:
            return
        self.limited += 1
        raise TooManyFailures(max(1, math.ceil((1.0 - tokens) / self.rate)))

    def failed(self, client_ip: str) -> None:
        """Count one failed authentication of this address."""
        key = address_key(client_ip)
        now = self.clock()
        tokens = max(0.0, self._tokens(key, now) - 1.0)
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        if len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)


class HubCallLimit:
    """At most ``max_concurrent`` hub reviews at once; a caller waits ``max_wait`` for a slot."""

    def __init__(self, max_concurrent: int = DEFAULT_MAX_CONCURRENT_REVIEWS,
                 max_wait: float = DEFAULT_MAX_REVIEW_WAIT) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be positive")
        self.max_concurrent = max_concurrent
        self.max_wait = max_wait
        self.in_flight = 0
        self.peak = 0  # the most calls in flight at once (for tests and metrics)
        self.refused = 0  # calls that found no slot in time
        self._semaphore = asyncio.Semaphore(max_concurrent)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot for the body; raises ``AuthUnavailable`` when none frees in time."""
        semaphore = self._semaphore
        if semaphore.locked():
            try:
                async with asyncio.timeout(self.max_wait):
                    await semaphore.acquire()
            except TimeoutError:
                self.refused += 1
                raise AuthUnavailable("too many hub reviews in flight") from None
        else:
            await semaphore.acquire()  # free: returns at once
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1
            semaphore.release()
