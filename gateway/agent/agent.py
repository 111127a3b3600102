"""The agent's decision for each stream the hub opens: which upstream, with what identity.

``Agent.on_open`` is the tunnel's ``on_open`` callback. Per stream, in this order:

1. The target must pass the agent's own :class:`tunnel.policy.TargetPolicy` (the hub could be
   compromised: it cannot reach what this cluster's operator did not allow-list).
2. ``KubeAPITarget``: the OPEN metadata must carry a valid hub-verified identity
   (``gateway.wire.identity.Identity.from_metadata``); none or invalid -> ``NO_IDENTITY``. The
   agent's credential can impersonate, so it is never used bare. The request then runs with
   the agent's credential + ``Impersonate-*`` for that identity, and the gateway's request id
   as ``Audit-ID`` and as the extra ``hubproxy.dev/request-id`` (so the managed audit event
   joins the gateway's audit line). If the identity says *passthrough* (the gateway's
   ``--token-passthrough``), the caller's own ``Authorization`` is forwarded untouched and the
   agent adds neither credential nor impersonation; ``Audit-ID`` still.
3. ``ServiceTarget``: only allow-listed Services, dialled at the address the policy resolved;
   no credential and no identity headers (``Authorization`` is stripped too). ``https``
   Services are verified against ``--service-ca`` (default: the cluster CA) unless listed with
   ``--insecure-service`` (an explicit, per-Service opt-out).
4. ``TCPTarget``: raw byte relay, only if the policy allows it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.agent.exchange import HttpExchange, Route
from gateway.agent.kubeapi import KubeAPIAccess
from gateway.agent.metrics import AgentMetrics
from gateway.agent.pool import UpstreamKey, UpstreamPool
from gateway.agent.tcp import RawRelay, Refusal
from gateway.wire.identity import Identity, impersonation_headers
from gateway.wire.repeatedhead import RepeatedHead
from tunnel.connection import OpenRequest, StreamProtocol
from tunnel.errors import OpenErrorCode, OpenRefused
from tunnel.policy import ResolvedTarget
from tunnel.targets import KubeAPITarget, ServiceTarget, Target, TCPTarget

log = logging.getLogger(__name__)

IDENTITY_CACHE_ENTRIES = 4096  # distinct hub identities remembered (cleared when full)


@dataclass
class AgentStats:
    streams: int = 0
    refused: int = 0
    active: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


class TargetResolver(Protocol):
    """What the agent needs from its allow-list (``tunnel.policy.TargetPolicy``)."""

    def resolve_now(self, target: Target) -> ResolvedTarget | None:
        """The checked address when it is known without waiting (no DNS), else None."""

    async def resolve(self, target: Target) -> ResolvedTarget:
        """The checked address; raises ``OpenRefused`` for a target that is not allowed."""


class Finished(Protocol):
    """A stream handler that reports how it ended (``HttpExchange``, ``RawRelay``)."""

    outcome: str


class Agent:
    def __init__(
        self,
        *,
        cluster: str,
        policy: TargetResolver,
        kube: KubeAPIAccess | None,
        pool: UpstreamPool | None = None,
        service_ca: str | None = None,
        insecure_services: frozenset[tuple[str, str, int]] = frozenset(),
        apiserver_protocol: str = "auto",
    ) -> None:
        self.cluster = cluster
        self.apiserver_protocol = apiserver_protocol  # "auto", "h1" or "h2" (pool.PROTOCOLS)
        self.policy = policy
        self.kube = kube
        self.pool = pool or UpstreamPool()
        self.insecure_services = insecure_services
        self.stats = AgentStats()
        self.metrics = AgentMetrics()
        self.metrics.stats = self.stats
        self.metrics.pool = self.pool
        self._service_ctx: ssl.SSLContext | None = None
        self._service_ca = service_ca or (kube.ca_file if kube else None)
        self._identities: dict[bytes, _User] = {}
        # The last request head parsed: the gateway forwards a client's fields unchanged from
        # one request to the next, so the next such head is read by its request line.
        self.heads = RepeatedHead()
        self._decode_identity: Callable[[bytes], Identity] = Identity.from_metadata

    # ---------------------------------------------------------------- tunnel callback ----
    def on_open(self, request: OpenRequest) -> StreamProtocol:
        self.stats.streams += 1
        # The codec decodes only these three kinds; anything else is refused, never trusted.
        target: object = request.target
        if isinstance(target, KubeAPITarget):
            return self._kube_exchange(request)
        if isinstance(target, ServiceTarget):
            return self._service_exchange(target)
        if isinstance(target, TCPTarget):
            return RawRelay(lambda: self.policy.resolve(target), self.pool.connect_timeout,
                            on_done=self._done_tcp)
        return self._refusal(OpenErrorCode.DENIED, "unknown target type")

    def _refusal(self, code: OpenErrorCode, message: str) -> Refusal:
        self.stats.refused += 1
        log.info("refusing stream: %s %s", code.name, message)
        return Refusal(code, message)

    def _identity(self, metadata: bytes) -> tuple[_User, bytes]:
        """(the hub user, request id as UTF-8) of OPEN metadata; raises ValueError. The user's
        headers carry no request id: it is this request's, not the user's (the exchange's
        ``audit_id`` adds it to each request).

        Requests of one hub user differ only in the request id, which the gateway writes as the
        last field (``,"rid":"<hex>"}``). Everything before it keys a cache of the decoded,
        validated identity and its headers, so a user's later requests skip the JSON decode and
        the checks; metadata of any other shape is decoded in full every time. (Cached with the
        headers, the id of a user's first request went with all the later ones: issue 24.)
        """
        prefix, sep, tail = bytes(metadata).rpartition(b',"rid":"')
        rid = tail[:-2]
        if sep and tail.endswith(b'"}') and rid.isalnum() and rid.isascii():
            hit = self._identities.get(prefix)
            if hit is not None:
                return hit, rid
        else:
            prefix = b""
        identity = self._decode_identity(metadata)
        passthrough = identity.passthrough
        headers = [] if passthrough else impersonation_headers(
            dataclasses.replace(identity, request_id=""))
        if not passthrough and not any(name.lower() == b"impersonate-user" for name, _ in headers):
            raise ValueError("identity without a user")
        user = _User(passthrough, headers)
        if prefix:
            if len(self._identities) >= IDENTITY_CACHE_ENTRIES:
                self._identities.clear()
            self._identities[prefix] = user
        return user, identity.request_id.encode("utf-8")

    def _kube_exchange(self, request: OpenRequest) -> HttpExchange | Refusal:
        if self.kube is None:
            return self._refusal(OpenErrorCode.DENIED, "this agent serves no kube-apiserver")
        try:
            user, request_id = self._identity(request.metadata)
        except (ValueError, TypeError) as exc:
            # Never name the metadata content: it could carry anything.
            return self._refusal(
                OpenErrorCode.NO_IDENTITY,
                f"a kube-apiserver request needs a hub-verified identity ({type(exc).__name__})",
            )
        target = request.target
        resolved = self.policy.resolve_now(target)
        self.stats.active += 1
        if resolved is not None:  # the usual case: no lookup, no route factory to make
            return HttpExchange(None, self.pool, audit_id=request_id, on_done=self._done_kube,
                                known_route=self._kube_route(user, resolved), heads=self.heads)

        async def route() -> Route:
            return self._kube_route(user, await self.policy.resolve(target))

        return HttpExchange(route, self.pool, audit_id=request_id, on_done=self._done_kube,
                            heads=self.heads)

    def _kube_route(self, user: _User, resolved: ResolvedTarget) -> Route:
        """The user's route to the apiserver at ``resolved``: made once and kept with the
        user's cached identity (the same for each of the user's requests while the address
        is)."""
        route = user.route
        if route is not None and route.key.host == resolved.host_ip \
                and route.key.port == resolved.port:
            return route
        kube = self.kube
        assert kube is not None
        route = user.route = Route(
            key=UpstreamKey(resolved.host_ip, resolved.port, kube.server_hostname, True),
            ssl_context=kube.ssl_context,
            authority=_authority(kube.host, kube.port),
            label="kube-apiserver",
            credential=kube.authorization,
            identity_headers=user.headers,
            passthrough=user.passthrough,
            protocol=self.apiserver_protocol,
            h2_ssl_context=None if self.apiserver_protocol == "h1" else kube.h2_ssl_context,
        )
        return route

    def _service_exchange(self, target: ServiceTarget) -> HttpExchange:
        insecure = (target.namespace, target.name, target.port) in self.insecure_services

        async def route() -> Route:
            resolved = await self.policy.resolve(target)
            tls = target.scheme == "https"
            if tls and not insecure and self._service_ca is None:
                raise OpenRefused(OpenErrorCode.DENIED,
                                  "no CA to verify https services (--service-ca)")
            hostname = resolved.server_hostname or f"{target.name}.{target.namespace}.svc"
            return Route(
                key=UpstreamKey(resolved.host_ip, resolved.port,
                                hostname if tls else None, tls),
                ssl_context=(lambda: self._service_context(insecure)) if tls else (lambda: None),
                authority=_authority(hostname, target.port),
                label=f"service {target.namespace}/{target.name}:{target.port}",
            )

        self.stats.active += 1
        return HttpExchange(route, self.pool, on_done=self._done_service, heads=self.heads)

    def _service_context(self, insecure: bool) -> ssl.SSLContext:
        if insecure:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        if self._service_ctx is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            assert self._service_ca is not None
            ctx.load_verify_locations(cafile=self._service_ca)
            self._service_ctx = ctx
        return self._service_ctx

    def _done(self, exchange: Finished, upstream: str = "kube-apiserver") -> None:
        stats = self.stats
        if stats.active:
            stats.active -= 1
        outcome = exchange.outcome or "closed"
        key = outcome.partition(":")[0]
        stats.by_outcome[key] = stats.by_outcome.get(key, 0) + 1
        self.metrics.stream_done(upstream, outcome, getattr(exchange, "started", 0.0),
                                 getattr(exchange, "response_at", 0.0))

    def _done_kube(self, exchange: Finished) -> None:
        self._done(exchange, "kube-apiserver")

    def _done_service(self, exchange: Finished) -> None:
        self._done(exchange, "service")

    def _done_tcp(self, exchange: Finished) -> None:
        self._done(exchange, "tcp")


class _User:
    """A hub user as the OPEN metadata names them: whether their own credential passes
    through, their impersonation headers, and their route to the apiserver once made."""

    __slots__ = ("headers", "passthrough", "route")

    def __init__(self, passthrough: bool, headers: list[tuple[bytes, bytes]]) -> None:
        self.passthrough = passthrough
        self.headers = headers
        self.route: Route | None = None


@functools.lru_cache(maxsize=256)  # one per apiserver / Service: asked per request
def _authority(host: str, port: int) -> bytes:
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return text.encode("ascii")
