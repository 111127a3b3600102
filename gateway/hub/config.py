"""The gateway's configuration: one frozen object, and the one declaration of every flag.

Each field declared with :func:`gateway.ops.settings.setting` is a flag of ``hubproxy
gateway``: its name, type, default, ``HUBPROXY_*`` variable and help are written there once, and
``gateway.hub.serve`` generates the parser from this class and builds the object back from what
it parsed (:func:`gateway.ops.settings.from_args`). Rules about settings together are in
:meth:`GatewayConfig.validate`. ``gateway.hub.app`` and the front door read only this object, so
a test can build a gateway without argparse. Every limit has a default that is safe for a
production hub; every timeout is in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.ops import shared_settings as shared
from gateway.ops import startup
from gateway.ops.flags import OFF, Network, check_tunnel_liveness
from gateway.ops.k8saudit.backends import AUDIT_FLAGS, WebhookSettings
from gateway.ops.metrics import BASIC_SERIES_PER_CLUSTER, REQUEST_BUCKETS
from gateway.ops.settings import (
    ADDRESS,
    COUNT,
    COUNT_OR_ZERO,
    DURATION,
    NAME_OR_NONE,
    NETWORKS,
    RATE,
    SECONDS,
    SIZE,
    SWITCH,
    Kind,
    section,
    setting,
)
from gateway.wire.http1 import DEFAULT_LIMITS, Limits
from gateway.wire.identity import DEFAULT_PREFIX, IdentityError, validate_prefix
from tunnel.admission import DEFAULT_BACKLOG, DEFAULT_MAX_HANDSHAKES
from tunnel.frames import MAX_HUB_INSTANCES
from tunnel.identity import AgentNaming
from tunnel.session_state import HUB_PING_AFTER

# --help sections, in the order they are first used below
LISTENERS = "listeners"
CERTIFICATES = "certificates (reloaded when the files change)"
HUB = "hub authentication and authorization"
EDGE = ("the real client behind a load balancer or an ingress (both off by default: the "
        "connection's address is the client)")
LIMITS = "limits and timeouts"
FAIR = ("fair queuing of short requests between identities (as kube-apiserver's API Priority "
        "and Fairness; watches, logs -f, exec, attach and port-forward are not queued: "
        "--max-streams-per-identity caps them)")
INSTANCES = "instances, workers and shutdown"
JOIN = "joining clusters (hubproxy cluster add|list|remove; see deploy/README.md)"
CLUSTERPROFILES = "ClusterProfile access provider (multicluster.x-k8s.io/v1alpha1)"
FLEET = "fleet scale: writes to the hub and per-cluster metrics"
OCM = "Open Cluster Management add-on (deploy/ocm)"

DEFAULT_MAX_REQUEST_BODY = 3 * 1024 * 1024  # kube-apiserver's MaxRequestBodyBytes
# Longest single header field line: the whole head may be larger (--max-header-bytes).
MAX_FIELD_LINE = 64 * 1024
# Hub writes per second and burst, per gateway process (gateway.hub.hubwrites). client-go's
# rest.Config defaults are 5 and 10; controllers built on it (controller-runtime) raise them to
# 20 and 30, which a fleet's writes need and a hub takes easily.
DEFAULT_HUB_WRITE_QPS = 20.0
DEFAULT_HUB_WRITE_BURST = 30


@dataclass(frozen=True)
class FrontDoorLimits:
    """What one client may make the gateway hold (DESIGN §6 rule 7)."""

    max_header_bytes: int = setting(
        DEFAULT_LIMITS.max_head_bytes, kind=COUNT, group=LIMITS,
        help="request head size limit (431 beyond; default: {default})")
    max_headers: int = setting(
        DEFAULT_LIMITS.max_headers, kind=COUNT, group=LIMITS,
        help="header field count limit (431 beyond; default: {default})")
    max_request_line: int = setting(
        DEFAULT_LIMITS.max_request_line, kind=COUNT, group=LIMITS,
        help="request line length limit (414 beyond; default: {default})")
    max_request_body: int = setting(
        DEFAULT_MAX_REQUEST_BODY, kind=SIZE, group=LIMITS,
        help="request body size limit in bytes, or with Ki/Mi/Gi (default: {default}, "
        "kube-apiserver's own limit). 413 before anything is forwarded when Content-Length "
        "says more (no 100 Continue is sent); a chunked body is counted as it streams, and the "
        "request is cancelled upstream and answered 413 once it passes the limit")
    header_timeout: float = setting(  # first byte of a request head -> its end
        30.0, kind=DURATION, group=LIMITS,
        help="time to receive a request head (408 beyond; default: {default})")
    idle_timeout: float = setting(  # keep-alive connection with no request in progress
        120.0, kind=DURATION, group=LIMITS,
        help="close keep-alive connections idle this long")
    # Short request sent -> response head (0: none); watches, follow and upgrades exempt.
    response_header_timeout: float = setting(
        60.0, kind=DURATION, group=LIMITS,
        help="time from a short request to its response head (504 beyond; 0: none; default: "
        "{default}, kube-apiserver's own request timeout). Watches, logs -f and upgrades are "
        "exempt, and there is no total timeout")
    max_connections: int = setting(
        10000, kind=COUNT, group=LIMITS, help="client connections at once")
    max_inflight: int = setting(  # requests between head and response end
        10000, kind=COUNT, group=LIMITS,
        help="requests in progress at once (429 beyond; default: {default})")
    http2: bool = setting(  # offer ALPN h2 at the front door (HTTP/1.1 is always offered)
        True, kind=SWITCH, option="--no-http2", negated=True, group=LIMITS,
        help="offer only HTTP/1.1 at the front door (ALPN). By default h2 is offered too: "
        "kubectl and client-go then carry every request and watch of a context as streams of "
        "one connection (upgrades such as exec and port-forward still use HTTP/1.1)")
    max_h2_streams: int = setting(  # SETTINGS_MAX_CONCURRENT_STREAMS per HTTP/2 connection
        250, kind=COUNT, group=LIMITS,
        help="concurrent streams per HTTP/2 client connection (SETTINGS_MAX_CONCURRENT_STREAMS;"
        " default: {default}, Go's own). client-go opens another connection when one is full; "
        "each open stream is a request in progress (--max-inflight counts it)")
    max_buffer: int = 256 * 1024  # client bytes held while authenticating / pipelined
    write_high_water: int = 512 * 1024  # client transport buffer that pauses the stream
    # The parser's limits, from the three flags above.
    head: Limits = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", Limits(
            max_head_bytes=self.max_header_bytes, max_request_line=self.max_request_line,
            max_field_line=min(self.max_header_bytes, MAX_FIELD_LINE),
            max_headers=self.max_headers))


@dataclass(frozen=True)
class ClusterProfileSettings:
    """The ClusterProfile access-provider writer's part (``gateway.hub.clusterprofile``)."""

    mode: str | None = setting(
        None, option="--clusterprofiles", choices=("on", "off"), group=CLUSTERPROFILES,
        help="on: publish our status.accessProviders entry on the ClusterProfiles of clusters "
        "this gateway serves; off: remove it everywhere (feature disabled). Unset: leave "
        "ClusterProfiles alone")
    public_url: str | None = setting(
        None, metavar="URL", group=CLUSTERPROFILES,
        help="URL consumers use to reach this gateway, e.g. https://hubproxy.example:9092 "
        "(required with --clusterprofiles=on); each cluster is <public-url>/<cluster>")
    provider_name: str = setting(
        "hubproxy", option="--access-provider-name", metavar="NAME", group=CLUSTERPROFILES,
        help="name of our accessProviders entry (default: {default}; 'open-cluster-management' "
        "for drop-in use with OCM consumers)")
    # Also the inventory's namespaces (--cluster-inventory clusterprofiles).
    namespaces: tuple[str, ...] = setting(
        (), option="--clusterprofile-namespace", repeatable=True, metavar="NAMESPACE",
        group=CLUSTERPROFILES,
        help="namespace whose ClusterProfiles to manage (repeatable; default: all namespaces)")
    ca: str | None = setting(
        None, option="--clusterprofile-ca", metavar="FILE", group=CLUSTERPROFILES,
        help="CA bundle to publish (default: ca.crt in --tls-dir); leaf certificates are "
        "dropped, only CAs are published")
    grace: float = setting(
        60.0, option="--clusterprofile-grace", kind=SECONDS, group=CLUSTERPROFILES,
        help="keep a cluster's entry this long after its last agent disconnects, and after the "
        "gateway starts, so a reconnecting agent (or a restarted gateway) does not make "
        "consumers flap (default: {default})")

    def validate(self) -> None:
        if self.mode == "on" and not self.public_url:
            raise ValueError("--clusterprofiles=on needs --public-url (the URL consumers reach "
                             "us at)")


