"""Measure what the gateway asks of the hub, without changing how it asks.

Thin wrappers around the admission seams (``TokenReviewer``, the SAR review function, the
``Authorizer``) that record into :class:`gateway.ops.metrics.GatewayMetrics`: each TokenReview
and SubjectAccessReview actually sent (a cache miss) with its duration and outcome, and each
authorization asked for (so the SAR cache hit ratio is lookups minus reviews). Outcome ``ok``
means the hub answered (yes or no); ``error`` that it could not (the request then got 503).
Nothing about the caller is recorded: no token, no user.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gateway.hub.admission.auth import TokenReviewer, UserInfo
from gateway.hub.admission.authorize import Authorizer, Review
from gateway.ops.metrics import GatewayMetrics

TOKENREVIEW = "tokenreview"
SUBJECTACCESSREVIEW = "subjectaccessreview"


class TimedTokenReviewer:
    """A :class:`TokenReviewer` that records each review's duration and outcome."""

    def __init__(self, inner: TokenReviewer, metrics: GatewayMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    async def review(self, token: str, audiences: tuple[str, ...]) -> Mapping[str, Any]:
        started = time.monotonic()
        ok = False
        try:
            result = await self.inner.review(token, audiences)
            ok = True
            return result
        finally:
            self.metrics.hub_call(TOKENREVIEW, time.monotonic() - started, ok)


def timed_review(review: Review, metrics: GatewayMetrics) -> Review:
    """Wrap a SubjectAccessReview call (``SarAuthorizer``'s review function)."""

    async def timed(user: UserInfo, cluster: str) -> bool:
        started = time.monotonic()
        ok = False
        try:
            allowed = await review(user, cluster)
            ok = True
            return allowed
        finally:
            metrics.hub_call(SUBJECTACCESSREVIEW, time.monotonic() - started, ok)

    return timed


class CountingAuthorizer:
    """An :class:`Authorizer` that counts authorizations asked for (cache hits included)."""

    def __init__(self, inner: Authorizer, metrics: GatewayMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def allowed_cached(self, user: UserInfo, cluster: str) -> bool:
        allowed = self.inner.allowed_cached(user, cluster)
        if allowed:
            self.metrics.authz_lookups += 1
        return allowed

    async def authorize(self, user: UserInfo, cluster: str) -> None:
        self.metrics.authz_lookups += 1
        await self.inner.authorize(user, cluster)
