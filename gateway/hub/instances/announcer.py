"""Live instance discovery (issue 13): this process's Lease on the hub, and the live set.

:class:`InstanceAnnouncer` creates this instance's Lease (see :mod:`.leases`), renews it every
``duration / 3``, lists the instance Leases every ``interval`` and, when the live set changes,
hands it to ``on_change`` (the gateway announces it to its agents over the tunnel, HUB_PEER).
When clusters come or go the Lease is written again with the new list, coalesced: at most one
write per ``PUBLISH_GAP`` however many clusters changed (a storm of 10,000 reconnecting agents
costs about one write a second, not one per agent), each at the process's shared hub write
rate (:mod:`gateway.hub.hubwrites`).
The set always holds this instance, whatever the hub says. On :meth:`stop` the Lease is
deleted, so peers and agents stop counting this instance at their next listing.

When the hub cannot be reached (an outage) nothing changes: the last set stays, renewals are
retried each period, and agents keep their sessions. The announcer never fails the gateway.

The readiness gate (:meth:`readiness_reason`, issue 13 item 2, design (a)): a new instance is
not Ready until it serves every cluster the other live instances publish, or until
``ready_wait`` has passed since it started; once ready it stays ready (a cluster that leaves
later does not take the whole instance out of the Service).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from gateway.hub.config import GatewayConfig
from gateway.hub.hubwrites import HubWrites
from gateway.hub.instances import leases

log = logging.getLogger("hubproxy.gateway")

DEFAULT_DURATION = GatewayConfig.lease_duration  # seconds a Lease stays live without renewal
DEFAULT_INTERVAL = 2.0  # listing period: how soon a new or departed instance is seen
PUBLISH_GAP = 1.0  # between two steps, however often clusters come and go (bounds Lease writes)
RESOURCE = "leases"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class InstanceAnnouncer:
    def __init__(self, api_client: Any, namespace: str, instance: int,
                 clusters: Callable[[], list[str]],
                 on_change: Callable[[tuple[int, ...]], None], *,
                 duration: int = DEFAULT_DURATION, interval: float = DEFAULT_INTERVAL,
                 ready_wait: float = GatewayConfig.ready_wait, holder: str | None = None,
                 writes: HubWrites | None = None) -> None:
        from kubernetes_asyncio import client

        self.api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.instance = instance
        self.name = leases.lease_name(instance)
        self.holder = holder or f"{socket.gethostname()}/{instance:08x}"
        self.clusters = clusters
        self.on_change = on_change
        self.duration = duration
        self.interval = interval
        self.ready_wait = ready_wait
        self.live: dict[int, leases.LiveInstance] = {}
        self.peers: tuple[int, ...] = (instance,)
        self.started_at = time.monotonic()
        self.ready = False
        self.listed = False  # at least one listing succeeded
        self._renewed_at = 0.0
        self._listed_at = float("-inf")
        self._clusters_changed = True  # the list must be read again before the next write
        self._version: str | None = None  # resourceVersion of our Lease; None: not created
        self._published: list[str] = []  # the clusters our Lease names
        self._wake = asyncio.Event()  # a cluster came or went: publish it now
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self.writes = writes or HubWrites()

    # --- readiness gate ------------------------------------------------------------------------

    def readiness_reason(self) -> str | None:
        if self.ready:
            return None
        waited = time.monotonic() - self.started_at
        if waited >= self.ready_wait:
            self._become_ready("the readiness wait passed")
            return None
        if not self.listed:
            return "instance discovery: the hub's instance Leases not listed yet"
        missing = leases.missing_clusters(set(self.clusters()), self.live, self.instance)
        if missing:
            shown = ", ".join(sorted(missing)[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            return (f"waiting for agents of {len(missing)} cluster(s) other instances serve "
                    f"({shown}{more}); ready anyway after {self.ready_wait:.0f}s")
        self._become_ready("it serves every cluster the other instances serve")
        return None

    def _become_ready(self, why: str) -> None:
        self.ready = True
        log.info("instance %08x ready: %s", self.instance, why)

    # --- loop ----------------------------------------------------------------------------------

    def cluster_changed(self, _cluster: str, _connected: bool) -> None:
        """Registry subscriber: publish the new cluster list soon (within PUBLISH_GAP, not at
        the next period), so a peer that starts now does not read a list without the cluster
        and turn Ready."""
        self._clusters_changed = True
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.step()
                if self._failures:
                    log.info("instance Leases reachable again")
                self._failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the hub is down or refuses: keep the last set
                self._failures += 1
                if self._failures in (1, 10) or self._failures % 100 == 0:
                    log.warning("instance Lease %s/%s: %s (keeping the last live set of %d)",
                                self.namespace, self.name, _why(exc), len(self.peers))
            await asyncio.sleep(PUBLISH_GAP)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._until_due()):  # see DirtyKeys.next
                    await self._wake.wait()
            self._wake.clear()

    def _until_due(self) -> float:
        """Seconds until the next renewal or listing is due."""
        now_m = time.monotonic()
        renew = self._renewed_at + self.duration / 3 - now_m
        listing = self._listed_at + self.interval - now_m
        return max(0.0, min(renew, listing))

    async def step(self) -> None:
        """Renew (or create) our Lease when due or when the clusters changed, then list the
        live instances when that is due."""
        now_m = time.monotonic()
        renew_due = self._version is None or now_m - self._renewed_at >= self.duration / 3
        if renew_due or self._clusters_changed:
            self._clusters_changed = False
            clusters = sorted(self.clusters())
            # Also at once when the clusters changed: a new peer's readiness gate reads them.
            if renew_due or clusters != self._published:
                await self._renew(clusters)
                self._renewed_at = now_m
                self._published = clusters
        if now_m - self._listed_at < self.interval and self.listed:
            return
        listing = await self.api.list_namespaced_lease(
            self.namespace, label_selector=leases.SELECTOR)
        self._listed_at = now_m
        self.live = leases.live_instances(list(listing.items or []), _now())
        self.listed = True
        peers = tuple(sorted({self.instance, *self.live}))
        if peers != self.peers:
            log.info("live gateway instances: %d (%s)", len(peers),
                     " ".join(f"{p:08x}" for p in peers))
            self.peers = peers
            self.on_change(peers)

    async def _renew(self, clusters: list[str]) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        # The whole Lease each time (update with the version we last wrote: Leases refuse
        # unconditional updates), so the RBAC needs no patch verb.
        body = leases.lease_body(self.instance, self.holder, self.duration, clusters, _now())
        send = self.writes.send
        if self._version is not None:
            body["metadata"]["resourceVersion"] = self._version
            try:
                written = await send(RESOURCE, lambda: self.api.replace_namespaced_lease(
                    self.name, self.namespace, body))
                self._version = written.metadata.resource_version
                return
            except ApiException as exc:
                if exc.status == 409:  # written by someone else: take its version, retry
                    current = await send(RESOURCE, self._read, write=False)
                    self._version = current.metadata.resource_version
                    return await self._renew(clusters)
                if exc.status != 404:
                    raise
                self._version = None  # deleted under us: create it again
                del body["metadata"]["resourceVersion"]
        try:
            written = await send(RESOURCE, lambda: self.api.create_namespaced_lease(
                self.namespace, body))
        except ApiException as exc:
            if exc.status != 409:
                raise
            written = await send(RESOURCE, self._read, write=False)
            body["metadata"]["resourceVersion"] = written.metadata.resource_version
            written = await send(RESOURCE, lambda: self.api.replace_namespaced_lease(
                self.name, self.namespace, body))
        self._version = written.metadata.resource_version
        log.info("instance Lease %s/%s held (instance %08x)", self.namespace, self.name,
                 self.instance)

    async def _read(self) -> Any:
        return await self.api.read_namespaced_lease(self.name, self.namespace)

    async def stop(self, timeout: float = 2.0) -> None:
        """Stop renewing and delete our Lease (bounded: a hub outage must not hold a shutdown)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._version is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await self.api.delete_namespaced_lease(self.name, self.namespace)
            self._version = None
            log.info("instance Lease %s/%s deleted", self.namespace, self.name)
        except Exception as exc:  # it expires on its own
            log.warning("instance Lease %s/%s not deleted (%s); it expires in %ds",
                        self.namespace, self.name, _why(exc), self.duration)


def _why(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status:
        return f"HTTP {status} {reason or ''}".strip()
    return str(exc) or type(exc).__name__
