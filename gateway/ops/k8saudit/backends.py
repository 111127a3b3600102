"""Where Kubernetes-format audit events go: a log file, or a webhook (kube-apiserver's two).

Both take finished JSON lines (:func:`gateway.ops.k8saudit.event.event_line`) through
:meth:`emit`, which never blocks and never raises: a request is never held up by its audit.

* :class:`LogBackend` -- one event per line, appended to a file (or stdout), written once per
  event-loop turn like the gateway's own audit line (``gateway.ops.audit.AuditWriter``; with
  ``--workers``, each write is cut at line ends below ``PIPE_BUF`` so the workers' lines never
  interleave). Rotate it with ``copytruncate`` (the file is opened in append mode).
* :class:`WebhookBackend` -- events are buffered (at most ``buffer_size``; one more is dropped
  and counted, ``buffer_full``) and posted as an ``audit.k8s.io/v1`` ``EventList`` of at most
  ``batch_max_size`` events, at the latest ``batch_max_wait`` after the first of them arrived,
  one batch at a time. A batch that fails (connection error, timeout, HTTP 429 or 5xx) is sent
  again after ``initial_backoff``, growing 1.5 times with 20 % jitter, ``max_attempts`` times in
  all (kube-apiserver's webhook backoff), then dropped and counted (``send_failed``); another
  4xx drops it at once (``rejected``: sending it again cannot help). On shutdown what is
  buffered is sent for at most the close timeout, the rest counted (``shutdown``).

Defaults are kube-apiserver's where they apply (``--audit-webhook-batch-max-size`` 400,
``--audit-webhook-batch-buffer-size`` 10000); the wait and the backoff are shorter (5 s and 1 s
instead of 30 s and 10 s), so a SIEM sees events sooner and a brief outage costs less.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

from gateway.ops.audit import AuditWriter

log = logging.getLogger("hubproxy.audit")

LOG = "log"
WEBHOOK = "webhook"
BUFFER_FULL = "buffer_full"
SEND_FAILED = "send_failed"
REJECTED = "rejected"
SHUTDOWN = "shutdown"
WRITE_FAILED = "write_failed"
# Why each backend loses events (the metric's label values).
DROP_REASONS = {LOG: (WRITE_FAILED,), WEBHOOK: (BUFFER_FULL, SEND_FAILED, REJECTED, SHUTDOWN)}
BACKOFF_FACTOR = 1.5
BACKOFF_JITTER = 0.2
SEND_TIMEOUT = 30.0  # seconds for one POST, as kube-apiserver's webhook client


@dataclass(frozen=True)
class WebhookSettings:
    """The webhook backend's knobs (``--audit-webhook-*``); the defaults are the flags'."""

    batch_max_size: int = 400
    batch_max_wait: float = 5.0
    buffer_size: int = 10000
    initial_backoff: float = 1.0
    max_attempts: int = 5


class WebhookError(Exception):
    """The webhook answered with a status that is not 2xx."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.status == 429 or self.status >= 500


class LogBackend:
    """Events appended to a text stream, one per line; see the module docstring."""

    name = LOG

    def __init__(self, stream: TextIO, *, atomic: bool = False, owned: bool = False) -> None:
        self.writer = AuditWriter(stream, atomic=atomic)
        self.owned = owned  # close the stream on close (a file we opened)
        self.events = 0

    @classmethod
    def to_file(cls, path: str, *, atomic: bool = False) -> LogBackend:
        """Append to ``path`` (created 0600 if new: audit trails are not for everyone)."""
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        stream = os.fdopen(fd, "a", encoding="ascii")  # closed by close()
        return cls(stream, atomic=atomic, owned=True)

    def emit(self, line: str) -> None:
        self.events += 1
        self.writer.write(line)

    def start(self) -> None:
        return None

    async def close(self, timeout: float = 5.0) -> None:
        self.writer.flush()
        if self.owned:
            with contextlib.suppress(OSError):
                self.writer.stream.close()

    def dropped(self) -> dict[str, int]:
        return {WRITE_FAILED: self.writer.lost} if self.writer.lost else {}


def event_list(lines: list[str]) -> bytes:
    """The webhook's body: an ``EventList`` around already-serialized events."""
    return (b'{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":['
            + ",".join(lines).encode("ascii") + b"]}")


