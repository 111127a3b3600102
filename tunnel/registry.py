"""Which agent sessions serve which cluster.

Several sessions per cluster are normal (an agent reconnecting while its old session drains,
several agent replicas). New streams go to the least-loaded session that is neither closed nor
draining (the newest of equally loaded ones); a newer session never disturbs streams on an
older one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hubproxy.tunnel")

ClusterListener = Callable[[str, bool], None]
SessionListener = Callable[[str, Any, bool], None]


class SessionRegistry:
    def __init__(self) -> None:
        self._sessions: dict[str, list[Any]] = {}
        self._listeners: list[ClusterListener] = []
        self._session_listeners: list[SessionListener] = []

    def add(self, cluster: str, session: Any) -> None:
        sessions = self._sessions.setdefault(cluster, [])
        first = not sessions
        sessions.append(session)
        log.info("agent session for cluster %s registered (%d now)", cluster, len(sessions))
        self._notify_session(cluster, session, True)
        if first:
            self._notify(cluster, True)

    def remove(self, cluster: str, session: Any) -> None:
        sessions = self._sessions.get(cluster)
        if not sessions or session not in sessions:
            return
        sessions.remove(session)
        log.info("agent session for cluster %s gone (%d left)", cluster, len(sessions))
        self._notify_session(cluster, session, False)
        if not sessions:
            del self._sessions[cluster]
            self._notify(cluster, False)

    def pick(self, cluster: str) -> Any | None:
        """The least-loaded usable session of ``cluster``, or None."""
        best = None
        for session in self._sessions.get(cluster, ()):
            if session.closed or session.draining:
                continue
            # Ties go to the newest session: after an agent's certificate rotation the new
            # session takes the new streams while the old one is about to drain.
            if best is None or session.active_streams <= best.active_streams:
                best = session
        return best

    def clusters(self) -> frozenset[str]:
        return frozenset(self._sessions)

    def sessions(self, cluster: str) -> list[Any]:
        return list(self._sessions.get(cluster, ()))

    def all_sessions(self) -> list[Any]:
        return [s for sessions in self._sessions.values() for s in sessions]

    def subscribe(self, listener: ClusterListener) -> None:
        """``listener(cluster, True)`` when a cluster's first session arrives, False when its
        last one leaves."""
        self._listeners.append(listener)

    def subscribe_sessions(self, listener: SessionListener) -> None:
        """``listener(cluster, session, True)`` for every session registered, ``False`` when it
        leaves (its ``close_reason`` says why), before the cluster-level listeners."""
        self._session_listeners.append(listener)

    def _notify_session(self, cluster: str, session: Any, added: bool) -> None:
        for listener in list(self._session_listeners):
            try:
                listener(cluster, session, added)
            except Exception:
                log.exception("registry session listener failed for cluster %s", cluster)

    def _notify(self, cluster: str, connected: bool) -> None:
        for listener in list(self._listeners):
            try:
                listener(cluster, connected)
            except Exception:
                log.exception("registry listener failed for cluster %s", cluster)
