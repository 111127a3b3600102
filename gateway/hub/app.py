"""The gateway process: listeners, registry, authenticator and authorizer wired together.

:class:`Gateway` owns what the front door needs per request (configuration, the session
registry, authentication, authorization, metrics, the audit line) and the listeners:

* front door (``config.listen``): TLS >= 1.2 with a reloading certificate, one
  :class:`gateway.hub.frontdoor.FrontDoor` per connection (an ALPN-``h2`` one becomes a
  :class:`gateway.hub.frontdoor_h2.H2FrontDoor`), each request a
  :class:`gateway.hub.request.Request`;
* tunnel (``config.tunnel_listen``): agents' mTLS sessions (``tunnel.listener``), registered
  in the :class:`tunnel.registry.SessionRegistry` under the cluster named by their certificate;
* health (``config.health_listen``): ``/healthz``, ``/readyz``, ``/metrics``;
* with ``config.revalidate_streams``, the task that asks the hub again about open
  long-running requests (:mod:`gateway.hub.revalidation`).

Graceful shutdown (:meth:`Gateway.shutdown`), in this order and bounded by one deadline:
``/readyz`` turns 503 (and requests are still served for ``--shutdown-delay``, while load
balancers notice, each HTTP/1.1 response closing its connection), then the front door stops
accepting; idle keep-alive connections close at once and busy ones after their current
response; watches and ``logs -f`` end at once with a
clean last chunk (clients re-watch through another instance), upgrades are closed; new
requests on open connections get 503; the tunnel listener drains agent sessions (GOAWAY,
in-flight streams finish) in parallel; at the deadline whatever is left is closed.

:func:`build_gateway` makes a production gateway from a :class:`GatewayConfig`; tests build a
:class:`Gateway` directly with fakes (authenticator, authorizer, registry, no tunnel listener).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from gateway.hub import fleet, revalidation
from gateway.hub.admission.auth import Authenticator, TokenAuthenticator
from gateway.hub.admission.authorize import Authorizer, SarAuthorizer
from gateway.hub.admission.hubload import FailedAuthLimiter
from gateway.hub.admission.identity import IdentityCache
from gateway.hub.admission.seats import Seats
from gateway.hub.admission.streams import StreamQuota
from gateway.hub.audittrail import AuditTrail, build_audit_trail
from gateway.hub.config import GatewayConfig
from gateway.hub.exchange import AGENT_LEAVING, Exchange
from gateway.hub.fleet import FleetView
from gateway.hub.frontdoor import FrontDoor
from gateway.hub.frontdoor_h2 import H2FrontDoor
from gateway.hub.hubcalls import CountingAuthorizer
from gateway.hub.hubwrites import HubWriteRate, HubWrites
from gateway.hub.proxyaccept import ProxyProtocolListener
from gateway.hub.request import FrontDoorConnection
from gateway.hub.revalidation import StreamRevalidator, period_for
from gateway.ops import audit, startup
from gateway.ops.certexpiry import CertificateFiles
from gateway.ops.health import HealthServer, Readiness, token_review_probe
from gateway.ops.metrics import GatewayMetrics
from tunnel.connection import ALPN, SessionConfig
from tunnel.join import JOIN_ALPN, JoinHandler
from tunnel.listener import RefuseHook, start_tunnel_listener
from tunnel.registry import SessionRegistry
from tunnel.session_state import MemoryBudget

log = logging.getLogger("hubproxy.gateway")


class ClusterList(Protocol):
    """The hub's cluster inventory (``gateway.hub.inventory.ClusterInventory``)."""

    def listed(self, cluster: str) -> bool | None: ...


def outage_answers(authenticator: Authenticator, authorizer: Authorizer) -> int:
    """Hub reviews that failed and were answered from what the hub confirmed earlier."""
    total = authenticator.cache.stale_served if isinstance(authenticator,
                                                           TokenAuthenticator) else 0
    inner = authorizer.inner if isinstance(authorizer, CountingAuthorizer) else authorizer
    if isinstance(inner, SarAuthorizer):
        total += inner.cache.stale_served
    return total


