"""Reconnect delays: exponential with full jitter, reset after a stable connection.

Full jitter (a uniform delay between 0 and the exponential cap) spreads a fleet of agents that
lost the same hub, so they do not reconnect in lockstep. Pure: clock and randomness injected.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base: float = 0.2
    cap: float = 30.0
    stable_after: float = 30.0  # a session that lived this long resets the delay
    rand: Callable[[], float] = field(default=random.random, repr=False)
    attempt: int = 0
    _connected_at: float | None = None

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * 2.0 ** min(self.attempt, 32))
        self.attempt += 1
        return self.rand() * ceiling

    def connected(self, now: float) -> None:
        self._connected_at = now

    def disconnected(self, now: float) -> None:
        if self._connected_at is not None and now - self._connected_at >= self.stable_after:
            self.attempt = 0
        self._connected_at = None
