"""The agent's configuration: one frozen object, and the one declaration of every flag.

Each field declared with :func:`gateway.ops.settings.setting` is a flag of ``hubproxy agent``
(name, type, default, ``HUBPROXY_*`` variable and help written once); ``gateway.agent.command``
generates the parser from this class and builds the object back from what it parsed. Rules
about settings together are in :meth:`AgentConfig.validate`; files are checked where they are
read.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gateway.ops import shared_settings as shared
from gateway.ops.flags import check_tunnel_liveness, parse_address
from gateway.ops.settings import ADDRESS, COUNT, SECONDS, SWITCH, Kind, setting
from tunnel.identity import AgentNaming
from tunnel.session_state import AGENT_PING_AFTER

HUB = "hub"
KUBE = "kube-apiserver (default: in-cluster service account)"
TARGETS = "targets (default deny)"
LIMITS = "limits"
LISTENERS = "listeners"

ServiceKey = tuple[str, str, int]  # namespace, name, port
Address = tuple[str, int]


def parse_service(value: str) -> ServiceKey:
    """``NAMESPACE/NAME:PORT`` -> (namespace, name, port); ArgumentTypeError otherwise."""
    ns_name, sep, port = value.rpartition(":")
    ns, slash, name = ns_name.partition("/")
    if not sep or not slash or not ns or not name or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAMESPACE/NAME:PORT")
    return ns, name, int(port)


def parse_service_address(value: str) -> tuple[ServiceKey, Address]:
    """``NS/NAME:PORT=HOST:PORT``: a Service and the address to dial for it."""
    service, eq, address = value.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NS/NAME:PORT=HOST:PORT")
    try:
        return parse_service(service), parse_address(address)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


SERVICE = Kind(parse_service, lambda key: f"{key[0]}/{key[1]}:{key[2]}", "NS/NAME:PORT")
SERVICE_ADDRESS = Kind(parse_service_address, str, "NS/NAME:PORT=HOST:PORT")


@dataclass(frozen=True)
class AgentConfig:
    hub: Address | None = setting(
        None, kind=ADDRESS, required=True, group=HUB,
        help="the hub's tunnel endpoint (gateway --tunnel-listen)")
    cluster: str = setting(
        "", required=True, metavar="CLUSTER", group=HUB,
        help="this cluster's name; must match the agent certificate")
    tls_dir: str = setting(
        "", required=True, metavar="DIR", group=HUB,
        help="tls.crt/tls.key (agent client cert) and ca.crt (tunnel CA)")
    agent_identity: str = shared.agent_identity(
        HUB, "how the certificate names this cluster, as the gateway reads it: uri (hubproxy "
        "certs) or ocm (an Open Cluster Management add-on certificate) (default: {default})")
    ocm_addon_name: str = shared.ocm_addon_name(
        HUB, "with --agent-identity=ocm, this add-on's name (default: {default})")
    credentials_secret: str | None = setting(
        None, metavar="NAMESPACE/NAME", group=HUB,
        help="join mode (hubproxy cluster add): keep the agent's key and certificate in this "
        "Secret of the managed cluster, which holds ca.crt (the hub CA) and, until the first "
        "join, the join token; the agent makes its key, gets its certificate with the token, "
        "renews it at two thirds of its lifetime, and writes the files it dials with into "
        "--tls-dir (which must then be writable). Needs get/update on that Secret only")
    hub_ca: str | None = setting(
        None, metavar="FILE", group=HUB,
        help="CA that verifies the hub (default DIR/ca.crt); never system roots")
    hub_server_name: str | None = setting(
        None, metavar="NAME", group=HUB,
        help="name to verify in the hub certificate (default the --hub host)")
    drain_timeout: float = setting(
        30.0, kind=SECONDS, group=HUB,
        help="on SIGTERM, how long in-flight streams may take to finish")

    kubeconfig: str | None = setting(
        None, metavar="FILE", group=KUBE,
        help="server, CA and credential (token, tokenFile or client cert)")
    context: str | None = setting(
        None, metavar="CONTEXT", group=KUBE, help="kubeconfig context (default current-context)")
    apiserver: str | None = setting(
        None, metavar="URL", group=KUBE, help="override the apiserver URL")
    apiserver_ca: str | None = setting(
        None, metavar="FILE", group=KUBE, help="override the apiserver CA")
    token_file: str | None = setting(
        None, metavar="FILE", group=KUBE,
        help="override the agent's token (file re-read when it changes)")
    apiserver_protocol: str = setting(
        "auto", choices=("auto", "h1", "h2"), group=KUBE,
        help="HTTP version to the apiserver (default: {default}). auto: every request and "
        "watch is a stream of a few HTTP/2 connections when the apiserver offers h2 in TLS "
        "ALPN (kube-apiserver does; as client-go does; about 5 KB per idle watch instead of a "
        "48 KB connection each, and no more CPU per short request than pooled HTTP/1.1); a "
        "server that picks http/1.1 gets HTTP/1.1 throughout. h2: every request as an HTTP/2 "
        "stream (required: a server without it is unreachable). h1: HTTP/1.1 only. exec, "
        "attach and port-forward always use HTTP/1.1 connections")
    apiserver_h2_streams: int = setting(
        100, kind=COUNT, group=KUBE,
        help="most requests in progress on one HTTP/2 connection to the apiserver (default: "
        "{default}; the apiserver's own SETTINGS_MAX_CONCURRENT_STREAMS lowers it: "
        "kube-apiserver announces 100 unless --http2-max-streams-per-connection says "
        "otherwise); more open another connection")

    allow_services: tuple[ServiceKey, ...] = setting(
        (), option="--allow-service", kind=SERVICE, repeatable=True, group=TARGETS,
        help="a Service the hub may reach (repeatable)")
    insecure_services: tuple[ServiceKey, ...] = setting(
        (), option="--insecure-service", kind=SERVICE, repeatable=True, group=TARGETS,
        help="an allow-listed https Service whose certificate is NOT verified")
    service_ca: str | None = setting(
        None, metavar="FILE", group=TARGETS,
        help="CA for https Services (default: the cluster CA)")
    allow_tcp: tuple[Address, ...] = setting(
        (), kind=ADDRESS, repeatable=True, group=TARGETS,
        help="a raw TCP target the hub may reach")
    allow_loopback_targets: bool = setting(
        False, kind=SWITCH, group=TARGETS,
        help="allow loopback/link-local targets (local demos and tests only)")
    service_addresses: tuple[tuple[ServiceKey, Address], ...] = setting(
        (), option="--service-address", kind=SERVICE_ADDRESS, repeatable=True, group=TARGETS,
        help="dial this address for a Service instead of resolving it (tests)")

    max_upstream_connections: int = setting(
        2048, kind=COUNT, group=LIMITS,
        help="connections to the apiserver and Services at once (default: {default}). Over "
        "HTTP/1.1 each request in progress holds one, and a watch or logs -f holds it while it "
        "is open, about 50 KiB each: raise this together with the memory limit; over HTTP/2 "
        "one holds up to --apiserver-h2-streams of them. Beyond it requests are answered 429")
    tunnel_keepalive: float = shared.tunnel_keepalive("hub", AGENT_PING_AFTER)
    tunnel_timeout: float = shared.tunnel_timeout("hub")
    tunnel_memory_budget: int = shared.tunnel_memory_budget()
    health_listen: Address | None = shared.health_listen(
        LISTENERS, "/healthz, /readyz and /metrics")
    log_level: str = shared.log_level()

    @property
    def agent_naming(self) -> AgentNaming:
        """How the certificate names this cluster (ValueError if the add-on name is bad)."""
        return AgentNaming(self.agent_identity, self.ocm_addon_name)

    @property
    def credentials(self) -> tuple[str, str] | None:
        """--credentials-secret as (namespace, name); None without join mode."""
        if not self.credentials_secret:
            return None
        namespace, _, name = self.credentials_secret.partition("/")
        return namespace, name

    def validate(self) -> None:
        """ValueError naming the flag when a setting, or settings together, cannot work."""
        check_tunnel_liveness(self.tunnel_keepalive, self.tunnel_timeout)
        try:
            self.agent_naming  # noqa: B018 -- constructing it is the check
        except ValueError as exc:
            raise ValueError(f"--ocm-addon-name: {exc}") from None
        if self.credentials_secret:
            namespace, slash, name = self.credentials_secret.partition("/")
            if not slash or not namespace or not name:
                raise ValueError("--credentials-secret: expected NAMESPACE/NAME")
        if not set(self.insecure_services) <= set(self.allow_services):
            raise ValueError("--insecure-service names a Service that is not --allow-service'd")