class WebhookBackend:
    """Events posted in batches; see the module docstring. ``send`` posts one body and raises
    (:class:`WebhookError` for an HTTP status, anything else for a failed connection)."""

    name = WEBHOOK

    def __init__(self, send: Callable[[bytes], Awaitable[None]],
                 settings: WebhookSettings = WebhookSettings(), *,
                 on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.send = send
        self.settings = settings
        self.on_close = on_close
        self.buffer: deque[str] = deque()
        self.events = 0  # events delivered
        self.batches = 0  # batches delivered
        self.lost: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def emit(self, line: str) -> None:
        if len(self.buffer) >= self.settings.buffer_size or self._closing:
            self.lost[BUFFER_FULL if not self._closing else SHUTDOWN] += 1
            return
        self.buffer.append(line)
        if len(self.buffer) == 1 or len(self.buffer) >= self.settings.batch_max_size:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def dropped(self) -> dict[str, int]:
        return dict(self.lost)

    async def _run(self) -> None:
        settings = self.settings
        while True:
            while not self.buffer:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
            # The first event of a batch is here: wait for the batch to fill, at most so long.
            if len(self.buffer) < settings.batch_max_size and not self._closing:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(settings.batch_max_wait):
                        while len(self.buffer) < settings.batch_max_size and not self._closing:
                            await self._wake.wait()
                            self._wake.clear()
            count = min(len(self.buffer), settings.batch_max_size)
            batch = [self.buffer.popleft() for _ in range(count)]
            await self._deliver(batch)

    async def _deliver(self, batch: list[str]) -> None:
        try:
            await self._attempts(batch)
        except asyncio.CancelledError:  # shutdown's deadline, mid-send or mid-backoff
            self.lost[SHUTDOWN] += len(batch)
            raise

    async def _attempts(self, batch: list[str]) -> None:
        body = event_list(batch)
        delay = self.settings.initial_backoff
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                await self.send(body)
            except WebhookError as exc:
                if not exc.retryable:
                    log.error("audit webhook refused %d events (%s): dropped", len(batch), exc)
                    self.lost[REJECTED] += len(batch)
                    return
                why = str(exc)
            except Exception as exc:  # connection refused, TLS, timeout, ...
                why = type(exc).__name__
            else:
                self.events += len(batch)
                self.batches += 1
                return
            if attempt == attempts:
                break
            log.warning("audit webhook failed (%s), attempt %d of %d; retrying in %.1fs", why,
                        attempt, attempts, delay)
            await asyncio.sleep(delay * random.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER))
            delay *= BACKOFF_FACTOR
        log.error("audit webhook failed %d times: %d events dropped", attempts, len(batch))
        self.lost[SEND_FAILED] += len(batch)

    async def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered for at most ``timeout`` seconds; count the rest as lost."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self._task)
            except (TimeoutError, asyncio.CancelledError, Exception):
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
        if self.buffer:
            self.lost[SHUTDOWN] += len(self.buffer)
            self.buffer.clear()
        if self.on_close is not None:
            await self.on_close()


async def kubeconfig_sender(path: str, *, timeout: float = SEND_TIMEOUT,
                            user_agent: str = "hubproxy") -> tuple[
        Callable[[bytes], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """``(send, close)`` for the webhook a kubeconfig names, as kube-apiserver's
    ``--audit-webhook-config-file``: the current context's cluster ``server`` is the URL, its
    CA (or the system roots) verifies it, and the user's client certificate or token (file or
    exec plugin, refreshed) authenticates the gateway."""
    import aiohttp
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=path, client_configuration=configuration,
                                  persist_config=False)
    api_client = client.ApiClient(configuration=configuration)
    url = configuration.host
    limit = aiohttp.ClientTimeout(total=timeout)

    async def send(body: bytes) -> None:
        headers: dict[str, Any] = {"Content-Type": "application/json",
                                   "Accept": "application/json", "User-Agent": user_agent}
        await api_client.update_params_for_auth(headers, [], ["BearerToken"])
        session = api_client.rest_client.pool_manager
        async with session.request("POST", url, data=body, headers=headers,
                                   timeout=limit) as response:
            await response.read()
            if not 200 <= response.status < 300:
                raise WebhookError(response.status)

    async def close() -> None:
        await api_client.close()

    return send, close