class Gateway:
    """See the module docstring."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        authenticator: Authenticator,
        authorizer: Authorizer,
        registry: SessionRegistry,
        front_ssl: ssl.SSLContext | None,
        tunnel_ssl: ssl.SSLContext | None = None,
        hub_probe: Callable[[], Awaitable[None]] | None = None,
        session_config: SessionConfig | None = None,
        tunnel_join: JoinHandler | None = None,
        tunnel_refuse: RefuseHook | None = None,
        metrics: GatewayMetrics | None = None,
        audit_trail: AuditTrail | None = None,
    ) -> None:
        self.config = config
        # Joining (gateway.hub.join, wired by serve.py): the tunnel's join handler and the
        # hook that refuses removed clusters' sessions.
        self.tunnel_join = tunnel_join
        self.tunnel_refuse = tunnel_refuse
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.registry = registry
        self.front_ssl = front_ssl
        self.tunnel_ssl = tunnel_ssl
        self.session_config = session_config
        self.metrics = metrics or GatewayMetrics()
        self.metrics.cluster_detail = config.cluster_metrics == "detailed"
        self.fleet = FleetView(registry, worker=config.worker_index,
                               on_change=self.metrics.mark_changed)
        self.metrics.fleet = self.fleet.entries
        self.metrics.fleet_stats = fleet.tunnel_stats
        # This process's writes to the hub: one rate for all its writers.
        self.hub_writes = HubWrites(HubWriteRate(config.hub_write_qps, config.hub_write_burst))
        self.metrics.hub_writes = self.hub_writes.snapshot
        own = {name: os.path.join(directory, "tls.crt") for name, directory in
               (("serving", config.tls_dir), ("tunnel", config.tunnel_tls_dir)) if directory}
        self.metrics.certificates = CertificateFiles(own).expiries
        self.identities = IdentityCache()
        self.auth_failures = FailedAuthLimiter(rate=config.auth_failure_rate,
                                               burst=config.auth_failure_burst)
        self.stream_quota = StreamQuota(config.max_streams_per_identity)
        self.seats: Seats | None = None
        if config.max_executing_requests > 0:
            self.seats = Seats(config.max_executing_requests, queues=config.fair_queues,
                               hand_size=config.fair_hand_size,
                               queue_length=config.fair_queue_length,
                               max_wait=config.fair_queue_wait)
            self.metrics.fairness = self.seats.snapshot
        self.connections: set[FrontDoorConnection] = set()
        self.inflight = 0
        self.draining = False
        self.known_clusters: set[str] = set(registry.clusters())
        self.started_at = time.monotonic()
        self._idle = asyncio.Event()
        self._front: asyncio.base_events.Server | ProxyProtocolListener | None = None
        self._tunnel: Any = None
        self._health: HealthServer | None = None
        self.revalidator: StreamRevalidator | None = None
        # The hub's cluster inventory (gateway.hub.inventory), set by the process before start.
        self.inventory: ClusterList | None = None
        if config.revalidate_streams:
            self.revalidator = StreamRevalidator(self, authenticator, authorizer,
                                                 period_for(config.token_cache_ttl))
        self._revalidation: asyncio.Task[None] | None = None
        self.front_port = 0
        self.tunnel_port = 0
        self.health_port = 0

        async def _no_probe() -> None:
            return None

        self.readiness = Readiness(hub_probe or _no_probe, config.readiness_interval)
        registry.subscribe(self._cluster_changed)
        registry.subscribe_sessions(self._session_changed)
        self.metrics.client_connections = lambda: len(self.connections)
        self.metrics.h2_client_connections = lambda: sum(
            1 for d in self.connections if d.protocol == "h2")
        self.metrics.h2_open_streams = lambda: sum(
            d.open_requests for d in self.connections if d.protocol == "h2")
        self.metrics.tunnel_refused = lambda: self._tunnel.refused if self._tunnel else 0
        self.metrics.auth_reviews = lambda: (
            authenticator.reviews if isinstance(authenticator, TokenAuthenticator) else 0)
        self.metrics.hub_outage_answers = lambda: outage_answers(authenticator, authorizer)
        self.metrics.handshake_failures = lambda: (
            self._tunnel.handshake_failures if self._tunnel is not None else {})
        self.metrics.tunnel_admission = lambda: (
            self._tunnel.admission() if self._tunnel is not None else {})
        self.audit_trail = audit_trail or AuditTrail(
            lines=audit.logger.isEnabledFor(logging.INFO))
        self.metrics.audit_events = self.audit_trail.events
        self.metrics.audit_dropped = self.audit_trail.dropped

    @property
    def leaving(self) -> bool:
        """Shutdown has begun (``/readyz`` says 503), though requests may still be served
        for ``--shutdown-delay``: every HTTP/1.1 response now closes its connection."""
        return self.readiness.draining or self.draining

    @property
    def tunnel_listener(self) -> Any:
        """The started ``tunnel.listener.TunnelListener`` (None before start or without one)."""
        return self._tunnel

    # --- per request (called by FrontDoor and the admission chain) -----------------------------

    def in_startup_grace(self) -> bool:
        return time.monotonic() - self.started_at < self.config.unknown_cluster_grace

    def cluster_listed(self, cluster: str) -> bool | None:
        return None if self.inventory is None else self.inventory.listed(cluster)

    def _cluster_changed(self, cluster: str, connected: bool) -> None:
        if connected:
            self.known_clusters.add(cluster)
        log.info("cluster %s %s", cluster, "connected" if connected else "disconnected")

    def _session_changed(self, _cluster: str, session: Any, added: bool) -> None:
        hooks = getattr(session, "on_peer_draining", None)
        if added and hooks is not None:
            hooks.append(self._agent_session_draining)

    def _agent_session_draining(self, session: Any) -> None:
        """An agent session announced that it is leaving (the agent's SIGTERM, a duplicate or
        rotated session): end the watches and follows on it cleanly now, so clients re-watch
        through another session instead of being cut at the agent's drain deadline. Exec,
        attach and port-forward keep that time to finish."""
        for exchange in list(self.open_streams()):
            if exchange.admitted.session is session:
                exchange.end_follow(AGENT_LEAVING)

    def clusters_document(self, query: str = "") -> Iterator[bytes]:
        """``GET /clusters?query``: this gateway's fleet, all workers' sessions merged, a page
        at a time, as chunks (see :func:`gateway.hub.fleet.cluster_list`); ValueError for a
        bad query."""
        fleets = [self.fleet.entries(), *(p.get("fleet") or {} for p in self.metrics.peers())]
        return fleet.cluster_list(fleets, fleet.parse_query(query))

    def announce_instances(self, peers: tuple[int, ...]) -> None:
        """The live gateway instances changed: tell every agent session (HUB_PEER)."""
        if self._tunnel is not None:
            self._tunnel.announce_hub_peers(peers)

    def request_released(self) -> None:
        if self.inflight <= 0:
            self._idle.set()

    def open_streams(self) -> Iterator[Exchange]:
        """The request in progress on each client connection, and on each stream of an
        HTTP/2 connection (for the revalidator)."""
        for door in self.connections:
            yield from door.exchanges()

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        host, port = config.listen
        shared = config.workers > 1  # the kernel spreads connections over the workers
        try:
            if config.proxy_protocol_from:
                listener = ProxyProtocolListener(
                    lambda client: FrontDoor(self, client, h2=H2FrontDoor),
                    trusted=config.proxy_protocol_from,
                    ssl_context=self.front_ssl, header_timeout=config.limits.header_timeout,
                    max_pending=config.limits.max_connections,
                    refused=self.metrics.proxy_refused)
                await listener.start(host, port, reuse_port=shared)
                self._front = listener
            else:
                self._front = await loop.create_server(
                    lambda: FrontDoor(self, h2=H2FrontDoor), host, port, ssl=self.front_ssl,
                    backlog=1024,
                    ssl_handshake_timeout=(config.limits.header_timeout if self.front_ssl
                                           else None),
                    reuse_port=shared or None,
                )
        except OSError as exc:
            raise startup.bind_error(exc, host, port, "--listen") from None
        self.front_port = int(self._front.sockets[0].getsockname()[1])
        if self.tunnel_ssl is not None:
            thost, tport = config.tunnel_listen
            try:
                self._tunnel = await start_tunnel_listener(
                    thost, tport, self.tunnel_ssl, self.registry, self.session_config,
                    reuse_port=shared, naming=config.agent_naming,
                    join=self.tunnel_join, refuse=self.tunnel_refuse,
                    max_handshakes=config.tunnel_max_handshakes, backlog=config.tunnel_backlog,
                )
            except OSError as exc:
                raise startup.bind_error(exc, thost, tport, "--tunnel-listen") from None
            self.tunnel_port = int(self._tunnel.port)
        if config.health_listen is not None and config.worker_index == 0:
            self._health = HealthServer(self.readiness, self.metrics.render_chunks,
                                        clusters=self.clusters_document)
            try:
                self.health_port = await self._health.start(*config.health_listen)
            except OSError as exc:
                raise startup.bind_error(exc, *config.health_listen, "--health-listen") from None
        self.audit_trail.start()
        self.readiness.listeners_up = True
        self.readiness.start()
        if self.revalidator is not None:
            self._revalidation = revalidation.start(self.revalidator)
        log.info("gateway listening: front door %s:%d, tunnel %s, health %s", host,
                 self.front_port, f"{config.tunnel_listen[0]}:{self.tunnel_port}"
                 if self._tunnel else "off",
                 f"{config.health_listen[0]}:{self.health_port}"
                 if self._health and config.health_listen else "off")

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (bounded), close everything."""
        timeout = self.config.shutdown_timeout if timeout is None else timeout
        self.readiness.draining = True
        if self.config.shutdown_delay > 0:
            # Not ready, still serving: until the load balancer has stopped sending new
            # connections here, closing the front door would refuse (or reset) them.
            log.info("not ready; serving for %.1fs more before draining",
                     self.config.shutdown_delay)
            await asyncio.sleep(self.config.shutdown_delay)
        self.draining = True
        if self._front is not None:
            self._front.close()
        for door in list(self.connections):
            # Idle connections close now; busy HTTP/1.1 ones after their response, HTTP/2 ones
            # send GOAWAY (no new streams; those in flight finish).
            door.start_drain()
        # Watches and follows never finish on their own: end them cleanly now (HTTP/1.1 and
        # HTTP/2 alike) so clients re-watch elsewhere while short requests finish here.
        for exchange in list(self.open_streams()):
            if exchange.streaming:
                exchange.end_stream()
        drain: asyncio.Task[None] | None = None
        if self._tunnel is not None:
            drain = asyncio.ensure_future(self._tunnel.drain(timeout))
        if self.inflight > 0:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    while self.inflight > 0:
                        await self._idle.wait()
                        self._idle.clear()
        for door in list(self.connections):
            door.close()
        if drain is not None:
            with contextlib.suppress(Exception):
                await drain
        await self.close()

    async def close(self) -> None:
        """Abort: close listeners and every connection now."""
        await revalidation.stop(self._revalidation)
        self._revalidation = None
        if self._front is not None:
            self._front.close()
        for door in list(self.connections):
            if door.transport is not None:
                door.transport.abort()
        if self._tunnel is not None:
            self._tunnel.close()
            with contextlib.suppress(Exception):
                await self._tunnel.wait_closed()
            self._tunnel = None
        if self._health is not None:
            self._health.close()
        await self.readiness.stop()
        if self._front is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._front.wait_closed()
            self._front = None
        # Last: the aborted connections' requests are recorded first (their connection_lost
        # runs a loop turn after the abort); then the trail's last events go out (a webhook's
        # bounded by its close timeout).
        await asyncio.sleep(0)
        await self.audit_trail.close()


