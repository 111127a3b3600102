"""Which clusters the hub knows: its cluster inventory (``--cluster-inventory``).

A request for a cluster that is not connected is 404 (unknown) or 503 (known, not connected,
retry). The registry only knows connected clusters; without an inventory the gateway can only
guess: clusters seen since start are known, and for ``--unknown-cluster-grace`` after start
every name is (agents of a restarted gateway are still reconnecting), so a misspelt cluster is
503 for a minute. Where the hub has an inventory, it decides at once:

* ``managedclusters`` -- OCM ``ManagedCluster`` objects (cluster.open-cluster-management.io/v1,
  cluster-scoped; the object's name is the cluster's);
* ``clusterprofiles`` -- ``ClusterProfile`` objects (multicluster.x-k8s.io/v1alpha1, in the
  ``--clusterprofile-namespace`` namespaces or all; the object's name is the cluster's, as for
  the access-provider writer);
* ``auto`` (default) -- the first of those two whose API exists on the hub, may be listed by
  the gateway, and lists at least one object (an installed but unused CRD is not an inventory);
  neither: ``none``. Decided once at start (retried while the hub cannot answer);
* ``none`` -- no inventory: the time-based grace.

:meth:`ClusterInventory.listed` answers True/False once the inventory has been listed, and None
(no answer: the grace applies) before that or without an inventory. The list is kept by
list + watch (names only are kept); when the watch fails the last list stays in use while it
is relisted with backoff. Hub RBAC: list/watch of the chosen resource (deploy/hub grants both).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("hubproxy.gateway")

MODES = ("auto", "managedclusters", "clusterprofiles", "none")
APIS: dict[str, tuple[str, str, str]] = {
    "managedclusters": ("cluster.open-cluster-management.io", "v1", "managedclusters"),
    "clusterprofiles": ("multicluster.x-k8s.io", "v1alpha1", "clusterprofiles"),
}
KIND_NAMES = {"managedclusters": "ManagedCluster", "clusterprofiles": "ClusterProfile"}

ItemKey = tuple[str, str]  # (namespace, name)


class ClusterInventory:
    """See the module docstring. ``run`` until cancelled; ``listed`` at any time."""

    def __init__(self, api_client: Any, mode: str, namespaces: Sequence[str] = (),
                 *, max_backoff: float = 30.0) -> None:
        from kubernetes_asyncio import client

        if mode not in MODES:
            raise ValueError(f"cluster inventory {mode!r}: expected one of {', '.join(MODES)}")
        self._api = client.CustomObjectsApi(api_client)
        self.mode = mode
        self.kind: str | None = mode if mode in APIS else None  # decided by run() for "auto"
        self.namespaces = list(namespaces)
        self.max_backoff = max_backoff
        self._items: dict[ItemKey, str] = {}
        self._names: Counter[str] = Counter()
        self._listed: set[str] = set()  # namespaces ("" = all) listed at least once

    # --- answers ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.kind is not None and set(self._scopes()) <= self._listed

    def listed(self, cluster: str) -> bool | None:
        """Does the hub's inventory know ``cluster``? None: no inventory (yet)."""
        if not self.synced:
            return None
        return self._names[cluster] > 0

    # --- keeping it --------------------------------------------------------------------------

    async def run(self) -> None:
        if self.mode == "none":
            return
        if self.kind is None:
            self.kind = await self._detect()
            if self.kind is None:
                log.info("cluster inventory: none on the hub (no ManagedCluster or "
                         "ClusterProfile objects the gateway may list); unknown clusters get "
                         "503 during --unknown-cluster-grace after start")
                return
        log.info("cluster inventory: %s objects on the hub decide 404 (unknown) or 503 (not "
                 "connected)", KIND_NAMES[self.kind])
        await asyncio.gather(*(self._watch(scope) for scope in self._scopes()))

    def _scopes(self) -> list[str]:
        if self.kind == "clusterprofiles" and self.namespaces:
            return list(self.namespaces)
        return [""]

    def _list_call(self, kind: str, namespace: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
        group, version, plural = APIS[kind]
        if namespace:
            return self._api.list_namespaced_custom_object, (group, version, namespace, plural)
        return self._api.list_cluster_custom_object, (group, version, plural)

    async def _detect(self) -> str | None:
        """The first usable inventory API, retrying while the hub cannot answer."""
        backoff = 1.0
        while True:
            try:
                for kind in APIS:
                    if await self._usable(kind):
                        return kind
                return None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster inventory: cannot ask the hub (%s); retrying in %.0fs",
                            type(exc).__name__, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    async def _usable(self, kind: str) -> bool:
        """True if ``kind`` exists, may be listed and lists something; raises on hub errors."""
        previous, self.kind = self.kind, kind
        scopes = self._scopes()
        self.kind = previous
        for scope in scopes:
            call, args = self._list_call(kind, scope)
            try:
                answer = await call(*args, limit=1)
            except Exception as exc:
                status = getattr(exc, "status", None)
                if status in (403, 404):
                    log.info("cluster inventory: %s not usable (HTTP %s: %s)", KIND_NAMES[kind],
                             status, "no such API" if status == 404 else "not allowed to list")
                    return False
                raise
            if answer.get("items"):
                return True
        return False

    async def _watch(self, scope: str) -> None:
        from kubernetes_asyncio import watch

        assert self.kind is not None
        call, args = self._list_call(self.kind, scope)
        backoff = 1.0
        while True:
            try:
                answer = await call(*args)
                self._replace(scope, answer.get("items") or [])
                resource_version = answer["metadata"]["resourceVersion"]
                async with watch.Watch().stream(
                    call, *args, resource_version=resource_version, timeout_seconds=300
                ) as events:
                    async for event in events:
                        self._apply(event)
                        backoff = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The last list stays in use: a hub hiccup must not turn known clusters into
                # unknown ones.
                log.warning("cluster inventory: watching %s failed (%s); relisting in %.0fs",
                            KIND_NAMES[self.kind], type(exc).__name__, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    def _replace(self, scope: str, items: list[dict[str, Any]]) -> None:
        for key in [k for k in self._items if not scope or k[0] == scope]:
            self._forget(key)
        for item in items:
            self._remember(item)
        self._listed.add(scope)

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            return
        if kind == "DELETED":
            self._forget(_key(obj))
        elif kind in ("ADDED", "MODIFIED"):
            self._remember(obj)

    def _remember(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        if key not in self._items:
            self._items[key] = key[1]
            self._names[key[1]] += 1

    def _forget(self, key: ItemKey) -> None:
        name = self._items.pop(key, None)
        if name is not None:
            self._names[name] -= 1
            if self._names[name] <= 0:
                del self._names[name]


def _key(obj: dict[str, Any]) -> ItemKey:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def start(inventory: ClusterInventory) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(inventory.run(), name="cluster-inventory")


async def stop(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
