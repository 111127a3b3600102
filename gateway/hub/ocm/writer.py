"""Keeps the ``TunnelConnected`` condition of each served cluster's ``ManagedClusterAddOn``.

For every cluster whose agent has connected to this gateway process since it started, the
add-on ``<addon>`` in namespace ``<cluster>`` (where OCM keeps it) says ``True`` while an agent
is connected and ``False`` once none has been for ``grace`` seconds (a reconnecting agent must
not make the condition flap). A cluster that never connected here is not touched: this process
knows nothing about it. A cluster without the add-on (404) is skipped.

Writes follow the registry's connect and disconnect events and a resync every
``resync_interval`` seconds, which also repairs a condition someone else removed.

Hub RBAC needed: get ``managedclusteraddons``, patch ``managedclusteraddons/status``
(``deploy/ocm``). Nothing else is read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from gateway.hub.config import AddOnConditionSettings
from gateway.hub.ocm.condition import GROUP, PLURAL, VERSION, status_patch

log = logging.getLogger("hubproxy.ocm")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    ) -> None:
        from kubernetes_asyncio import client

        self._api = client.CustomObjectsApi(api_client)
        self.addon = addon
        self._connected = connected_clusters
        self.grace = grace
        self.resync_interval = resync_interval
        self._clock = clock
        self._timestamp = timestamp
        self._seen: set[str] = set(connected_clusters())
        self._left_at: dict[str, float] = {}
        self._wakeup = asyncio.Event()
        self.patches = 0  # observable for tests

    def cluster_changed(self, cluster: str, connected: bool) -> None:
        """Registry callback: an agent arrived, or the last one left."""
        self._seen.add(cluster)
        if connected:
            self._left_at.pop(cluster, None)
        else:
            self._left_at[cluster] = self._clock()
        self._wakeup.set()

    def desired(self, cluster: str) -> bool | None:
        """True/False to write, or None to leave the condition as it is (within the grace)."""
        if cluster in self._connected():
            return True
        left = self._left_at.get(cluster)
        if left is not None and self._clock() - left < self.grace:
            return None
        return False

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self._sleep_for())
            self._wakeup.clear()
            await self.reconcile_all()

    def _sleep_for(self) -> float:
        """Until the next resync, or until a cluster's grace ends, whichever is first."""
        now = self._clock()
        ends = [left + self.grace - now for left in self._left_at.values()
                if now - left < self.grace]
        return min([self.resync_interval, *ends]) + 0.05

    async def reconcile_all(self) -> None:
        for cluster in sorted(self._seen):
            connected = self.desired(cluster)
            if connected is None:
                continue
            try:
                await self._reconcile(cluster, connected)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the hub is down or refuses: the resync tries again
                log.warning("ManagedClusterAddOn %s/%s: condition not written (%s)", cluster,
                            self.addon, type(exc).__name__)

    async def _reconcile(self, cluster: str, connected: bool) -> None:
        from kubernetes_asyncio.client import ApiException

        for _attempt in range(3):
            try:
                addon = await self._api.get_namespaced_custom_object(
                    GROUP, VERSION, cluster, PLURAL, self.addon)
            except ApiException as exc:
                if exc.status == 404:
                    return  # not installed through OCM on this cluster
                raise
            patch = status_patch(addon, connected, self._timestamp())
            if patch is None:
                return
            try:
                await self._api.patch_namespaced_custom_object_status(
                    GROUP, VERSION, cluster, PLURAL, self.addon, patch,
                    _content_type="application/merge-patch+json")
            except ApiException as exc:
                if exc.status in (404, 409):
                    continue  # gone, or changed under us: read again
                raise
            self.patches += 1
            log.info("ManagedClusterAddOn %s/%s: TunnelConnected=%s", cluster, self.addon,
                     connected)
            return