# --- production wiring ------------------------------------------------------------------------


def front_tls(config: GatewayConfig) -> ssl.SSLContext:
    """TLS >= 1.2 for the front door, reloaded when tls.crt/tls.key change."""
    from certs.tls import TLS1_2, ReloadingContext, reloading_server_context, server_context

    assert config.tls_dir is not None
    cert = os.path.join(config.tls_dir, "tls.crt")
    key = os.path.join(config.tls_dir, "tls.key")
    reloading = ReloadingContext(
        lambda: server_context(cert, key, None, min_version=TLS1_2,
                               alpn_protocols=front_alpn(config)),
        [cert, key],
    )
    return reloading_server_context(reloading)


def front_alpn(config: GatewayConfig) -> list[str]:
    """ALPN of the front door: h2 first (clients that speak it choose it), then HTTP/1.1."""
    return ["h2", "http/1.1"] if config.limits.http2 else ["http/1.1"]


def tunnel_tls(config: GatewayConfig) -> ssl.SSLContext:
    """TLS 1.3 + agent client certificates verified against --agent-ca only.

    Required by the TLS layer, unless joining is on: then the context also offers the join
    ALPN and asks for a certificate without requiring one, and the listener refuses tunnel
    sessions without one (``tunnel.listener``).
    """
    from certs.tls import TLS1_3, ReloadingContext, reloading_server_context, server_context

    assert config.tunnel_tls_dir is not None and config.agent_ca is not None
    cert = os.path.join(config.tunnel_tls_dir, "tls.crt")
    key = os.path.join(config.tunnel_tls_dir, "tls.key")
    ca = config.agent_ca
    joining = config.join_ca_secret is not None
    alpn = _tunnel_alpn() + ([JOIN_ALPN] if joining else [])
    reloading = ReloadingContext(
        lambda: server_context(cert, key, ca, min_version=TLS1_3, alpn_protocols=alpn,
                               client_cert_optional=joining),
        [cert, key, ca],
    )
    return reloading_server_context(reloading)


