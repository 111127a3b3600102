"""Per-identity caps on concurrent long-running requests (DESIGN §6 rule 7, fair sharing).

A watch, a ``logs -f`` or an exec/attach/port-forward session holds a tunnel stream, a client
connection and an apiserver connection for as long as the caller likes. Without a cap one
identity could open hundreds and crowd out everyone else. :class:`StreamQuota` counts them per
(identity, cluster) and refuses the one past ``max_per_identity`` with 429 (``Retry-After``).
Short requests are not counted.

Which requests are long-running is :func:`gateway.wire.requestclass.request_class`'s to say
(admission asks it once per request): watches, ``logs -f`` and upgrades, read as kube-apiserver
reads them.

The identity is the hub user name; a ``--token-passthrough`` request has no hub user, so it
counts under a keyed hash of its token (never the token itself). A slot is taken when admission
lets the request through and released exactly once (:meth:`StreamSlot.release` is idempotent)
when its exchange ends, however it ends.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from mypy_extensions import mypyc_attr

from gateway.hub.config import GatewayConfig

DEFAULT_MAX_STREAMS_PER_IDENTITY = GatewayConfig.max_streams_per_identity  # the flag's


@mypyc_attr(native_class=False)
class TooManyStreams(Exception):
    """This identity has ``limit`` long-running requests open on the cluster already (429)."""

    status = 429

    def __init__(self, cluster: str, limit: int) -> None:
        super().__init__(f'too many long-running requests (watches, logs -f, exec, attach, '
                         f'port-forward) open on cluster "{cluster}" for this identity '
                         f"(limit {limit}): close some and retry")


class StreamSlot:
    """One counted long-running request; :meth:`release` gives it back (once)."""

    __slots__ = ("_key", "_quota")

    def __init__(self, quota: StreamQuota, key: tuple[str, str]) -> None:
        self._quota: StreamQuota | None = quota
        self._key = key

    def release(self) -> None:
        quota, self._quota = self._quota, None
        if quota is not None:
            quota._release(self._key)


class StreamQuota:
    """Counts of open long-running requests per (identity, cluster); see the module docstring.

    Memory: one entry per (identity, cluster) with at least one request open, so it is bounded
    by the number of open streams, which ``--max-inflight`` bounds.
    """

    def __init__(self, max_per_identity: int = DEFAULT_MAX_STREAMS_PER_IDENTITY) -> None:
        if max_per_identity < 1:
            raise ValueError("max_per_identity must be positive")
        self.max_per_identity = max_per_identity
        self._open: dict[tuple[str, str], int] = {}
        self._key = secrets.token_bytes(32)
        self.refused = 0

    def identity(self, user: str | None, token: str) -> str:
        """The counting key: the hub user, or a keyed hash of a passthrough token."""
        if user:
            return "user:" + user
        digest = hmac.new(self._key, token.encode("utf-8"), hashlib.sha256).hexdigest()
        return "passthrough:" + digest[:32]

    def open_count(self, identity: str, cluster: str) -> int:
        return self._open.get((identity, cluster), 0)

    def __len__(self) -> int:
        return len(self._open)

    def acquire(self, identity: str, cluster: str) -> StreamSlot:
        """A slot, or :class:`TooManyStreams` when the identity is at its cap on the cluster."""
        key = (identity, cluster)
        count = self._open.get(key, 0)
        if count >= self.max_per_identity:
            self.refused += 1
            raise TooManyStreams(cluster, self.max_per_identity)
        self._open[key] = count + 1
        return StreamSlot(self, key)

    def _release(self, key: tuple[str, str]) -> None:
        count = self._open.get(key, 0) - 1
        if count > 0:
            self._open[key] = count
        else:
            self._open.pop(key, None)
