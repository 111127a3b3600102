"""Keeps the ``TunnelConnected`` condition of each served cluster's ``ManagedClusterAddOn``.

For every cluster whose agent has connected to this gateway process since it started, the
add-on ``<addon>`` in namespace ``<cluster>`` (where OCM keeps it) says ``True`` while an agent
is connected and ``False`` once none has been for ``grace`` seconds (a reconnecting agent must
not make the condition flap). A cluster that never connected here is not touched: this process
knows nothing about it. A cluster without the add-on (404) is skipped.

Writes are coalesced per cluster and rate-limited (:mod:`gateway.hub.hubwrites`): a connect or
disconnect marks the cluster; one worker takes each marked cluster, computes the condition then
and patches only if the add-on, as last read, says otherwise. The add-ons are followed with one
paginated list of every add-on named ``<addon>`` and then a watch (a ``metadata.name`` field
selector, which RBAC lets a ``resourceNames`` rule allow; :mod:`gateway.hub.hubwatch`): a
condition someone else removes is seen and written again. Every ``resync_interval`` seconds
each cluster that connected here is checked against what was read, which costs the hub nothing.
Without the ``list`` permission the writer falls back to reading each add-on before writing it
(one GET per marked cluster, and per cluster every resync, at the same shared rate) and says so
once; without ``watch`` it lists every ``resync_interval`` seconds.

Hub RBAC needed: get, list and watch ``managedclusteraddons`` (named ``<addon>``), patch
``managedclusteraddons/status`` (``deploy/ocm``). Nothing else is read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from gateway.hub.config import AddOnConditionSettings
from gateway.hub.hubwatch import follow
from gateway.hub.hubwrites import DirtyKeys, HubWrites, drain
from gateway.hub.ocm.condition import GROUP, PLURAL, VERSION, status_patch

log = logging.getLogger("hubproxy.ocm")

RESOURCE = "managedclusteraddons"
RESYNC_STEP = 256  # clusters checked between two turns of the event loop


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _trimmed(addon: dict[str, Any]) -> dict[str, Any]:
    """What the writer keeps of an add-on: enough to compute its patch (a few hundred bytes
    per cluster instead of the whole object)."""
    metadata = addon.get("metadata") or {}
    kept = {k: metadata[k] for k in ("name", "namespace", "resourceVersion", "generation")
            if k in metadata}
    return {"metadata": kept,
            "status": {"conditions": list((addon.get("status") or {}).get("conditions") or [])}}


class AddOnConditionWriter:
    def __init__(
        self,
        api_client: Any,
        *,
        addon: str,
        connected_clusters: Callable[[], Collection[str]],
        grace: float = AddOnConditionSettings.grace,
        resync_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        timestamp: Callable[[], str] = _now,
        writes: HubWrites | None = None,
    ) -> None:
        from kubernetes_asyncio import client

        self._api = client.CustomObjectsApi(api_client)
        self.addon = addon
        self.grace = grace
        self.resync_interval = resync_interval
        self._clock = clock
        self._timestamp = timestamp
        self._connected: set[str] = set(connected_clusters())
        self._seen: set[str] = set(self._connected)
        self._left_at: dict[str, float] = {}
        # The add-on of each cluster as last read or written; None: it does not exist.
        self.addons: dict[str, dict[str, Any] | None] = {}
        # True: the add-ons are listed and watched; False: no permission, each is read before
        # it is written; None: not known yet (the first list is under way).
        self.listing: bool | None = None
        self._check = asyncio.Event()  # check every cluster now (a list landed)
        self.dirty: DirtyKeys[str] = DirtyKeys(clock)
        self.writes = writes or HubWrites()
        self.writes.register(RESOURCE, lambda: len(self.dirty))
        self.patches = 0  # observable for tests
        for cluster in self._seen:
            self.dirty.mark(cluster)

    def cluster_changed(self, cluster: str, connected: bool) -> None:
        """Registry callback: an agent arrived, or the last one left. O(1)."""
        self._seen.add(cluster)
        if connected:
            self._connected.add(cluster)
            self._left_at.pop(cluster, None)
            self.dirty.mark(cluster)
        else:
            self._connected.discard(cluster)
            self._left_at[cluster] = self._clock()
            self.dirty.mark_at(cluster, self._clock() + self.grace)

    def desired(self, cluster: str) -> bool | None:
        """True/False to write, or None to leave the condition as it is (within the grace)."""
        if cluster in self._connected:
            return True
        left = self._left_at.get(cluster)
        if left is not None and self._clock() - left < self.grace:
            return None
        return False

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._follow(), name="ocm-addon-follow"),
                 asyncio.create_task(self._resync(), name="ocm-addon-resync")]
        try:
            await drain(self.dirty, self._sync, f"ManagedClusterAddOn {self.addon} in")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self) -> None:
        await follow(self.writes, RESOURCE, f"ManagedClusterAddOns {self.addon}",
                     self._api.list_cluster_custom_object, (GROUP, VERSION, PLURAL),
                     kwargs={"field_selector": f"metadata.name={self.addon}"},
                     replace=self._replace, apply=self._apply_event, forbidden=self._no_list,
                     relist_every=self.resync_interval)

    def _no_list(self) -> None:
        log.info("no permission to list ManagedClusterAddOns %s: reading each one before "
                 "writing it instead (grant list and watch, named %s, for fewer hub requests)",
                 self.addon, self.addon)
        self.listing = False
        self._check.set()

    def _replace(self, items: list[dict[str, Any]]) -> None:
        listed = {}
        for item in items:
            metadata = item.get("metadata") or {}
            if metadata.get("name") == self.addon and metadata.get("namespace"):
                listed[metadata["namespace"]] = _trimmed(item)
        self.addons = {cluster: listed.get(cluster) for cluster in self._seen}
        self.addons.update(listed)
        self.listing = True
        self._check.set()

    def _apply_event(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            return
        metadata = obj.get("metadata") or {}
        cluster = metadata.get("namespace")
        if metadata.get("name") != self.addon or not cluster:
            return
        if kind == "DELETED":
            self.addons[cluster] = None
        elif kind in ("ADDED", "MODIFIED"):
            self.addons[cluster] = _trimmed(obj)
        else:
            return
        if cluster in self._seen:
            self.dirty.mark(cluster)

    async def _resync(self) -> None:
        """Every ``resync_interval`` (and when a list lands): check each cluster that connected
        here against what the list and the watch say, a step of RESYNC_STEP at a time, and
        mark those that need a write; without the list permission, forget what was read, so
        each is read again."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.resync_interval):  # see DirtyKeys.next
                    await self._check.wait()
            self._check.clear()
            if self.listing is None:
                continue
            if self.listing is False:
                self.addons.clear()
            seen = list(self._seen)
            for start in range(0, len(seen), RESYNC_STEP):
                for cluster in seen[start:start + RESYNC_STEP]:
                    if self.listing is False or self._wanted_patch(cluster) is not None:
                        self.dirty.mark(cluster)
                await asyncio.sleep(0)

    async def _read(self, cluster: str) -> dict[str, Any] | None:
        from kubernetes_asyncio.client import ApiException

        try:
            addon = await self.writes.send(
                RESOURCE, lambda: self._api.get_namespaced_custom_object(
                    GROUP, VERSION, cluster, PLURAL, self.addon), write=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _trimmed(addon)

    async def _sync(self, cluster: str) -> None:
        """Make one cluster's condition right, if it is not (three tries against conflicts).

        The patch is computed again once the rate lets it go: it carries the state of that
        moment, not of the moment the cluster was marked.
        """
        from kubernetes_asyncio.client import ApiException

        if self.listing is None:
            return  # the add-ons are being listed: every cluster is checked once they are
        for _attempt in range(3):
            # Listed and watched, an add-on we have not seen does not exist; without the list,
            # each is read before it is written.
            if self.listing is False and cluster not in self.addons and \
                    self.desired(cluster) is not None:
                self.addons[cluster] = await self._read(cluster)
            if self._wanted_patch(cluster) is None:
                return
            await self.writes.rate.take()
            wanted = self._wanted_patch(cluster)
            if wanted is None:
                return
            connected, patch = wanted
            try:
                written = await self.writes.send(
                    RESOURCE, functools.partial(
                        self._api.patch_namespaced_custom_object_status,
                        GROUP, VERSION, cluster, PLURAL, self.addon, patch,
                        _content_type="application/merge-patch+json"), take=False)
            except ApiException as exc:
                if exc.status in (404, 409):  # gone, or changed under us: read it again
                    self.addons[cluster] = await self._read(cluster)
                    continue
                raise
            self.addons[cluster] = _trimmed(written)
            self.patches += 1
            log.info("ManagedClusterAddOn %s/%s: TunnelConnected=%s", cluster, self.addon,
                     connected)
            return

    def _wanted_patch(self, cluster: str) -> tuple[bool, dict[str, Any]] | None:
        """What to write now (the condition and the patch), or None: nothing (right already,
        within the grace, not installed, or not read yet)."""
        connected = self.desired(cluster)
        if connected is None:
            self.dirty.mark_at(cluster, self._left_at[cluster] + self.grace)
            return None
        addon = self.addons.get(cluster)
        if addon is None:
            return None  # not installed through OCM on this cluster (or not read)
        patch = status_patch(addon, connected, self._timestamp())
        return None if patch is None else (connected, patch)
