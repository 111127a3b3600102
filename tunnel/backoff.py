"""Reconnect delays: exponential with full jitter, reset after a stable connection.

Full jitter (a uniform delay between 0 and the exponential cap) spreads a fleet of agents that
lost the same hub, so they do not reconnect in lockstep. Pure: clock and randomness injected.

A dial the hub turned away because it is busy (its "busy" alert, a handshake that timed out, a
connection dropped before the handshake completed: ``tunnel.handshake.hub_busy``) is an
*overload*: the window then starts at ``OVERLOAD_WINDOW`` rather than at ``base`` (and keeps
doubling from there), so thousands of agents refused by one hub spread their retries over
seconds instead of coming back within the first tenths of a second (issue 22).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

OVERLOAD_WINDOW = 5.0  # seconds: the smallest window after the hub said it is busy


@dataclass
class Backoff:
    base: float = 0.2
    cap: float = 30.0
    stable_after: float = 30.0  # a session that lived this long resets the delay
    rand: Callable[[], float] = field(default=random.random, repr=False)
    attempt: int = 0
    _connected_at: float | None = None

    def next_delay(self, overloaded: bool = False) -> float:
        """The delay before the next dial: uniform in [0, ceiling), the ceiling doubling per
        failed dial from ``base`` (from ``OVERLOAD_WINDOW`` once the hub said it is busy)."""
        if overloaded:
            self.attempt = max(self.attempt, self._attempt_for(min(OVERLOAD_WINDOW, self.cap)))
        ceiling = min(self.cap, self.base * 2.0 ** min(self.attempt, 32))
        self.attempt += 1
        return self.rand() * ceiling

    def _attempt_for(self, window: float) -> int:
        """The first attempt whose ceiling is at least ``window``."""
        return max(0, math.ceil(math.log2(window / self.base))) if self.base > 0 else 0

    def connected(self, now: float) -> None:
        self._connected_at = now

    def disconnected(self, now: float) -> None:
        if self._connected_at is not None and now - self._connected_at >= self.stable_after:
            self.attempt = 0
        self._connected_at = None