@dataclass(frozen=True)
class AddOnConditionSettings:
    """The ManagedClusterAddOn condition writer's part (``gateway.hub.ocm``)."""

    enabled: bool = setting(
        False, option="--ocm-addon-conditions", kind=SWITCH, group=OCM,
        help="keep a TunnelConnected condition on each served cluster's ManagedClusterAddOn "
        "(named --ocm-addon-name, in the cluster's namespace): True while its agent holds a "
        "session here, False once none has for --ocm-addon-grace. Needs hub RBAC: get, list "
        "and watch managedclusteraddons, patch managedclusteraddons/status (without list, each "
        "add-on is read before it is written). Off by default")
    grace: float = setting(
        60.0, option="--ocm-addon-grace", kind=SECONDS, group=OCM,
        help="wait this long after a cluster's last agent left before writing False, so a "
        "reconnecting agent does not make the condition flap (default: {default})")


def _namespace_or_off(value: str) -> str | None:
    text = value.strip()
    return None if text in ("", OFF) else text


NAMESPACE_OR_OFF = Kind(_namespace_or_off, metavar="NAMESPACE")


@dataclass(frozen=True)
class GatewayConfig:
    listen: tuple[str, int] = setting(
        ("0.0.0.0", 9092), kind=ADDRESS, group=LISTENERS, help="front door for users, HTTPS")
    tunnel_listen: tuple[str, int] = setting(
        ("0.0.0.0", 8091), kind=ADDRESS, group=LISTENERS, help="agent tunnel, mTLS 1.3")
    # Agent admission (tunnel.admission): handshakes at once, and the listen queue behind them.
    tunnel_max_handshakes: int = setting(
        DEFAULT_MAX_HANDSHAKES, kind=COUNT, group=LISTENERS,
        help="agent TLS handshakes in flight at most; further agents wait in the listen queue, "
        "and one that waited nearly an agent's handshake timeout is told the hub is busy before "
        "any TLS work (default: {default})")
    tunnel_backlog: int = setting(
        DEFAULT_BACKLOG, kind=COUNT, group=LISTENERS,
        help="listen queue of the tunnel port: agents waiting for a handshake (the kernel caps "
        "it at net.core.somaxconn; default: {default})")
    health_listen: tuple[str, int] | None = shared.health_listen(
        LISTENERS, "/healthz /readyz /metrics /clusters")

    tls_dir: str | None = setting(  # tls.crt / tls.key of the front door
        None, required=True, metavar="DIR", group=CERTIFICATES,
        help="front-door serving certificate: DIR/tls.crt, DIR/tls.key")
    tunnel_tls_dir: str | None = setting(  # tls.crt / tls.key of the tunnel listener
        None, required=True, metavar="DIR", group=CERTIFICATES,
        help="tunnel serving certificate: DIR/tls.crt, DIR/tls.key")
    agent_ca: str | None = setting(  # CA that issued agent client certificates
        None, required=True, metavar="FILE", group=CERTIFICATES,
        help="CA bundle that issued agent client certificates (REQUIRED: the gateway refuses "
        "to start without it)")
    agent_identity: str = shared.agent_identity(
        CERTIFICATES, "where an agent certificate names its cluster. uri: the URI SAN "
        "hubproxy://cluster/<name> (hubproxy certs); ocm: the subject Open Cluster Management "
        "gives an add-on agent, CN=system:open-cluster-management:cluster:<name>:addon:<addon>:"
        "agent:<agent> (deploy/ocm) (default: {default})")
    ocm_addon_name: str = shared.ocm_addon_name(
        CERTIFICATES,
        "with --agent-identity=ocm, the add-on whose agents may connect (default: {default})")

    hub_kubeconfig: str | None = setting(  # None: in-cluster service account
        None, metavar="FILE", group=HUB,
        help="kubeconfig for the hub API (TokenReview, SubjectAccessReview); default: "
        "in-cluster service account")
    audiences: tuple[str, ...] = setting(
        (), option="--audience", repeatable=True, metavar="AUD", group=HUB,
        help="accept only tokens for this audience (repeatable)")
    token_cache_ttl: float = setting(
        10.0, kind=DURATION, group=HUB,
        help="cache TokenReview/SubjectAccessReview outcomes this long (default: {default}; 0 "
        "disables)")
    # While the hub cannot be asked, accept what it confirmed up to this long past the TTL.
    hub_outage_grace: float = setting(
        300.0, kind=DURATION, group=HUB,
        help="while the hub cannot be asked (down, timing out, or past "
        "--hub-max-concurrent-reviews), keep accepting a token, and the managedclusters/proxy "
        "permission, that the hub itself confirmed less than --token-cache-ttl + DURATION ago; "
        "asked again once per --token-cache-ttl. Tokens never seen, and any the hub said no to, "
        "get 503 with Retry-After. A revocation made during the outage takes effect when the "
        "hub answers again (default: {default}; 0: refuse every request the hub cannot "
        "confirm)")
    identity_prefix: str = setting(
        DEFAULT_PREFIX, metavar="PREFIX", group=HUB,
        help="prefix for every hub user and group on managed clusters")
    authorize: str = setting(
        "sar", choices=("sar", "none"), group=HUB,
        help="sar: hub SubjectAccessReview 'get managedclusters/proxy <cluster>' (group "
        "cluster.open-cluster-management.io); none: any authenticated hub user")
    token_passthrough: bool = setting(
        False, kind=SWITCH, group=HUB,
        help="forward a token the hub cleanly rejects, untouched and without impersonation "
        "(for managed-cluster tokens); off by default")
    # The hub is not a free oracle (gateway.hub.admission.hubload): failed authentications per
    # client address (token bucket), and concurrent hub reviews (503 after a short wait).
    auth_failure_rate: float = setting(
        1.0, kind=RATE, group=HUB,
        help="failed authentications allowed per second and client address (IPv6: per /64), "
        "sustained (default: {default}). Beyond it and the burst, that address's requests that "
        "would need a hub TokenReview get 429 with Retry-After; tokens already cached as valid "
        "still pass. Counted per gateway process (--workers, --replicas)")
    auth_failure_burst: int = setting(
        20, kind=COUNT, group=HUB,
        help="failed authentications a client address may make in a burst before "
        "--auth-failure-rate applies")
    # The real client behind a load balancer (gateway.hub.admission.forwarded; empty: off).
    # Connections from these addresses must start with a PROXY protocol header (v1 or v2),
    # whose source is then the client (gateway.hub.proxyaccept); from elsewhere, one is refused.
    proxy_protocol_from: tuple[Network, ...] = setting(
        (), kind=NETWORKS, repeatable=True, group=EDGE,
        help="load balancers that send the PROXY protocol (v1 or v2; HAProxy send-proxy-v2, "
        "AWS NLB proxy protocol v2, ...): a connection from these addresses must start with a "
        "PROXY header, read before TLS, and its source address is the client for the "
        "failed-authentication limit, the audit trail and the X-Forwarded-For sent on; a LOCAL "
        "or UNKNOWN header keeps the balancer's address. A connection from there without a "
        "valid header (within --header-timeout), or from anywhere else with one, is closed "
        "before TLS. Repeatable, or comma-separated")
    # Requests on connections from these addresses come from the right-most X-Forwarded-For
    # entry that is not one of them.
    forwarded_for_from: tuple[Network, ...] = setting(
        (), kind=NETWORKS, repeatable=True, group=EDGE,
        help="proxies that terminate TLS in front of the gateway and append the client to "
        "X-Forwarded-For (an ingress): on connections from these addresses the client is the "
        "right-most X-Forwarded-For entry that is not one of them (what a client writes "
        "further left is ignored). Repeatable, or comma-separated")
    hub_max_concurrent_reviews: int = setting(
        64, kind=COUNT, group=HUB,
        help="TokenReview and SubjectAccessReview calls to the hub in flight at once, per "
        "gateway process (identical ones are coalesced; default: {default})")
    hub_review_wait: float = setting(
        1.0, kind=DURATION, group=HUB,
        help="how long a review waits for one of those slots before the request gets 503 with "
        "Retry-After")

    # Long-running requests (watches, logs -f, exec/attach/port-forward) open at once per
    # (identity, cluster); 429 beyond (gateway.hub.admission.streams).
    max_streams_per_identity: int = setting(
        500, kind=COUNT, group=LIMITS,
        help="long-running requests (watches, logs -f, exec, attach, port-forward) one "
        "identity may hold open on one cluster at once; 429 beyond (default: {default}). The "
        "identity is the hub user (with --token-passthrough: the token). A controller that "
        "watches every resource type of a CRD-heavy cluster (Argo CD's cluster cache) needs "
        "one watch per type: size it for that")
    # Short requests executing at once (seats); more wait in per-identity fair queues
    # (gateway.hub.admission.seats, as kube-apiserver's API Priority and Fairness). 0: off.
    max_executing_requests: int = setting(
        400, kind=COUNT_OR_ZERO, group=FAIR,
        help="short requests executing at once (seats; a request holds one from admission "
        "until its response ends). Past it, requests wait in queues, one set of queues per "
        "identity (the hub user), and a freed seat goes to the identity that has had the least "
        "seat-time, so one identity flooding the gateway cannot starve the others. Size it "
        "below the concurrency at which the gateway's latency grows; 0 turns fair queuing off "
        "(default: {default}, kube-apiserver's --max-requests-inflight)")
    fair_queues: int = setting(
        64, kind=COUNT, group=FAIR, help="queues shared by all identities")
    fair_hand_size: int = setting(  # queues each identity is shuffle-sharded onto
        8, kind=COUNT, group=FAIR,
        help="queues each identity is shuffle-sharded onto: it takes the shortest of them and "
        "keeps it while it has requests waiting or executing (default: {default}; at most "
        "--fair-queues)")
    fair_queue_length: int = setting(  # waiting requests per queue (429 beyond)
        128, kind=COUNT, group=FAIR,
        help="requests waiting in one queue (so of one identity) at most; one more gets 429 "
        "with Retry-After")
    fair_queue_wait: float = setting(  # seconds a request may wait for a seat (429 beyond)
        15.0, kind=DURATION, group=FAIR,
        help="how long a request may wait for a seat before it gets 429 with Retry-After "
        "(default: {default}, a quarter of kube-apiserver's request timeout)")
    # Re-validate open long-running requests (token review + hub authorization) as their
    # cached answers expire; close them once the hub cleanly says no (gateway.hub.revalidation).
    revalidate_streams: bool = setting(
        True, kind=SWITCH, group=LIMITS,
        help="ask the hub again about open long-running requests (watches, logs -f, exec, "
        "attach, port-forward) as their cached TokenReview and authorization expire "
        "(--token-cache-ttl), and close them once the hub cleanly says no (token revoked, "
        "ServiceAccount deleted, managedclusters/proxy lost): within the TTL + 5s. A watch "
        "ends cleanly (client-go re-lists and gets 401/403), exec/attach end with a Status "
        "kubectl prints (WebSocket or SPDY), other streams are closed. Hub errors never close "
        "a stream. Not for --token-passthrough requests")
    limits: FrontDoorLimits = section(FrontDoorLimits)
    # Clusters never seen connected since start are "unknown" (404) -- except during this grace
    # after start, while agents are still reconnecting to a restarted gateway (503 then).
    unknown_cluster_grace: float = setting(
        60.0, kind=DURATION, group=LIMITS,
        help="after start, answer 503 (not 404) for clusters not seen yet, while agents "
        "reconnect (default: {default}). Only without a --cluster-inventory")
    # Where the hub lists its clusters (gateway.hub.inventory): with one, unknown is 404 and
    # known-but-not-connected 503 at once, and the grace above is not needed.
    cluster_inventory: str = setting(
        "auto", choices=("auto", "managedclusters", "clusterprofiles", "none"), group=LIMITS,
        help="where the hub lists its clusters, to answer a cluster that is not connected at "
        "once: 404 if the inventory does not know it, 503 if it does. managedclusters: OCM "
        "ManagedCluster objects; clusterprofiles: ClusterProfile objects (in the "
        "--clusterprofile-namespace namespaces, default all); auto: the first of the two that "
        "the hub has, the gateway may list, and that lists at least one cluster; none: no "
        "inventory, --unknown-cluster-grace instead (default: {default}). Needs list and watch "
        "on the resource (deploy/hub grants both)")

    # Gateway pods sharing the tunnel address (deprecated: --lease-namespace); None: not given.
    replicas: int | None = setting(
        None, kind=COUNT, group=INSTANCES,
        help="deprecated: instances are discovered from Leases (--lease-namespace). Only "
        "without Leases: gateway pods sharing the tunnel address, i.e. the Deployment's "
        "replicas (default: 1); agents keep one session to each of replicas x workers "
        "processes. Given with Leases, it is ignored (a warning says so)")
    # Live instance discovery (gateway.hub.instances): each process holds a Lease in this
    # namespace and tells its agents the live set. None: off (the count is replicas x workers).
    lease_namespace: str | None = setting(
        None, kind=NAMESPACE_OR_OFF, group=INSTANCES,
        default_here=lambda off: startup.pod_namespace() or off,
        default_text="the pod's namespace when running in a cluster, else off",
        help="live instance discovery: every gateway process (each worker too) holds a "
        "coordination.k8s.io Lease in this hub namespace, renewed every 5s and deleted on "
        "exit, and tells its agents the live instances so they hold one session to each (no "
        "replica count to keep in step). Default: {default}; 'off' disables. Needs hub RBAC "
        "on leases in that namespace (deploy/hub/rbac.yaml)")
    lease_duration: int = setting(  # seconds an instance Lease stays live without renewal
        15, kind=COUNT, metavar="SECONDS", group=INSTANCES,
        help="with Leases: an instance whose Lease was not renewed for this long is gone "
        "(killed, cut off) and no longer announced; renewed every third of it (default: "
        "{default})")
    # Readiness gate: not Ready before serving every cluster the other instances serve, for at
    # most this long after start.
    ready_wait: float = setting(
        30.0, kind=DURATION, group=INSTANCES,
        help="with Leases: /readyz stays 503 until this instance serves every cluster the "
        "other live instances serve, for at most this long after start (default: {default}; "
        "0: no gate), so the Service sends no request to an instance that agents have not "
        "reached yet")
    workers: int = setting(  # processes sharing the front door and tunnel ports (SO_REUSEPORT)
        1, kind=COUNT, group=INSTANCES,
        help="gateway processes sharing the front door and tunnel ports (default: {default}). "
        "Agents keep one session to each. Each worker uses one core and its own memory; worker "
        "0 serves health and metrics (the sum of all workers: requests and sessions at most ~1s "
        "behind, an idle session's RTT and bytes at most ~30s; /readyz is 200 only when every "
        "worker is ready, --ready-wait included) and writes ClusterProfiles")
    shutdown_timeout: float = setting(
        25.0, kind=DURATION, group=INSTANCES,
        help="on SIGTERM, wait this long for in-flight requests")
    # On SIGTERM, keep serving this long with /readyz 503 first, so load balancers and the
    # Service's endpoints stop sending here before the front door closes.
    shutdown_delay: float = setting(
        0.0, kind=DURATION, group=INSTANCES,
        help="on SIGTERM, first answer /readyz with 503 and keep serving this long, so the "
        "Service and load balancers stop sending here before the front door closes; each "
        "HTTP/1.1 response meanwhile closes its connection, so keep-alive clients reconnect "
        "elsewhere (default: {default}; deploy/hub uses 5s). Then --shutdown-timeout applies")

    # Writes to the hub (ClusterProfiles, OCM conditions, the instance Lease), per process:
    # a token bucket shared by every writer (gateway.hub.hubwrites).
    hub_write_qps: float = setting(
        DEFAULT_HUB_WRITE_QPS, kind=RATE, group=FLEET,
        help="requests per second this gateway process may send to write hub objects as agents "
        "come and go (ClusterProfile access providers, OCM TunnelConnected conditions, its "
        "instance Lease, and the reads that prepare those writes), after a burst of "
        "--hub-write-burst, as client-go's QPS. Writes are coalesced per object: a storm of "
        "reconnecting agents costs at most one write per object that must change, at this rate "
        "(default: {default})")
    hub_write_burst: int = setting(
        DEFAULT_HUB_WRITE_BURST, kind=COUNT, group=FLEET,
        help="hub writes allowed at once before --hub-write-qps applies (default: {default})")
    # Per-cluster series on /metrics: "basic" (bounded counters and gauges) or "detailed"
    # (plus per-cluster latency histograms and agent certificate expiry).
    cluster_metrics: str = setting(
        "basic", choices=("basic", "detailed"), group=FLEET,
        help="per-cluster series on /metrics. basic: counters and gauges only, at most "
        f"{BASIC_SERIES_PER_CLUSTER} series per cluster (requests by status class; tunnel "
        "sessions, RTT, open and opened streams, bytes each way; agent version); latency "
        "histograms for the whole gateway, and the earliest agent certificate expiry with "
        "counts expiring within 7 and 30 days. detailed: also latency histograms per cluster "
        f"({len(REQUEST_BUCKETS) + 3} series per cluster and request class) and each cluster's "
        "agent certificate expiry (default: {default})")

    tunnel_keepalive: float = shared.tunnel_keepalive("agent", HUB_PING_AFTER)
    tunnel_timeout: float = shared.tunnel_timeout("agent")
    tunnel_memory_budget: int = shared.tunnel_memory_budget()
    log_level: str = shared.log_level(
        "; the audit trail (one JSON line per request) always goes to stdout")

    # Joining (gateway.hub.join): on when a CA Secret is named. The tunnel port then also
    # serves the join ALPN (CSR + token, or renewal with the current certificate).
    join_ca_secret: str | None = setting(
        None, kind=NAME_OR_NONE, metavar="NAME", group=JOIN,
        help="enable joining: the Secret (in --join-namespace; tls.crt/tls.key = the tunnel "
        "CA, the CA of --agent-ca) that signs agents' certificate requests. The tunnel port "
        "then also serves the ALPN hubproxy-join/1: a join token + CSR, or a renewal with the "
        "current certificate. Off by default; when set and unreadable the gateway does not "
        "start")
    join_namespace: str = setting(  # where the CA Secret and the cluster records are
        "hubproxy", metavar="NAMESPACE", group=JOIN,
        default_here=lambda fallback: startup.pod_namespace() or fallback,
        default_text="the pod's own namespace, else {default}",
        help="namespace of the CA Secret and the cluster records (default: {default})")
    join_certificate_lifetime: float = setting(
        7 * 86400.0, kind=DURATION, group=JOIN,
        help="lifetime of certificates signed for joined agents (default: {default}); agents "
        "renew at two thirds of it")
    join_poll_interval: float = setting(  # how often the records are re-read (revocation)
        2.0, kind=DURATION, group=JOIN,
        help="how often every gateway process re-reads the cluster records: a removed "
        "cluster's sessions close within about this long (default: {default})")

    # Kubernetes-format audit (gateway.hub.audittrail): on when a backend is named. The log
    # path "-" is stdout, where the events then replace the gateway's JSON lines.
    audit_log_path: str | None = setting(
        None, kind=NAME_OR_NONE, metavar="PATH", group=AUDIT_FLAGS,
        help="write an audit.k8s.io/v1 Event per request stage to PATH, one JSON object per "
        "line, appended (as kube-apiserver's --audit-log-path with --audit-log-format=json; "
        "rotate with copytruncate); '-': stdout, instead of the gateway's JSON lines")
    audit_webhook_config_file: str | None = setting(  # a kubeconfig naming the webhook
        None, kind=NAME_OR_NONE, metavar="FILE", group=AUDIT_FLAGS,
        help="post the Events to a webhook, as kube-apiserver's flag of that name: a "
        "kubeconfig whose current cluster's server is the URL (its CA verifies it) and whose "
        "user authenticates the gateway (token, token file, client certificate or exec "
        "plugin); an audit.k8s.io/v1 EventList per batch")
    audit_policy_file: str | None = setting(  # None: every request at Metadata
        None, kind=NAME_OR_NONE, metavar="FILE", group=AUDIT_FLAGS,
        help="which requests are audited: an audit.k8s.io/v1 Policy whose rules have a level "
        "(None or Metadata) and may list users, userGroups, verbs and clusters (hubproxy's "
        "own); the first matching rule wins, no match is None. Anything else in a rule is "
        "refused at start. Default: every request at Metadata. Never a token, never a body")
    audit_webhook: WebhookSettings = section(WebhookSettings)

    clusterprofiles: ClusterProfileSettings = section(ClusterProfileSettings)
    ocm_addon: AddOnConditionSettings = section(AddOnConditionSettings)

    # Not flags: set by the process itself.
    worker_index: int = 0  # which worker this is; worker 0 also serves health and metrics
    hub_instance: int = 0  # this process's id in the tunnel's SETTINGS (0: not announced)
    # Every worker's hub_instance, fixed by the supervisor before forking: without Leases and
    # replicas they are all the instances there are, announced as a set (see session_settings).
    worker_instances: tuple[int, ...] = ()
    readiness_interval: float = 10.0  # hub auth probe period for /readyz

    def _check_instance_count(self) -> None:
        """Agents hold one session per instance, at most MAX_HUB_INSTANCES of them (the tunnel
        refuses SETTINGS that announce more): refused here rather than by every agent."""
        counted = self.workers if self.lease_namespace else (self.replicas or 1) * self.workers
        if counted > MAX_HUB_INSTANCES:
            flags = "--workers" if self.lease_namespace else "--replicas x --workers"
            raise ValueError(f"{flags} = {counted}: agents hold at most {MAX_HUB_INSTANCES} "
                             "sessions, one per gateway process")

    @property
    def agent_naming(self) -> AgentNaming:
        """Where an agent certificate names its cluster (ValueError if the name is bad)."""
        return AgentNaming(self.agent_identity, self.ocm_addon_name)

    @property
    def inventory_namespaces(self) -> tuple[str, ...]:
        """ClusterProfile namespaces the inventory lists (empty: all)."""
        return self.clusterprofiles.namespaces

    def validate(self) -> None:
        """ValueError naming the flag when a setting, or settings together, cannot work.

        Files are checked where they are read (``gateway.hub.serve``); this checks values.
        """
        if not self.agent_ca:
            raise ValueError("--agent-ca is required: agents must be verified against a CA "
                             "(refusing to start without one)")
        for flag, directory in (("--tls-dir", self.tls_dir),
                                ("--tunnel-tls-dir", self.tunnel_tls_dir)):
            if not directory:
                raise ValueError(f"{flag} is required")
        try:
            validate_prefix(self.identity_prefix)
        except IdentityError as exc:
            raise ValueError(f"--identity-prefix: {exc}") from None
        if self.fair_hand_size > self.fair_queues:
            raise ValueError(f"--fair-hand-size {self.fair_hand_size} is more than "
                             f"--fair-queues {self.fair_queues}")
        check_tunnel_liveness(self.tunnel_keepalive, self.tunnel_timeout)
        self._check_instance_count()
        if self.audit_policy_file and not (self.audit_log_path
                                           or self.audit_webhook_config_file):
            raise ValueError("--audit-policy-file needs --audit-log-path or "
                             "--audit-webhook-config-file (where the events go)")
        try:
            self.agent_naming  # noqa: B018 -- constructing it is the check
        except ValueError as exc:
            raise ValueError(f"--ocm-addon-name: {exc}") from None
        self.clusterprofiles.validate()
