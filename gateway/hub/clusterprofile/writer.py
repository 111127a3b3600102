"""Keeps this gateway's access-provider entry on the hub's ClusterProfiles.

For every ClusterProfile in the watched namespaces whose cluster this gateway serves (an agent
is connected, or was within ``grace`` seconds: a reconnecting agent must not make consumers
flap), the profile carries exactly one ``status.accessProviders`` entry named
``provider_name``; for every other profile it carries none. The CA published is re-read on each
resync, so a rotated front CA reaches consumers without a restart.

Hub RBAC needed: get/list/watch ``clusterprofiles``, patch ``clusterprofiles/status``. Nothing
else is read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from gateway.hub.clusterprofile.provider import (
    GROUP,
    PLURAL,
    VERSION,
    access_provider_entry,
    cluster_of,
    status_patch,
)
from gateway.hub.config import ClusterProfileSettings

log = logging.getLogger("hubproxy.clusterprofile")

ProfileKey = tuple[str, str]  # (namespace, name)


class AccessProviderWriter:
    def __init__(
        self,
        api_client: Any,
        *,
        provider_name: str,
        public_url: str,
        ca_bundle: Callable[[], bytes],
        connected_clusters: Callable[[], Collection[str]],
        namespaces: Sequence[str] = (),
        grace: float = ClusterProfileSettings.grace,
        resync_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes_asyncio import client

        self._api = client.CustomObjectsApi(api_client)
        self.provider_name = provider_name
        self.public_url = public_url
        self._ca_bundle = ca_bundle
        self._connected = connected_clusters
        self.namespaces = list(namespaces)
        self.grace = grace
        self.resync_interval = resync_interval
        self._clock = clock
        self.profiles: dict[ProfileKey, dict[str, Any]] = {}
        self._left_at: dict[str, float] = {}
        self._wakeup = asyncio.Event()
        self.patches = 0  # observable for tests and metrics

    # --- what we publish ---

    def cluster_changed(self, cluster: str, connected: bool) -> None:
        """Registry callback: an agent arrived or the last one left."""
        if connected:
            self._left_at.pop(cluster, None)
        else:
            self._left_at[cluster] = self._clock()
        self._wakeup.set()

    def served(self, cluster: str) -> bool:
        if cluster in self._connected():
            return True
        left = self._left_at.get(cluster)
        return left is not None and self._clock() - left < self.grace

    def desired_entry(self, cluster: str, ca_bundle: bytes) -> dict[str, Any] | None:
        if not self.served(cluster):
            return None
        return access_provider_entry(self.provider_name, self.public_url, cluster, ca_bundle)

    # --- loops ---

    async def run(self) -> None:
        """Watch profiles and reconcile until cancelled."""
        watches = [
            asyncio.create_task(self._watch(namespace), name=f"clusterprofiles-watch-{namespace}")
            for namespace in (self.namespaces or [""])
        ]
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), self.resync_interval)
                self._wakeup.clear()
                await self.reconcile_all()
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)

    async def reconcile_all(self) -> None:
        try:
            ca_bundle = self._ca_bundle()
        except Exception as exc:  # a CA mid-rotation: keep what is published, try again later
            log.warning("cannot read the CA bundle to publish: %s", exc)
            return
        for key in list(self.profiles):
            await self._reconcile(key, ca_bundle)

    async def remove_all(self) -> int:
        """Remove our entry from every profile in the watched namespaces (feature disabled)."""
        removed = 0
        for namespace in self.namespaces or [""]:
            for profile in await self._list(namespace):
                patch = status_patch(profile, self.provider_name, None)
                if patch and await self._patch(profile, patch):
                    removed += 1
        return removed

    def _list_call(self, namespace: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
        if namespace:
            return self._api.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL)
        return self._api.list_cluster_custom_object, (GROUP, VERSION, PLURAL)

    async def _list(self, namespace: str) -> list[dict[str, Any]]:
        call, args = self._list_call(namespace)
        answer = await call(*args)
        return list(answer.get("items") or [])

    async def _watch(self, namespace: str) -> None:
        from kubernetes_asyncio import watch

        backoff = 1.0
        while True:
            call, args = self._list_call(namespace)
            try:
                answer = await call(*args)
                self._replace_namespace(namespace, answer.get("items") or [])
                self._wakeup.set()
                resource_version = answer["metadata"]["resourceVersion"]
                async with watch.Watch().stream(
                    call, *args, resource_version=resource_version, timeout_seconds=300
                ) as events:
                    async for event in events:
                        self._apply_event(event)
                        backoff = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "watching ClusterProfiles%s failed (%s); relisting in %.0fs",
                    f" in {namespace}" if namespace else "",
                    type(exc).__name__,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _replace_namespace(self, namespace: str, items: list[dict[str, Any]]) -> None:
        for key in [k for k in self.profiles if not namespace or k[0] == namespace]:
            del self.profiles[key]
        for item in items:
            self.profiles[_key(item)] = item

    def _apply_event(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict) or "metadata" not in obj:
            return
        if kind == "DELETED":
            self.profiles.pop(_key(obj), None)
            return
        if kind in ("ADDED", "MODIFIED"):
            self.profiles[_key(obj)] = obj
            self._wakeup.set()

    async def _reconcile(self, key: ProfileKey, ca_bundle: bytes) -> None:
        for _attempt in range(3):
            profile = self.profiles.get(key)
            if profile is None:
                return
            entry = self.desired_entry(cluster_of(profile), ca_bundle)
            patch = status_patch(profile, self.provider_name, entry)
            if patch is None:
                return
            if await self._patch(profile, patch):
                return
            await self._refresh(key)

    async def _patch(self, profile: dict[str, Any], patch: dict[str, Any]) -> bool:
        from kubernetes_asyncio.client import ApiException

        namespace, name = _key(profile)
        try:
            updated = await self._api.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, patch,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False  # gone, or changed under us: refresh and recompute
            log.warning("patching ClusterProfile %s/%s failed: %s %s", namespace, name,
                        exc.status, exc.reason)
            return False
        self.patches += 1
        self.profiles[(namespace, name)] = updated
        ours = any(
            isinstance(e, dict) and e.get("name") == self.provider_name
            for e in patch["status"]["accessProviders"]
        )
        log.info("ClusterProfile %s/%s: %s entry %s", namespace, name, self.provider_name,
                 "written" if ours else "removed")
        return True

    async def _refresh(self, key: ProfileKey) -> None:
        from kubernetes_asyncio.client import ApiException

        try:
            self.profiles[key] = await self._api.get_namespaced_custom_object_status(
                GROUP, VERSION, key[0], PLURAL, key[1]
            )
        except ApiException as exc:
            if exc.status == 404:
                self.profiles.pop(key, None)


def _key(profile: dict[str, Any]) -> ProfileKey:
    metadata = profile["metadata"]
    return metadata.get("namespace", ""), metadata["name"]