def _tunnel_alpn() -> list[str]:
    return [ALPN]


def session_settings(config: GatewayConfig) -> SessionConfig:
    """Tunnel settings of the hub side: the tunnel's defaults, this process's instance, the
    liveness flags and the process's window memory budget (one for all its sessions)."""
    # With instance discovery the count and the set follow the Leases (see
    # Gateway.announce_instances); until the first listing, agents hold at least this one.
    # Without Leases, one pod's workers are a set the supervisor fixed: announced as a set, an
    # agent searches for a missing one with free redials (tunnel.redial), where a bare count
    # doubles its redial delay from the third miss and may leave a worker unreached for many
    # seconds. Pods counted by --replicas can only be counted.
    peers: tuple[int, ...]
    if config.lease_namespace:
        instances = 1
        peers = (config.hub_instance,) if config.hub_instance else ()
    elif config.replicas in (None, 1) and len(config.worker_instances) > 1:
        instances, peers = len(config.worker_instances), config.worker_instances
    else:
        instances, peers = (config.replicas or 1) * config.workers, ()
    return SessionConfig(hub_instance=config.hub_instance, hub_instances=instances,
                         hub_peers=peers, ping_after=config.tunnel_keepalive,
                         dead_after=config.tunnel_timeout,
                         process_budget=MemoryBudget(config.tunnel_memory_budget))


