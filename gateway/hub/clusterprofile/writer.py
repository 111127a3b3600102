"""Keeps this gateway's access-provider entry on the hub's ClusterProfiles.

For every ClusterProfile in the watched namespaces whose cluster this gateway serves (an agent
is connected), the profile carries exactly one ``status.accessProviders`` entry named
``provider_name``; once a cluster has had no agent for ``grace`` seconds its profile carries
none. Within the grace the profile is left as it is, so a reconnecting agent does not make
consumers flap -- and the grace also runs from this process's start: after a gateway restart
the entries its predecessor wrote stay while the agents come back, instead of being removed and
written again (a storm of 10,000 reconnecting clusters then costs no write at all).

Writes are coalesced per profile and rate-limited (:mod:`gateway.hub.hubwrites`): an agent
event marks the cluster's profiles dirty; one worker takes each dirty profile, computes its
desired entry then, and patches only if the profile (as last listed, watched or written)
differs. Every ``resync_interval`` all profiles are checked again and those that differ are
marked, which repairs an entry someone else changed, at the shared rate. The CA published is
re-read at most once a second when a profile is checked, and a changed CA marks every
profile, so a rotated front CA reaches consumers without a restart. The profiles come from a
paginated list and then a watch (:mod:`gateway.hub.hubwatch`).

Hub RBAC needed: get/list/watch ``clusterprofiles``, patch ``clusterprofiles/status``. Nothing
else is read or written.
"""

from __future__ import annotations

import asyncio
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
from gateway.hub.hubwatch import follow, list_pages
from gateway.hub.hubwrites import DirtyKeys, HubWrites, drain

log = logging.getLogger("hubproxy.clusterprofile")

