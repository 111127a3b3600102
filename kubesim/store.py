"""In-memory object storage with one global resourceVersion counter, event history and watchers.

Like etcd behind kube-apiserver: every write gets the next resourceVersion; a bounded window of
past events lets a watch resume from a recent resourceVersion, and an older one is "too old"
(410 Expired). Objects handed out are copies, so callers may mutate what they get.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]  # (group, plural)


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    key: Key
    namespace: str
    obj: dict[str, Any]
    prev: dict[str, Any] | None = None  # the object before a MODIFIED, for selector transitions


class TooOld(Exception):
    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")


class Watcher:
    """A queue of events for one watch request; closed when it falls too far behind."""

    def __init__(self, key: Key, namespace: str | None, limit: int) -> None:
        self.key = key
        self.namespace = namespace
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=limit)
        self.overflowed = False

    def offer(self, event: Event) -> None:
        if event.key != self.key or (self.namespace and event.namespace != self.namespace):
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            # A watcher that cannot keep up is ended, as the apiserver's cacher does.
            self.overflowed = True

    def close(self) -> None:
        with _suppress_full():
            self.queue.put_nowait(None)


class _suppress_full:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        return exc_type is asyncio.QueueFull


class Store:
    def __init__(self, history: int = 2000, watch_queue: int = 10000) -> None:
        self._objects: dict[Key, dict[tuple[str, str], dict[str, Any]]] = collections.defaultdict(
            dict
        )
        self._rv = itertools.count(1)
        self.resource_version = 0
        self._history: collections.deque[Event] = collections.deque(maxlen=history)
        self._watchers: set[Watcher] = set()
        self._watch_queue = watch_queue
        self.compacted_rv = 0  # events at or below this are gone from history

    def next_rv(self) -> int:
        self.resource_version = next(self._rv)
        return self.resource_version

    # --- reads ------------------------------------------------------------------------
    def get(self, key: Key, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._objects[key].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, key: Key, namespace: str | None = None) -> list[dict[str, Any]]:
        items = self._objects[key]
        return [
            copy.deepcopy(items[k]) for k in sorted(items) if namespace is None or k[0] == namespace
        ]

    def iter_raw(self, key: Key, namespace: str | None = None) -> list[dict[str, Any]]:
        """Stored objects themselves (no copies): read-only, for hot paths such as RBAC."""
        items = self._objects[key]
        return [v for k, v in items.items() if namespace is None or k[0] == namespace]

    def get_raw(self, key: Key, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object itself (no copy): read-only."""
        return self._objects[key].get((namespace, name))

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    def keys(self) -> list[Key]:
        return [k for k, v in self._objects.items() if v]

    # --- writes -----------------------------------------------------------------------
    def put(self, key: Key, obj: dict[str, Any], event_type: str) -> dict[str, Any]:
        """Store `obj` (ADDED or MODIFIED) with a fresh resourceVersion; returns a copy."""
        rv = self.next_rv()
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(rv)
        stored = copy.deepcopy(obj)
        slot = (meta.get("namespace", ""), meta["name"])
        prev = self._objects[key].get(slot)
        self._objects[key][slot] = stored
        self._record(Event(rv, event_type, key, slot[0], stored, prev))
        return copy.deepcopy(stored)

    def delete(self, key: Key, namespace: str, name: str) -> dict[str, Any] | None:
        stored = self._objects[key].pop((namespace, name), None)
        if stored is None:
            return None
        rv = self.next_rv()
        gone = copy.deepcopy(stored)
        gone["metadata"]["resourceVersion"] = str(rv)
        self._record(Event(rv, "DELETED", key, namespace, gone))
        return copy.deepcopy(gone)

    def _record(self, event: Event) -> None:
        if len(self._history) == self._history.maxlen:
            self.compacted_rv = self._history[0].rv
        self._history.append(event)
        for watcher in list(self._watchers):
            watcher.offer(event)

    # --- watch ------------------------------------------------------------------------
    def watch(self, key: Key, namespace: str | None, since: int) -> Watcher:
        """Events after resourceVersion `since`, then live ones. Raises TooOld."""
        if since < self.compacted_rv:
            raise TooOld(since, self.compacted_rv + 1)
        watcher = Watcher(key, namespace, self._watch_queue)
        for event in self._history:
            if event.rv > since:
                watcher.offer(event)
        self._watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def close_watchers(self) -> None:
        for watcher in list(self._watchers):
            watcher.close()
        self._watchers.clear()