async def hub_api_client(kubeconfig: str | None,
                         build: Callable[[str | None], Awaitable[Any]]) -> Any:
    """The hub ApiClient, or a StartupError naming --hub-kubeconfig (never a traceback).

    ``gateway.ops.startup`` has already checked that the file is YAML with a current-context;
    what is left is what only the loader sees (a missing user, an unreadable CA file, an
    in-cluster token that is not mounted). Its messages name keys and files, not values.
    """
    from kubernetes_asyncio.config import ConfigException

    try:
        return await build(kubeconfig)
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if kubeconfig:
            raise startup.StartupError(f"--hub-kubeconfig {kubeconfig}: cannot use it "
                                       f"({why})") from None
        raise startup.StartupError(f"in-cluster hub credential unusable ({why}): give "
                                   "--hub-kubeconfig FILE") from None


async def build_gateway(config: GatewayConfig) -> tuple[Gateway, Any]:
    """A production gateway and its hub ApiClient (close it after the gateway)."""
    from gateway.hub.admission.auth import (
        KubeTokenReviewer,
        TokenAuthenticator,
        build_hub_api_client,
    )
    from gateway.hub.admission.authorize import NoAuthorizer, SarAuthorizer
    from gateway.hub.admission.hubload import HubCallLimit

    front_ssl, tunnel_ssl = front_tls(config), tunnel_tls(config)
    api_client = await hub_api_client(config.hub_kubeconfig, build_hub_api_client)
    from gateway.hub.hubcalls import TimedTokenReviewer, timed_review

    metrics = GatewayMetrics()
    reviewer = KubeTokenReviewer(api_client)
    # One bound for TokenReviews and SubjectAccessReviews together: both load the same hub.
    hub_calls = HubCallLimit(config.hub_max_concurrent_reviews, config.hub_review_wait)
    authenticator = TokenAuthenticator(TimedTokenReviewer(reviewer, metrics),
                                       ttl=config.token_cache_ttl, audiences=config.audiences,
                                       hub_calls=hub_calls, stale_grace=config.hub_outage_grace)
    authorizer: Authorizer = NoAuthorizer()
    if config.authorize == "sar":
        sar = SarAuthorizer(api_client, config.token_cache_ttl, hub_calls=hub_calls,
                            stale_grace=config.hub_outage_grace)
        # Its review function is the seam for measuring each SAR actually sent (inside the
        # hub-call slot, so the time is the hub's, not the wait for a slot).
        sar._review = timed_review(sar._review, metrics)
        authorizer = CountingAuthorizer(sar, metrics)
    # Hub-side session settings are the tunnel's defaults; concurrency toward an agent is
    # bounded by what that agent advertises, and by --max-inflight here.
    session_config = session_settings(config)
    probe = token_review_probe(lambda token: reviewer.review(token, authenticator.audiences))
    try:
        trail = await build_audit_trail(
            lines=audit.logger.isEnabledFor(logging.INFO),
            policy_file=config.audit_policy_file, log_path=config.audit_log_path,
            webhook_config_file=config.audit_webhook_config_file,
            webhook=config.audit_webhook, atomic=config.workers > 1)
    except startup.StartupError:
        await api_client.close()
        raise
    gateway = Gateway(
        config,
        authenticator=authenticator,
        authorizer=authorizer,
        registry=SessionRegistry(),
        front_ssl=front_ssl,
        tunnel_ssl=tunnel_ssl,
        hub_probe=probe,
        session_config=session_config,
        metrics=metrics,
        audit_trail=trail,
    )
    return gateway, api_client
