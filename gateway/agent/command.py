"""Run the managed-cluster agent: dial out to the hub and serve the streams it opens.

    hubproxy agent --hub hub.example:8091 --cluster cluster1 --tls-dir /etc/hubproxy/agent-tls \\
        [--kubeconfig FILE | in-cluster] [--allow-service NS/NAME:PORT]... [--health-listen ADDR]

The agent connects to the hub with its client certificate (``--tls-dir``: ``tls.crt``,
``tls.key``, and ``ca.crt`` = the tunnel CA, the only CA it trusts for the hub), reconnects with
backoff, and picks up renewed certificates for the next session. For each stream it checks the
target against its own allow-list, and sends kube-apiserver requests with its own credential
impersonating the hub-verified identity from the stream (never without one). SIGTERM drains:
no new streams, in-flight ones get ``--drain-timeout`` seconds.

Behind an egress proxy: set ``HTTPS_PROXY=http://[user:password@]proxy:3128`` (or
``https_proxy``) and the agent reaches the hub with HTTP CONNECT, then TLS to the hub inside
it; ``NO_PROXY``/``no_proxy`` (host names, domain suffixes, IPs, CIDRs, ``*``) bypasses it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import os
import secrets
import signal
import ssl
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from certs.identity import validate_cluster_name
from certs.tls import TLS1_3, ReloadingContext, client_context
from gateway.agent.config import AgentConfig
from gateway.agent.enroll import EnrollmentError
from gateway.agent.heap import tune_heap
from gateway.agent.impersonation import ProfileWatch
from gateway.agent.kubeapi import KubeAPIAccess, KubeAPIConfigError, load
from gateway.ops import diagnostics, settings, startup
from gateway.ops.certexpiry import CertificateFiles
from gateway.ops.rlimits import raise_open_file_limit
from gateway.ops.version import pack_release, version
from tunnel.identity import URI_NAMING, AgentIdentityError, AgentNaming
from tunnel.proxy import ProxyError, proxy_for

if TYPE_CHECKING:
    from tunnel.policy import TargetPolicy

log = logging.getLogger("hubproxy.agent")

READINESS_INTERVAL = 5.0
READINESS_STALE = 20.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``hubproxy agent``: every setting of :class:`AgentConfig`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    settings.add_flags(parser, AgentConfig)


class Readiness:
    """Ready = connected to the hub AND the apiserver completed a TLS handshake recently."""

    def __init__(self, dialer: Any, kube: KubeAPIAccess | None,
                 profile: ProfileWatch | None = None) -> None:
        self.dialer = dialer
        self.kube = kube
        self.profile = profile
        self.apiserver_ok_at = 0.0
        self.apiserver_error = "not checked yet"

    def __call__(self) -> tuple[bool, str]:
        if not getattr(self.dialer, "connected", False):
            refusal = getattr(self.dialer, "last_refusal", None)
            return False, "not connected to the hub" + (f": {refusal}" if refusal else "")
        if self.kube is not None and time.monotonic() - self.apiserver_ok_at > READINESS_STALE:
            return False, f"kube-apiserver not reachable: {self.apiserver_error}"
        if self.profile is not None:
            # For operators, with the metric: what the credential may do.
            return True, f"ok (impersonation profile: {self.profile.profile.name})"
        return True, "ok"

    async def probe_forever(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(READINESS_INTERVAL)

    async def probe_once(self) -> None:
        if self.kube is None:
            return
        kube = self.kube
        try:
            async with asyncio.timeout(5):
                _, writer = await asyncio.open_connection(
                    kube.host, kube.port, ssl=kube.ssl_context(),
                    server_hostname=kube.server_hostname,
                )
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            self.apiserver_error = type(exc).__name__
            return
        self.apiserver_ok_at = time.monotonic()
        self.apiserver_error = ""


def _check_certificate_cluster(cert_file: Path, cluster: str,
                               naming: AgentNaming = URI_NAMING) -> None:
    """Fail fast, with a clear message, if the certificate is for another cluster.

    Only a friendly start-up check: the hub takes the cluster from the certificate anyway, with
    the same rule (``tunnel.identity``).
    """
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the agent certificate {cert_file}: {exc}") from None
    try:
        named = naming.cluster_of(cert)
    except AgentIdentityError as exc:
        raise ValueError(f"{cert_file} names no cluster ({exc}): point --tls-dir at this "
                         "cluster's agent certificate") from None
    if named != cluster:
        raise ValueError(f"{cert_file} is an agent certificate for {named}, not {cluster!r}: "
                         f"fix --cluster or point --tls-dir at {cluster}'s certificate")
    # Not fatal: renewed files are picked up without a restart. But say it before the hub does.
    now = datetime.datetime.now(datetime.UTC)
    if cert.not_valid_after_utc <= now:
        log.warning("the agent certificate %s expired on %s: the hub will refuse it until it "
                    "is renewed", cert_file, cert.not_valid_after_utc.isoformat())
    elif cert.not_valid_before_utc > now:
        log.warning("the agent certificate %s is not valid before %s: check this machine's "
                    "clock", cert_file, cert.not_valid_before_utc.isoformat())


def build_policy(config: AgentConfig, kube: KubeAPIAccess | None) -> TargetPolicy:
    from tunnel.policy import ServiceRule, TargetPolicy

    rules = [ServiceRule.parse(f"{ns}/{name}:{port}") for ns, name, port in config.allow_services]
    return TargetPolicy(
        kube_api=(kube.host, kube.port) if kube else None,
        allow_services=rules,
        allow_tcp=list(config.allow_tcp),
        allow_loopback=config.allow_loopback_targets,
        service_address_overrides=dict(config.service_addresses),
    )


async def serve(config: AgentConfig) -> int:
    cluster = validate_cluster_name(config.cluster)
    config.validate()
    naming = config.agent_naming
    tls_dir = Path(config.tls_dir)
    cert, key = tls_dir / "tls.crt", tls_dir / "tls.key"
    hub_ca = Path(config.hub_ca) if config.hub_ca else tls_dir / "ca.crt"
    credentials = config.credentials
    if credentials is None:  # join mode writes them from its Secret first
        startup.check_key_pair(config.tls_dir, "--tls-dir")
        startup.check_ca_file(str(hub_ca), "--hub-ca" if config.hub_ca
                              else "--hub-ca (default: ca.crt in --tls-dir)")
        _check_certificate_cluster(cert, cluster, naming)
    if config.health_listen is not None:
        startup.check_port_free(*config.health_listen, "--health-listen")
    kube = load(kubeconfig=config.kubeconfig, context=config.context,
                apiserver=config.apiserver, apiserver_ca=config.apiserver_ca,
                token_file=config.token_file)
    assert config.hub is not None  # a required flag
    hub_host, hub_port = config.hub
    # An egress proxy from HTTPS_PROXY/NO_PROXY, as curl and Go read them (tunnel.proxy).
    proxy = proxy_for(os.environ, hub_host, hub_port)
    enrollment = None
    if credentials is not None:
        from gateway.agent.enroll import CredentialSecret, Enrollment

        namespace, name = credentials
        enrollment = Enrollment(cluster=cluster, secret=CredentialSecret(kube, namespace, name),
                                tls_dir=tls_dir, hub=(hub_host, hub_port),
                                server_hostname=config.hub_server_name, proxy=proxy)
        await enrollment.ensure()
        _check_certificate_cluster(cert, cluster, naming)
    # Imported only now: `hubproxy --help` and the checks above need none of the data path.

    from gateway.agent.agent import Agent
    from gateway.agent.health import start_health_server
    from gateway.agent.pool import UpstreamPool
    from tunnel.connection import SessionConfig
    from tunnel.dialer import AgentDialer, HubFanout
    from tunnel.session_state import MemoryBudget

    policy = build_policy(config, kube)
    raise_open_file_limit(config.max_upstream_connections + 256)
    pool = UpstreamPool(max_connections=config.max_upstream_connections,
                        h2_max_streams=config.apiserver_h2_streams)
    agent = Agent(cluster=cluster, policy=policy, kube=kube, pool=pool,
                  apiserver_protocol=config.apiserver_protocol,
                  service_ca=config.service_ca,
                  insecure_services=frozenset(config.insecure_services))

    hub_tls = ReloadingContext(
        lambda: client_context(hub_ca, cert, key, min_version=TLS1_3, alpn_protocols=tunnel_alpn()),
        [cert, key, hub_ca],
    )
    if proxy is not None:
        log.info("dialling the hub through the proxy %s (from %s)", proxy.display, proxy.source)
    elif os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
        log.info("NO_PROXY matches the hub %s:%d: dialling it directly", hub_host, hub_port)
    # The same id on every session of this process: the hub counts agent replicas with it.
    agent_instance = secrets.randbits(32) or 1
    session_config = SessionConfig(
        ping_after=config.tunnel_keepalive, dead_after=config.tunnel_timeout,
        agent_version=pack_release(version()), agent_instance=agent_instance,
        process_budget=MemoryBudget(config.tunnel_memory_budget))
    # One session to each hub process behind the address (gateway workers, hub replicas).
    dialer = HubFanout(lambda fanout: AgentDialer(
        hub_host, hub_port, hub_tls.current, agent.on_open,
        session_config, server_hostname=config.hub_server_name or hub_host, fanout=fanout,
        proxy=proxy))
    profile = ProfileWatch(kube)
    readiness = Readiness(dialer, kube, profile)
    agent.metrics.sessions = lambda: dialer.sessions
    agent.metrics.version = version()
    agent.metrics.certificates = CertificateFiles({"agent": str(cert)}).expiries
    agent.metrics.impersonation_profile = lambda: profile.profile.name
    log.info("settings not at their defaults: %s", " ".join(settings.changed(config)) or "none")
    log.info("agent for cluster %s: hub %s:%d, apiserver %s, services allowed: %s",
             cluster, hub_host, hub_port, kube.describe(),
             ", ".join(f"{n}/{s}:{p}" for n, s, p in config.allow_services) or "none")

    from gateway.ops import gctune

    gctune.settle()
    health = None
    if config.health_listen is not None:
        host, port = config.health_listen
        try:
            health = await start_health_server(host, port, readiness, agent.metrics.render)
        except OSError as exc:
            raise startup.bind_error(exc, host, port, "--health-listen") from None
        log.info("health on %s:%d (/healthz, /readyz, /metrics)", host, port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    run_task = loop.create_task(dialer.run(), name="dialer")
    probe_task = loop.create_task(readiness.probe_forever(), name="readiness")
    renew_task = loop.create_task(
        enrollment.renew_forever() if enrollment is not None else stop.wait(), name="renewal")
    profile_task = loop.create_task(profile.run(), name="impersonation-profile")
    stop_task = loop.create_task(stop.wait())
    print(f"hubproxy agent {cluster} started", flush=True)
    try:
        done, _ = await asyncio.wait({run_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if run_task in done:
            run_task.result()  # the dialer never returns on its own: surface its error
            return 1
        log.info("draining (up to %.0fs)", config.drain_timeout)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(dialer.drain(config.drain_timeout), config.drain_timeout + 5)
        return 0
    finally:
        for task in (run_task, probe_task, profile_task, stop_task, renew_task):
            task.cancel()
        for task in (run_task, probe_task, profile_task, stop_task, renew_task):
            with contextlib.suppress(BaseException):
                await task
        pool.close()
        if health is not None:
            await health.cleanup()
        log.info("agent stopped")


def tunnel_alpn() -> list[str]:
    """The tunnel's ALPN name (the dialer insists on it)."""
    from tunnel.connection import ALPN

    return [ALPN]


def run(args: argparse.Namespace) -> int:
    config = settings.from_args(AgentConfig, args)
    diagnostics.configure(config.log_level)
    tune_heap()
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(serve(config))
        return uvloop.run(serve(config))
    except (KubeAPIConfigError, ValueError, OSError, ProxyError, EnrollmentError) as exc:
        print(f"hubproxy agent: {exc}", file=sys.stderr)
        return 2
