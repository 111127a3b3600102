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
from typing import Any

from certs.identity import validate_cluster_name
from certs.tls import TLS1_3, ReloadingContext, client_context
from gateway.agent.enroll import EnrollmentError
from gateway.agent.impersonation import ProfileWatch
from gateway.agent.kubeapi import KubeAPIAccess, KubeAPIConfigError, load
from gateway.ops import diagnostics, startup
from gateway.ops.certexpiry import CertificateFiles
from gateway.ops.flags import add_tunnel_liveness_arguments, positive_int, tunnel_liveness
from gateway.ops.rlimits import raise_open_file_limit
from gateway.ops.version import pack_release, version
from tunnel.identity import URI_NAMING, AgentIdentityError, AgentNaming
from tunnel.proxy import ProxyError, proxy_for
from tunnel.session_state import AGENT_PING_AFTER

log = logging.getLogger("hubproxy.agent")

READINESS_INTERVAL = 5.0
READINESS_STALE = 20.0


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def _service_key(value: str) -> tuple[str, str, int]:
    ns_name, sep, port = value.rpartition(":")
    ns, slash, name = ns_name.partition("/")
    if not sep or not slash or not ns or not name or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAMESPACE/NAME:PORT")
    return ns, name, int(port)


def _service_address(value: str) -> tuple[tuple[str, str, int], tuple[str, int]]:
    service, eq, address = value.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NS/NAME:PORT=HOST:PORT")
    return _service_key(service), _host_port(address)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    hub = parser.add_argument_group("hub")
    hub.add_argument("--hub", required=True, type=_host_port, metavar="HOST:PORT",
                     help="the hub's tunnel endpoint (gateway --tunnel-listen)")
    hub.add_argument("--cluster", required=True,
                     help="this cluster's name; must match the agent certificate")
    hub.add_argument("--tls-dir", required=True, metavar="DIR",
                     help="tls.crt/tls.key (agent client cert) and ca.crt (tunnel CA)")
    hub.add_argument("--agent-identity", choices=("uri", "ocm"), default="uri",
                     help="how the certificate names this cluster, as the gateway reads it: "
                     "uri (hubproxy certs) or ocm (an Open Cluster Management add-on "
                     "certificate) (default: %(default)s)")
    hub.add_argument("--ocm-addon-name", default="hubproxy", metavar="NAME",
                     help="with --agent-identity=ocm, this add-on's name (default: %(default)s)")
    hub.add_argument("--credentials-secret", metavar="NAMESPACE/NAME",
                     help="join mode (hubproxy cluster add): keep the agent's key and "
                     "certificate in this Secret of the managed cluster, which holds ca.crt "
                     "(the hub CA) and, until the first join, the join token; the agent makes "
                     "its key, gets its certificate with the token, renews it at two thirds of "
                     "its lifetime, and writes the files it dials with into --tls-dir (which "
                     "must then be writable). Needs get/update on that Secret only")
    hub.add_argument("--hub-ca", metavar="FILE",
                     help="CA that verifies the hub (default DIR/ca.crt); never system roots")
    hub.add_argument("--hub-server-name", metavar="NAME",
                     help="name to verify in the hub certificate (default the --hub host)")
    hub.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                     help="on SIGTERM, how long in-flight streams may take to finish")

    kube = parser.add_argument_group("kube-apiserver (default: in-cluster service account)")
    kube.add_argument("--kubeconfig", metavar="FILE",
                      help="server, CA and credential (token, tokenFile or client cert)")
    kube.add_argument("--context", help="kubeconfig context (default current-context)")
    kube.add_argument("--apiserver", metavar="URL", help="override the apiserver URL")
    kube.add_argument("--apiserver-ca", metavar="FILE", help="override the apiserver CA")
    kube.add_argument("--token-file", metavar="FILE",
                      help="override the agent's token (file re-read when it changes)")
    kube.add_argument("--apiserver-protocol", choices=["auto", "h1", "h2"], default="auto",
                      help="HTTP version to the apiserver (default: %(default)s). auto: "
                      "every request and watch is a stream of a few HTTP/2 connections when "
                      "the apiserver offers h2 in TLS ALPN (kube-apiserver does; as client-go "
                      "does; about 5 KB per idle watch instead of a 48 KB connection each, and "
                      "no more CPU per short request than pooled HTTP/1.1); a "
                      "server that picks http/1.1 gets HTTP/1.1 throughout. h2: every request "
                      "as an HTTP/2 stream (required: a server without it is unreachable). "
                      "h1: HTTP/1.1 only. exec, attach and port-forward always use HTTP/1.1 "
                      "connections")
    kube.add_argument("--apiserver-h2-streams", type=positive_int, default=100, metavar="N",
                      help="most requests in progress on one HTTP/2 connection to the "
                      "apiserver (default: %(default)s; the apiserver's own "
                      "SETTINGS_MAX_CONCURRENT_STREAMS lowers it: kube-apiserver announces "
                      "100 unless --http2-max-streams-per-connection says otherwise); more "
                      "open another connection")

    targets = parser.add_argument_group("targets (default deny)")
    targets.add_argument("--allow-service", action="append", default=[], type=_service_key,
                         metavar="NS/NAME:PORT", help="a Service the hub may reach (repeatable)")
    targets.add_argument("--insecure-service", action="append", default=[], type=_service_key,
                         metavar="NS/NAME:PORT",
                         help="an allow-listed https Service whose certificate is NOT verified")
    targets.add_argument("--service-ca", metavar="FILE",
                         help="CA for https Services (default: the cluster CA)")
    targets.add_argument("--allow-tcp", action="append", default=[], type=_host_port,
                         metavar="HOST:PORT", help="a raw TCP target the hub may reach")
    targets.add_argument("--allow-loopback-targets", action="store_true",
                         help="allow loopback/link-local targets (local demos and tests only)")
    targets.add_argument("--service-address", action="append", default=[],
                         type=_service_address, metavar="NS/NAME:PORT=HOST:PORT",
                         help="dial this address for a Service instead of resolving it (tests)")

    parser.add_argument("--max-upstream-connections", type=positive_int, default=2048,
                        metavar="N",
                        help="connections to the apiserver and Services at once (default: "
                        "%(default)s). Over HTTP/1.1 each request in progress holds one, and a "
                        "watch or logs -f holds it while it is open, about 50 KiB each: raise "
                        "this together with the memory limit; over HTTP/2 one holds up to "
                        "--apiserver-h2-streams of them. Beyond it requests are answered 429")
    add_tunnel_liveness_arguments(parser, "hub", AGENT_PING_AFTER)
    parser.add_argument("--health-listen", default="0.0.0.0:8000", metavar="ADDR",
                        help="plain HTTP /healthz, /readyz and /metrics ('off' to disable)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])


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


def build_policy(args: argparse.Namespace, kube: KubeAPIAccess | None) -> Any:
    from tunnel.policy import ServiceRule, TargetPolicy

    rules = [ServiceRule.parse(f"{ns}/{name}:{port}") for ns, name, port in args.allow_service]
    return TargetPolicy(
        kube_api=(kube.host, kube.port) if kube else None,
        allow_services=rules,
        allow_tcp=list(args.allow_tcp),
        allow_loopback=args.allow_loopback_targets,
        service_address_overrides=dict(args.service_address),
    )


async def serve(args: argparse.Namespace) -> int:

    cluster = validate_cluster_name(args.cluster)
    keepalive, tunnel_timeout = tunnel_liveness(args)
    tls_dir = Path(args.tls_dir)
    cert, key = tls_dir / "tls.crt", tls_dir / "tls.key"
    hub_ca = Path(args.hub_ca) if args.hub_ca else tls_dir / "ca.crt"
    if not args.credentials_secret:  # join mode writes them from its Secret first
        startup.check_key_pair(args.tls_dir, "--tls-dir")
        startup.check_ca_file(str(hub_ca), "--hub-ca" if args.hub_ca
                              else "--hub-ca (default: ca.crt in --tls-dir)")
    try:
        naming = AgentNaming(args.agent_identity, args.ocm_addon_name)
    except ValueError as exc:
        raise ValueError(f"--ocm-addon-name: {exc}") from None
    if not args.credentials_secret:
        _check_certificate_cluster(cert, cluster, naming)
    health_address = None
    if args.health_listen and args.health_listen != "off":
        try:
            health_address = _host_port(args.health_listen)
        except argparse.ArgumentTypeError as exc:
            raise startup.StartupError(f"--health-listen {exc}") from None
        startup.check_port_free(*health_address, "--health-listen")
    kube = load(kubeconfig=args.kubeconfig, context=args.context, apiserver=args.apiserver,
                apiserver_ca=args.apiserver_ca, token_file=args.token_file)
    hub_host, hub_port = args.hub
    # An egress proxy from HTTPS_PROXY/NO_PROXY, as curl and Go read them (tunnel.proxy).
    proxy = proxy_for(os.environ, hub_host, hub_port)
    enrollment = None
    if args.credentials_secret:
        from gateway.agent.enroll import CredentialSecret, Enrollment

        namespace, slash, name = args.credentials_secret.partition("/")
        if not slash or not namespace or not name:
            raise ValueError("--credentials-secret: expected NAMESPACE/NAME")
        enrollment = Enrollment(cluster=cluster, secret=CredentialSecret(kube, namespace, name),
                                tls_dir=tls_dir, hub=(hub_host, hub_port),
                                server_hostname=args.hub_server_name, proxy=proxy)
        await enrollment.ensure()
        _check_certificate_cluster(cert, cluster, naming)
    insecure = set(args.insecure_service)
    if not insecure <= set(args.allow_service):
        raise ValueError("--insecure-service names a Service that is not --allow-service'd")
    # Imported only now: `hubproxy --help` and the checks above need none of the data path.

    from gateway.agent.agent import Agent
    from gateway.agent.health import start_health_server
    from gateway.agent.pool import UpstreamPool
    from tunnel.connection import SessionConfig
    from tunnel.dialer import AgentDialer, HubFanout

    policy = build_policy(args, kube)
    raise_open_file_limit(args.max_upstream_connections + 256)
    pool = UpstreamPool(max_connections=args.max_upstream_connections,
                        h2_max_streams=args.apiserver_h2_streams)
    agent = Agent(cluster=cluster, policy=policy, kube=kube, pool=pool,
                  apiserver_protocol=args.apiserver_protocol,
                  service_ca=args.service_ca, insecure_services=frozenset(insecure))

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
    # One session to each hub process behind the address (gateway workers, hub replicas).
    dialer = HubFanout(lambda fanout: AgentDialer(
        hub_host, hub_port, hub_tls.current, agent.on_open,
        SessionConfig(ping_after=keepalive, dead_after=tunnel_timeout,
                      agent_version=pack_release(version()), agent_instance=agent_instance),
        server_hostname=args.hub_server_name or hub_host, fanout=fanout, proxy=proxy))
    profile = ProfileWatch(kube)
    readiness = Readiness(dialer, kube, profile)
    agent.metrics.sessions = lambda: dialer.sessions
    agent.metrics.version = version()
    agent.metrics.certificates = CertificateFiles({"agent": str(cert)}).expiries
    agent.metrics.impersonation_profile = lambda: profile.profile.name
    log.info("agent for cluster %s: hub %s:%d, apiserver %s, services allowed: %s",
             cluster, hub_host, hub_port, kube.describe(),
             ", ".join(f"{n}/{s}:{p}" for n, s, p in args.allow_service) or "none")

    from gateway.ops import gctune

    gctune.settle()
    health = None
    if health_address is not None:
        host, port = health_address
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
        log.info("draining (up to %.0fs)", args.drain_timeout)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(dialer.drain(args.drain_timeout), args.drain_timeout + 5)
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
    diagnostics.configure(args.log_level)
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(serve(args))
        return uvloop.run(serve(args))
    except (KubeAPIConfigError, ValueError, OSError, ProxyError, EnrollmentError) as exc:
        print(f"hubproxy agent: {exc}", file=sys.stderr)
        return 2
