"""The health port (:8000, plain HTTP, cluster-internal): ``/healthz``, ``/readyz``, ``/metrics``.

* ``/healthz`` -- 200 while the event loop answers (process alive).
* ``/readyz`` -- 200 only when the listeners are up, the gateway is not shutting down, and the
  last hub authentication probe (a TokenReview of a random dummy token, run every
  ``readiness_interval`` seconds) got a clean answer -- any answer, "not authenticated" included,
  proves the hub can authenticate. Otherwise 503 with the reason. Cheap: never waits for the hub.
* ``/metrics`` -- Prometheus text (``gateway.ops.metrics``).
* ``/clusters`` -- the gateway's fleet as JSON (``gateway.hub.fleet``; ``hubproxy clusters``
  prints it), a page at a time (``?limit=&continue=``, filters ``?cluster=`` and ``?state=``; a
  bad parameter is a 400). Like everything on this port it is **unauthenticated**: cluster
  names, agent
  versions, certificate expiry and error reasons, never a secret, but an inventory. Keep
  ``--health-listen`` on a private address (loopback, or the pod IP behind a NetworkPolicy);
  to reach it from elsewhere, put an authenticating proxy in front (kube-rbac-proxy, as for
  any metrics port) or use ``kubectl port-forward``.

One tiny request per connection (``Connection: close``), GET/HEAD only, heads bounded by
``gateway.wire.http1`` limits: this port must stay boring. ``/metrics`` and ``/clusters`` grow
with the fleet, so they are built as generators of chunks, and the event loop runs between two
chunks: a scrape of 10,000 clusters never stalls the tunnel sessions' liveness checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable

from gateway.wire.http1 import HTTPError, Limits, find_head_end, parse_request_head

log = logging.getLogger("hubproxy.health")

HEALTH_LIMITS = Limits(max_head_bytes=8192, max_request_line=4096, max_field_line=4096,
                       max_headers=32)
READ_TIMEOUT = 5.0


class Readiness:
    """Is the gateway ready? Listeners, draining, and a periodic hub authentication probe."""

    def __init__(self, probe: Callable[[], Awaitable[None]], interval: float = 10.0) -> None:
        self.probe = probe  # raises when the hub cannot authenticate
        self.interval = interval
        self.listeners_up = False
        self.draining = False
        self.hub_ok_at: float | None = None
        self.hub_error = "hub authentication not checked yet"
        # More conditions (e.g. the instance readiness gate): each says why not ready, or None.
        self.gates: list[Callable[[], str | None]] = []
        self._task: asyncio.Task[None] | None = None

    def reason(self) -> str | None:
        """Why not ready, or None.

        The hub must have answered once (a gateway whose hub credential or address is wrong
        never turns Ready), but a later hub outage does not make it unready: every instance
        shares the hub, so the Service would lose all of them and clients would get refused
        connections, where a Ready instance still serves cached tokens and answers the others
        503 with Retry-After (``hubproxy_hub_requests_total{outcome="error"}`` shows the outage).
        """
        if self.draining:
            return "shutting down"
        if not self.listeners_up:
            return "listeners not up"
        if self.hub_ok_at is None:
            return self.hub_error
        for gate in self.gates:
            why = gate()
            if why is not None:
                return why
        return None

    async def check_once(self) -> None:
        try:
            await self.probe()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.hub_error = f"hub authentication unavailable ({type(exc).__name__})"
            return
        self.hub_ok_at = time.monotonic()

    async def _loop(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def token_review_probe(authenticate_raw: Callable[[str], Awaitable[object]]
                       ) -> Callable[[], Awaitable[None]]:
    """A probe that reviews a random dummy token; a clean rejection counts as success.

    ``authenticate_raw`` is the reviewer's ``review``-like call that raises only when the hub
    cannot answer (it must bypass the token cache).
    """

    async def probe() -> None:
        await authenticate_raw("hubproxy-readiness-probe." + secrets.token_urlsafe(16))

    return probe


def _response(code: int, reason: str, body: bytes, content_type: bytes = b"text/plain") -> bytes:
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
        b"Cache-Control: no-store\r\nConnection: close\r\n\r\n"
        % (code, reason.encode(), content_type, len(body))
    ) + body


async def collect(chunks: Iterable[bytes]) -> bytes:
    """Join a generator's chunks, letting the event loop run between two."""
    out = []
    for chunk in chunks:
        if chunk:
            out.append(chunk)
        await asyncio.sleep(0)
    return b"".join(out)


class HealthServer:
    """``metrics()`` returns the Prometheus text as chunks; ``clusters(query)`` the
    ``/clusters`` document for a query string as chunks, raising ValueError (a 400) for a bad
    parameter."""

    def __init__(self, readiness: Readiness, metrics: Callable[[], Iterable[bytes]],
                 clusters: Callable[[str], Iterable[bytes]] | None = None) -> None:
        self.readiness = readiness
        self.metrics = metrics
        self.clusters = clusters
        self.server: asyncio.base_events.Server | None = None

    async def answer(self, method: bytes, target: bytes) -> bytes:
        path, _, query = target.partition(b"?")
        if method not in (b"GET", b"HEAD"):
            return _response(405, "Method Not Allowed", b"method not allowed\n")
        if path in (b"/healthz", b"/livez"):
            response = _response(200, "OK", b"ok\n")
        elif path == b"/readyz":
            why = self.readiness.reason()
            if why is None:
                response = _response(200, "OK", b"ok\n")
            else:
                response = _response(503, "Service Unavailable",
                                     b"not ready: " + why.encode("ascii", "replace") + b"\n")
        elif path == b"/metrics":
            response = _response(200, "OK", await collect(self.metrics()),
                                 b"text/plain; version=0.0.4; charset=utf-8")
        elif path == b"/clusters" and self.clusters is not None:
            try:
                body = await collect(self.clusters(query.decode("ascii", "replace")))
            except ValueError as exc:
                return _response(400, "Bad Request", f"{exc}\n".encode("ascii", "replace"))
            response = _response(200, "OK", body, b"application/json")
        else:
            return _response(404, "Not Found", b"not found\n")
        if method == b"HEAD":
            response = response.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
        return response

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            buf = bytearray()
            async with asyncio.timeout(READ_TIMEOUT):
                while True:
                    chunk = await reader.read(4096)
                    if not chunk:
                        return
                    buf += chunk
                    end = find_head_end(buf, max_head_bytes=HEALTH_LIMITS.max_head_bytes,
                                        max_request_line=HEALTH_LIMITS.max_request_line)
                    if end >= 0:
                        break
            head = parse_request_head(bytes(buf[:end]), HEALTH_LIMITS)
            writer.write(await self.answer(head.method, head.target))
        except HTTPError as exc:
            writer.write(_response(exc.status, "Bad Request", b"bad request\n"))
        except (TimeoutError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(self._handle, host, port)
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