ProfileKey = tuple[str, str]  # (namespace, name)
RESOURCE = "clusterprofiles"
CA_RECHECK = 1.0  # seconds between two reads of the CA bundle
RESYNC_STEP = 256  # profiles checked between two turns of the event loop


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
        writes: HubWrites | None = None,
    ) -> None:
        from kubernetes_asyncio import client

        self._api = client.CustomObjectsApi(api_client)
        self.provider_name = provider_name
        self.public_url = public_url
        self._ca_bundle = ca_bundle
        self.namespaces = list(namespaces)
        self.grace = grace
        self.resync_interval = resync_interval
        self._clock = clock
        self._started = clock()
        # Kept current by cluster_changed (the registry's events) after this first reading.
        self._connected: set[str] = set(connected_clusters())
        self._left_at: dict[str, float] = {}
        self.profiles: dict[ProfileKey, dict[str, Any]] = {}
        self._by_cluster: dict[str, set[ProfileKey]] = {}
        self.dirty: DirtyKeys[ProfileKey] = DirtyKeys(clock)
        self.writes = writes or HubWrites()
        self.writes.register(RESOURCE, lambda: len(self.dirty))
        self._ca: bytes | None = None
        self._ca_read_at = float("-inf")
        self.patches = 0  # observable for tests

    # --- what we publish ---

    def cluster_changed(self, cluster: str, connected: bool) -> None:
        """Registry callback: an agent arrived or the last one left. O(profiles of cluster)."""
        if connected:
            self._connected.add(cluster)
            self._left_at.pop(cluster, None)
        else:
            self._connected.discard(cluster)
            self._left_at[cluster] = self._clock()
        for key in self._by_cluster.get(cluster, ()):
            self.dirty.mark(key)

    def presence(self, cluster: str) -> bool | None:
        """True: the entry must be there; False: it must not; None: within the grace, leave
        it as it is (since the last agent left, or since this process started)."""
        if cluster in self._connected:
            return True
        if self._clock() < self._grace_end(cluster):
            return None
        return False

    def _grace_end(self, cluster: str) -> float:
        return self._left_at.get(cluster, self._started) + self.grace

    def _current_ca(self) -> bytes | None:
        """The CA bundle to publish, read again at most every CA_RECHECK seconds; a new one
        marks every profile. On a read error the last one read stays (a CA mid-rotation)."""
        now = self._clock()
        if now - self._ca_read_at < CA_RECHECK and self._ca is not None:
            return self._ca
        self._ca_read_at = now
        try:
            ca = self._ca_bundle()
        except Exception as exc:
            log.warning("cannot read the CA bundle to publish: %s", exc)
            return self._ca
        if self._ca is not None and ca != self._ca:
            log.info("the CA bundle changed: every ClusterProfile entry is checked again")
            self.mark_all()
        self._ca = ca
        return ca

    def mark_all(self) -> None:
        for key in self.profiles:
            self.dirty.mark(key)

    # --- loops ---

    async def run(self) -> None:
        """Watch profiles and write what changes until cancelled."""
        tasks = [asyncio.create_task(self._watch(namespace),
                                     name=f"clusterprofiles-watch-{namespace}")
                 for namespace in (self.namespaces or [""])]
        tasks.append(asyncio.create_task(self._resync(), name="clusterprofiles-resync"))
        try:
            await drain(self.dirty, self._sync, "ClusterProfile")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _resync(self) -> None:
        """Every ``resync_interval``: check every profile (the CA read again) and mark those
        that need a write, a step of RESYNC_STEP profiles at a time."""
        while True:
            await asyncio.sleep(self.resync_interval)
            self._ca_read_at = float("-inf")
            keys = list(self.profiles)
            for start in range(0, len(keys), RESYNC_STEP):
                for key in keys[start:start + RESYNC_STEP]:
                    if self._wanted_patch(key) is not None:
                        self.dirty.mark(key)
                await asyncio.sleep(0)

    async def remove_all(self) -> int:
        """Remove our entry from every profile in the watched namespaces (feature disabled)."""
        removed = 0
        for namespace in self.namespaces or [""]:
            for profile in await self._list(namespace):
                patch = status_patch(profile, self.provider_name, None)
                if patch and await self._patch(_key(profile), profile, patch):
                    removed += 1
        return removed

    def _list_call(self, namespace: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
        if namespace:
            return self._api.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL)
        return self._api.list_cluster_custom_object, (GROUP, VERSION, PLURAL)

    async def _list(self, namespace: str) -> list[dict[str, Any]]:
        call, args = self._list_call(namespace)
        items, _ = await list_pages(self.writes, RESOURCE, call, args, {})
        return items

    async def _watch(self, namespace: str) -> None:
        call, args = self._list_call(namespace)
        where = f"ClusterProfiles in {namespace}" if namespace else "ClusterProfiles"
        await follow(self.writes, RESOURCE, where, call, args,
                     replace=lambda items: self._replace_namespace(namespace, items),
                     apply=self._apply_event)

    def _store(self, key: ProfileKey, profile: dict[str, Any]) -> None:
        old = self.profiles.get(key)
        if old is not None and cluster_of(old) != cluster_of(profile):
            self._forget(key)
        self.profiles[key] = profile
        self._by_cluster.setdefault(cluster_of(profile), set()).add(key)

    def _forget(self, key: ProfileKey) -> None:
        profile = self.profiles.pop(key, None)
        if profile is None:
            return
        keys = self._by_cluster.get(cluster_of(profile))
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_cluster[cluster_of(profile)]

    def _replace_namespace(self, namespace: str, items: list[dict[str, Any]]) -> None:
        listed = {_key(item): item for item in items}
        for key in [k for k in self.profiles if (not namespace or k[0] == namespace)
                    and k not in listed]:
            self._forget(key)
        for key, item in listed.items():
            self._store(key, item)
            self.dirty.mark(key)

    def _apply_event(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict) or "metadata" not in obj:
            return
        if kind == "DELETED":
            self._forget(_key(obj))
            return
        if kind in ("ADDED", "MODIFIED"):
            self._store(_key(obj), obj)
            self.dirty.mark(_key(obj))

    # --- one profile ---

    async def _sync(self, key: ProfileKey) -> None:
        """Make one profile right, if it is not (at most three tries against conflicts).

        The patch is computed again once the rate lets it go: it carries the state of that
        moment, not of the moment the profile was marked.
        """
        for _attempt in range(3):
            if self._wanted_patch(key) is None:
                return
            await self.writes.rate.take()
            wanted = self._wanted_patch(key)
            if wanted is None:
                return
            profile, patch = wanted
            if await self._patch(key, profile, patch, take=False):
                return
            await self._refresh(key)

    def _wanted_patch(self, key: ProfileKey) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The profile and the patch that makes it right now, or None if it is right (or
        cannot be made right yet: no CA read so far)."""
        profile = self.profiles.get(key)
        if profile is None:
            return None
        cluster = cluster_of(profile)
        wanted = self.presence(cluster)
        if wanted is None:  # within the grace: keep presence, check again when it ends
            self.dirty.mark_at(key, self._grace_end(cluster))
            wanted = _has_entry(profile.get("status") or {}, self.provider_name)
        entry = None
        if wanted:
            ca_bundle = self._current_ca()
            if ca_bundle is None:
                self.dirty.mark_after(key, 5.0)
                return None
            entry = access_provider_entry(self.provider_name, self.public_url, cluster,
                                          ca_bundle)
        patch = status_patch(profile, self.provider_name, entry)
        return None if patch is None else (profile, patch)

    async def _patch(self, key: ProfileKey, profile: dict[str, Any],
                     patch: dict[str, Any], take: bool = True) -> bool:
        """True once written; False when the profile is gone or changed under us (404, 409).
        Other errors propagate (the drain tries again later). ``take``: wait for the rate
        first (False: the caller has)."""
        from kubernetes_asyncio.client import ApiException

        namespace, name = key
        try:
            updated = await self.writes.send(
                RESOURCE, lambda: self._api.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, patch,
                    _content_type="application/merge-patch+json"), take=take)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        self.patches += 1
        if key in self.profiles:
            self._store(key, updated)
        ours = _has_entry(patch["status"], self.provider_name)
        log.info("ClusterProfile %s/%s: %s entry %s", namespace, name, self.provider_name,
                 "written" if ours else "removed")
        return True

    async def _refresh(self, key: ProfileKey) -> None:
        from kubernetes_asyncio.client import ApiException

        try:
            profile = await self.writes.send(
                RESOURCE, lambda: self._api.get_namespaced_custom_object_status(
                    GROUP, VERSION, key[0], PLURAL, key[1]), write=False)
        except ApiException as exc:
            if exc.status == 404:
                self._forget(key)
                return
            raise
        self._store(key, profile)


def _has_entry(status: object, provider_name: str) -> bool:
    """Does this ``status`` carry an access provider named ``provider_name``?"""
    return isinstance(status, dict) and any(isinstance(e, dict) and e.get("name") == provider_name
               for e in status.get("accessProviders") or ())


def _key(profile: dict[str, Any]) -> ProfileKey:
    metadata = profile["metadata"]
    return metadata.get("namespace", ""), metadata["name"]
