"""One loop timer per client connection, for all of its deadlines.

A loop timer made and cancelled for every deadline (idle, a request head's, a response head's,
each HTTP/2 stream's) costs one per request. A door instead keeps its deadlines as numbers and
asks its :class:`Wakeup` to fire by the earliest: the timer moves only when a deadline comes
earlier than it; a deadline that moved later is found when it fires, and the door asks again
for what is left. Steady keep-alive traffic makes no timer per request, and every deadline
still fires on time. Both front doors (HTTP/1.1 and HTTP/2) use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# A loop timer may fire a little before its time (uvloop counts in milliseconds): a deadline
# this close is due.
TIMER_SLACK = 0.002


class Wakeup:
    """Calls ``fire`` once by the earliest deadline asked for (:meth:`at`), then forgets it."""

    __slots__ = ("_at", "_fire", "_handle", "_loop")

    def __init__(self, fire: Callable[[], None]) -> None:
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0
        # Kept at first use: asyncio.get_running_loop() is a getpid() system call on Python
        # 3.11, and a connection asks the time once or twice per request.
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        """The loop's time."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop.time()

    def due(self, deadline: float) -> bool:
        """Whether ``deadline`` has come (within :data:`TIMER_SLACK`)."""
        return deadline <= self.now() + TIMER_SLACK

    def at(self, deadline: float) -> None:
        """Fire by ``deadline`` (loop time): at it, or earlier if asked for an earlier one."""
        handle = self._handle
        if handle is not None:
            if self._at <= deadline:
                return  # fires first, and the door looks again then
            handle.cancel()
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._handle, self._at = loop.call_at(deadline, self._fired), deadline

    def cancel(self) -> None:
        """The connection is closing: no timer may keep it alive."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fired(self) -> None:
        self._handle = None
        self._fire()
