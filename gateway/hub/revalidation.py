"""Revocation reaches open streams (``--revalidate-streams``, on by default).

One task per gateway process. Every ``period`` seconds it looks at the request in progress on
each client connection; those admitted with a :class:`gateway.hub.admission.recheck.Recheck`
(long-running, with a hub identity) are asked about again
(:func:`gateway.hub.admission.recheck.recheck`), once per distinct (token, cluster) however many
streams share it. The caches answer while their entries are fresh, so the hub is asked again
only once they expire: a stream whose token is revoked, whose caller loses
``managedclusters/proxy``, or whose review now returns other groups than the stream was opened
with (it would go on impersonating the old ones), is closed within ``--token-cache-ttl`` +
``period`` + the review's time (at most 5 s each by default), well within TTL + 15 s.

How a stream is closed (:meth:`gateway.hub.exchange.Exchange.revoke`): a watch or ``logs -f``
ends its chunked body with the terminating chunk at a chunk boundary (client-go's reflector
re-lists and gets the 401/403); a WebSocket exec/attach gets, at a frame boundary, a ``Status``
on its error channel and a normal close (kubectl prints the message), other WebSockets
(port-forward, a Service's) a 1008 close frame that says why; a SPDY exec/attach gets, at a
frame boundary, the ``Status`` as a DATA frame on the error stream the client opened
(``gateway.wire.spdy`` reads the client's SYN_STREAM headers to know it), then the connection
closes; SPDY port-forward and other bodies are closed at the connection. A response that has
not started gets the Status.

Hub errors never close a stream (see ``recheck``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Protocol

from gateway.hub.admission.auth import Authenticator
from gateway.hub.admission.authorize import Authorizer
from gateway.hub.admission.recheck import Recheck, Revoked, Verdict, recheck

log = logging.getLogger("hubproxy.gateway")

MAX_PERIOD = 5.0
MIN_PERIOD = 0.5
CONCURRENT_RECHECKS = 16  # distinct questions in flight; the hub-wide bound still applies


class OpenStream(Protocol):
    """What the revalidator needs of a request in progress (``gateway.hub.exchange.Exchange``)."""

    @property
    def request_id(self) -> str: ...

    @property
    def done(self) -> bool: ...

    def recheck_on(self) -> Recheck | None: ...

    def revoke(self, revoked: Revoked) -> None: ...


class Connections(Protocol):
    """The gateway's client connections and the request each has in progress."""

    def open_streams(self) -> Iterable[OpenStream]: ...


def period_for(token_cache_ttl: float) -> float:
    """How often to look: the cache TTL, within [MIN_PERIOD, MAX_PERIOD]."""
    return max(MIN_PERIOD, min(MAX_PERIOD, token_cache_ttl))


class StreamRevalidator:
    """See the module docstring. ``run`` until cancelled; ``sweep`` once (tests)."""

    def __init__(self, connections: Connections, authenticator: Authenticator,
                 authorizer: Authorizer, period: float) -> None:
        self.connections = connections
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.period = period
        self.revoked = 0  # streams closed (metrics, tests)
        self._limit = asyncio.Semaphore(CONCURRENT_RECHECKS)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.sweep()
            except Exception as exc:  # a bug must not end revalidation for the process
                log.error("stream revalidation failed: %s", type(exc).__name__, exc_info=exc)

    async def sweep(self) -> None:
        groups: dict[tuple[str, str], list[OpenStream]] = {}
        admitted_on: dict[tuple[str, str], Recheck] = {}
        for stream in self.connections.open_streams():
            on = stream.recheck_on()
            if on is None or stream.done:
                continue
            key = (on.token, on.cluster)
            groups.setdefault(key, []).append(stream)
            admitted_on.setdefault(key, on)
        if not groups:
            return
        keys = list(groups)
        verdicts = await asyncio.gather(*(self._ask(admitted_on[k]) for k in keys))
        for key, verdict in zip(keys, verdicts, strict=True):
            if not isinstance(verdict, Revoked):
                continue
            for stream in groups[key]:
                if stream.done:
                    continue
                # No user name or token: request id, cluster and the reason only.
                log.info("request %s: closing its stream to %s, the hub now says %d %s",
                         stream.request_id, key[1], verdict.status, verdict.reason)
                self.revoked += 1
                stream.revoke(verdict)

    async def _ask(self, on: Recheck) -> Verdict:
        async with self._limit:
            return await recheck(self.authenticator, self.authorizer, on)


def start(revalidator: StreamRevalidator) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(revalidator.run(), name="revalidate-streams")


async def stop(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
