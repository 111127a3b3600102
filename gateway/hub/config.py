"""The gateway's configuration: one frozen object built from the command line (or by tests).

`gateway.hub.serve` turns flags into a :class:`GatewayConfig`; `gateway.hub.app` and the front
door read only this object, so a test can build a gateway without argparse. Every limit has a
default that is safe for a production hub; every timeout is in seconds.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from gateway.ops.k8saudit.backends import WebhookSettings
from gateway.wire.http1 import Limits
from tunnel.admission import DEFAULT_BACKLOG, DEFAULT_MAX_HANDSHAKES
from tunnel.identity import URI_NAMING, AgentNaming

DEFAULT_MAX_REQUEST_BODY = 3 * 1024 * 1024  # kube-apiserver's MaxRequestBodyBytes
# Hub writes per second and burst, per gateway process (gateway.hub.hubwrites). client-go's
# rest.Config defaults are 5 and 10; controllers built on it (controller-runtime) raise them to
# 20 and 30, which a fleet's writes need and a hub takes easily.
DEFAULT_HUB_WRITE_QPS = 20.0
DEFAULT_HUB_WRITE_BURST = 30


@dataclass(frozen=True)
class FrontDoorLimits:
    """What one client may make the gateway hold (DESIGN §6 rule 7)."""

    head: Limits = field(default_factory=Limits)
    header_timeout: float = 30.0  # first byte of a request head -> its end
    idle_timeout: float = 120.0  # keep-alive connection with no request in progress
    # Short request sent -> response head (0: none); watches, follow and upgrades exempt.
    response_header_timeout: float = 60.0
    max_buffer: int = 256 * 1024  # client bytes held while authenticating / pipelined
    max_request_body: int = DEFAULT_MAX_REQUEST_BODY  # 413 beyond (3 MiB, like kube-apiserver)
    max_connections: int = 10000
    max_inflight: int = 10000  # requests between head and response end (429 beyond)
    write_high_water: int = 512 * 1024  # client transport buffer that pauses the stream
    http2: bool = True  # offer ALPN h2 at the front door (HTTP/1.1 is always offered)
    max_h2_streams: int = 250  # SETTINGS_MAX_CONCURRENT_STREAMS per HTTP/2 connection


@dataclass(frozen=True)
class GatewayConfig:
    listen: tuple[str, int] = ("0.0.0.0", 9092)
    tunnel_listen: tuple[str, int] = ("0.0.0.0", 8091)
    health_listen: tuple[str, int] | None = ("0.0.0.0", 8000)
    workers: int = 1  # processes sharing the front door and tunnel ports (SO_REUSEPORT)
    worker_index: int = 0  # which of them this is; worker 0 also serves health and metrics
    replicas: int = 1  # gateway pods sharing the tunnel address (deprecated: --lease-namespace)
    # Live instance discovery (gateway.hub.instances): each process holds a Lease in this
    # namespace and tells its agents the live set. None: off (the count is replicas x workers).
    lease_namespace: str | None = None
    lease_duration: int = 15  # seconds an instance Lease stays live without renewal
    # Readiness gate: not Ready before serving every cluster the other instances serve, for at
    # most this long after start.
    ready_wait: float = 30.0
    hub_instance: int = 0  # this process's id in the tunnel's SETTINGS (0: not announced)
    tls_dir: str | None = None  # tls.crt / tls.key of the front door
    tunnel_tls_dir: str | None = None  # tls.crt / tls.key of the tunnel listener
    agent_ca: str | None = None  # CA that issued agent client certificates (required)
    agent_naming: AgentNaming = URI_NAMING  # where an agent certificate names its cluster
    hub_kubeconfig: str | None = None  # None: in-cluster service account
    audiences: tuple[str, ...] = ()
    token_cache_ttl: float = 10.0
    # While the hub cannot be asked, accept what it confirmed up to this long past the TTL.
    hub_outage_grace: float = 300.0
    identity_prefix: str = "cluster:hub:"
    authorize: str = "sar"  # "sar" | "none"
    token_passthrough: bool = False
    # The hub is not a free oracle (gateway.hub.admission.hubload): failed authentications per
    # client address (token bucket), and concurrent hub reviews (503 after a short wait).
    auth_failure_rate: float = 1.0  # per second and address, sustained
    auth_failure_burst: int = 20
    # The real client behind a load balancer (gateway.hub.admission.forwarded; empty: off).
    # Connections from these addresses must start with a PROXY protocol header (v1 or v2),
    # whose source is then the client (gateway.hub.proxyaccept); from elsewhere, one is refused.
    proxy_protocol_from: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    # Requests on connections from these addresses come from the right-most X-Forwarded-For
    # entry that is not one of them.
    forwarded_for_from: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    hub_max_concurrent_reviews: int = 64
    hub_review_wait: float = 1.0  # seconds a review waits for a slot before 503
    # Long-running requests (watches, logs -f, exec/attach/port-forward) open at once per
    # (identity, cluster); 429 beyond (gateway.hub.admission.streams).
    max_streams_per_identity: int = 500
    # Short requests executing at once (seats); more wait in per-identity fair queues
    # (gateway.hub.admission.seats, as kube-apiserver's API Priority and Fairness). 0: off.
    max_executing_requests: int = 400
    fair_queues: int = 64
    fair_hand_size: int = 8  # queues each identity is shuffle-sharded onto
    fair_queue_length: int = 128  # waiting requests per queue (429 beyond)
    fair_queue_wait: float = 15.0  # seconds a request may wait for a seat (429 beyond)
    # Re-validate open long-running requests (token review + hub authorization) as their
    # cached answers expire; close them once the hub cleanly says no (gateway.hub.revalidation).
    revalidate_streams: bool = True
    limits: FrontDoorLimits = field(default_factory=FrontDoorLimits)
    # Clusters never seen connected since start are "unknown" (404) -- except during this grace
    # after start, while agents are still reconnecting to a restarted gateway (503 then).
    unknown_cluster_grace: float = 60.0
    # Where the hub lists its clusters (gateway.hub.inventory): with one, unknown is 404 and
    # known-but-not-connected 503 at once, and the grace above is not needed.
    cluster_inventory: str = "auto"  # auto | managedclusters | clusterprofiles | none
    inventory_namespaces: tuple[str, ...] = ()  # ClusterProfile namespaces (empty: all)
    shutdown_timeout: float = 25.0
    # On SIGTERM, keep serving this long with /readyz 503 first, so load balancers and the
    # Service's endpoints stop sending here before the front door closes.
    shutdown_delay: float = 0.0
    # Tunnel liveness (--tunnel-keepalive / --tunnel-timeout); None: the tunnel's defaults.
    tunnel_keepalive: float | None = None
    tunnel_timeout: float | None = None
    # Agent admission (--tunnel-max-handshakes / --tunnel-backlog, tunnel.admission).
    tunnel_max_handshakes: int = DEFAULT_MAX_HANDSHAKES
    tunnel_backlog: int = DEFAULT_BACKLOG
    readiness_interval: float = 10.0  # hub auth probe period for /readyz
    # Joining (gateway.hub.join): on when a CA Secret is named. The tunnel port then also
    # serves the join ALPN (CSR + token, or renewal with the current certificate).
    join_ca_secret: str | None = None  # Secret (tls.crt/tls.key = tunnel CA) that signs
    join_namespace: str = "hubproxy"  # where the CA Secret and the cluster records are
    join_certificate_lifetime: float = 7 * 86400.0  # seconds
    join_poll_interval: float = 2.0  # how often the records are re-read (revocation)
    # Kubernetes-format audit (gateway.hub.audittrail): on when a backend is named. The log
    # path "-" is stdout, where the events then replace the gateway's JSON lines.
    audit_policy_file: str | None = None  # None: every request at Metadata
    audit_log_path: str | None = None
    audit_webhook_config_file: str | None = None  # a kubeconfig naming the webhook
    audit_webhook: WebhookSettings = field(default_factory=WebhookSettings)
    # Writes to the hub (ClusterProfiles, OCM conditions, the instance Lease), per process:
    # a token bucket shared by every writer (gateway.hub.hubwrites).
    hub_write_qps: float = DEFAULT_HUB_WRITE_QPS
    hub_write_burst: int = DEFAULT_HUB_WRITE_BURST
    # Per-cluster series on /metrics: "basic" (bounded counters and gauges) or "detailed"
    # (plus per-cluster latency histograms and agent certificate expiry).
    cluster_metrics: str = "basic"
