"""Run the hub-side gateway: the :9092 front door, the :8091 agent tunnel and the :8000 health port.

Users call https://<gateway>:9092/<cluster>/<kubernetes API path> with a hub bearer token. The
gateway verifies the token with a hub TokenReview (cached), checks that the hub user may use the
cluster (SubjectAccessReview on managedclusters/proxy, unless --authorize=none), and forwards
the request through the cluster's agent tunnel with the user's identity, prefixed
(--identity-prefix), for the agent to impersonate. Hub tokens never leave the hub.

Agents connect to --tunnel-listen with client certificates issued by --agent-ca; the cluster
name is taken from the certificate. --agent-ca is required: without it the gateway refuses to
start (fail closed). Certificates are reloaded when their files change.

Errors are Kubernetes Status JSON: 400 bad request/path (or ambiguous credentials/upgrades),
401 bad token, 403 refused (impersonation headers, hub authorization, Service not allowed),
404 unknown cluster, 413 request body over --max-request-body, 429 overload (gateway, too many
failed authentications from one address, too many long-running requests of one identity), 503
cluster not connected or hub auth unavailable/busy, 502/504 upstream unreachable/timeout.
SIGTERM: stop accepting, finish in-flight requests (up to --shutdown-timeout), then exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from gateway.hub.clusterprofile import component as clusterprofile
from gateway.hub.config import (
    DEFAULT_HUB_WRITE_BURST,
    DEFAULT_HUB_WRITE_QPS,
    FrontDoorLimits,
    GatewayConfig,
)
from gateway.hub.join.service import JoinService
from gateway.hub.ocm import component as ocm
from gateway.hub.workers import NOT_READY as WORKER_NOT_READY
from gateway.hub.workers import instance_id as workers_instance_id
from gateway.hub.workers import readiness_gate as workers_readiness_gate
from gateway.ops import audit, diagnostics, gctune, startup
from gateway.ops.flags import (
    add_tunnel_liveness_arguments,
    parse_address,
    parse_duration,
    parse_size,
    positive_int,
    tunnel_liveness,
)
from gateway.ops.k8saudit.backends import WebhookSettings
from gateway.ops.metrics import BASIC_SERIES_PER_CLUSTER, REQUEST_BUCKETS
from gateway.ops.metricslink import MetricsLink, PeerSnapshots, SnapshotSender
from gateway.ops.rlimits import raise_open_file_limit
from gateway.wire.http1 import Limits
from tunnel.admission import DEFAULT_BACKLOG, DEFAULT_MAX_HANDSHAKES
from tunnel.identity import AgentNaming
from tunnel.session_state import HUB_PING_AFTER

log = logging.getLogger("hubproxy.gateway")


def _address(value: str) -> tuple[str, int]:
    try:
        return parse_address(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rate(value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        rate = 0.0
    if not rate > 0 or rate == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a positive number")
    return rate


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    net = parser.add_argument_group("listeners")
    net.add_argument("--listen", type=_address, default=("0.0.0.0", 9092), metavar="HOST:PORT",
                     help="front door for users, HTTPS (default: 0.0.0.0:9092)")
    net.add_argument("--tunnel-listen", type=_address, default=("0.0.0.0", 8091),
                     metavar="HOST:PORT", help="agent tunnel, mTLS 1.3 (default: 0.0.0.0:8091)")
    net.add_argument("--tunnel-max-handshakes", type=positive_int,
                     default=DEFAULT_MAX_HANDSHAKES, metavar="N",
                     help="agent TLS handshakes in flight at most; further agents wait in the "
                     "listen queue, and one that waited nearly an agent's handshake timeout "
                     "is told the hub is busy before any TLS work (default: "
                     f"{DEFAULT_MAX_HANDSHAKES})")
    net.add_argument("--tunnel-backlog", type=positive_int, default=DEFAULT_BACKLOG,
                     metavar="N",
                     help="listen queue of the tunnel port: agents waiting for a handshake "
                     "(the kernel caps it at net.core.somaxconn; default: "
                     f"{DEFAULT_BACKLOG})")
    net.add_argument("--health-listen", default="0.0.0.0:8000", metavar="HOST:PORT",
                     help="plain HTTP /healthz /readyz /metrics /clusters, "
                     "unauthenticated: keep it on a private address; 'off' to disable "
                     "(default: 0.0.0.0:8000)")
    tls = parser.add_argument_group("certificates (reloaded when the files change)")
    tls.add_argument("--tls-dir", required=True, metavar="DIR",
                     help="front-door serving certificate: DIR/tls.crt, DIR/tls.key")
    tls.add_argument("--tunnel-tls-dir", required=True, metavar="DIR",
                     help="tunnel serving certificate: DIR/tls.crt, DIR/tls.key")
    tls.add_argument("--agent-ca", required=True, metavar="FILE",
                     help="CA bundle that issued agent client certificates (REQUIRED: the "
                     "gateway refuses to start without it)")
    tls.add_argument("--agent-identity", choices=("uri", "ocm"), default="uri",
                     help="where an agent certificate names its cluster. uri: the URI SAN "
                     "hubproxy://cluster/<name> (hubproxy certs); ocm: the subject Open Cluster "
                     "Management gives an add-on agent, CN=system:open-cluster-management:"
                     "cluster:<name>:addon:<addon>:agent:<agent> (deploy/ocm) "
                     "(default: %(default)s)")
    tls.add_argument("--ocm-addon-name", default="hubproxy", metavar="NAME",
                     help="with --agent-identity=ocm, the add-on whose agents may connect "
                     "(default: %(default)s)")
    hub = parser.add_argument_group("hub authentication and authorization")
    hub.add_argument("--hub-kubeconfig", metavar="FILE",
                     help="kubeconfig for the hub API (TokenReview, SubjectAccessReview); "
                     "default: in-cluster service account")
    hub.add_argument("--audience", action="append", default=[], metavar="AUD",
                     help="accept only tokens for this audience (repeatable)")
    hub.add_argument("--token-cache-ttl", type=_duration, default=10.0, metavar="DURATION",
                     help="cache TokenReview/SubjectAccessReview outcomes this long "
                     "(default: 10s; 0 disables)")
    hub.add_argument("--hub-outage-grace", type=_duration, default=300.0, metavar="DURATION",
                     help="while the hub cannot be asked (down, timing out, or past "
                     "--hub-max-concurrent-reviews), keep accepting a token, and the "
                     "managedclusters/proxy permission, that the hub itself confirmed less than "
                     "--token-cache-ttl + DURATION ago; asked again once per --token-cache-ttl. "
                     "Tokens never seen, and any the hub said no to, get 503 with Retry-After. "
                     "A revocation made during the outage takes effect when the hub answers "
                     "again (default: 5m; 0: refuse every request the hub cannot confirm)")
    hub.add_argument("--identity-prefix", default="cluster:hub:", metavar="PREFIX",
                     help="prefix for every hub user and group on managed clusters "
                     "(default: %(default)s)")
    hub.add_argument("--authorize", choices=("sar", "none"), default="sar",
                     help="sar: hub SubjectAccessReview 'get managedclusters/proxy <cluster>' "
                     "(group cluster.open-cluster-management.io); none: any authenticated hub "
                     "user (default: %(default)s)")
    hub.add_argument("--token-passthrough", action="store_true",
                     help="forward a token the hub cleanly rejects, untouched and without "
                     "impersonation (for managed-cluster tokens); off by default")
    hub.add_argument("--auth-failure-rate", type=_rate, default=1.0, metavar="PER_SECOND",
                     help="failed authentications allowed per second and client address "
                     "(IPv6: per /64), sustained (default: %(default)s). Beyond it and the "
                     "burst, that address's requests that would need a hub TokenReview get 429 "
                     "with Retry-After; tokens already cached as valid still pass. Counted per "
                     "gateway process (--workers, --replicas)")
    hub.add_argument("--auth-failure-burst", type=positive_int, default=20, metavar="N",
                     help="failed authentications a client address may make in a burst before "
                     "--auth-failure-rate applies (default: %(default)s)")
    edge = parser.add_argument_group(
        "the real client behind a load balancer or an ingress (both off by default: the "
        "connection's address is the client)")
    edge.add_argument("--proxy-protocol-from", action="append", default=[], metavar="CIDR",
                      help="load balancers that send the PROXY protocol (v1 or v2; HAProxy "
                      "send-proxy-v2, AWS NLB proxy protocol v2, ...): a connection from these "
                      "addresses must start with a PROXY header, read before TLS, and its "
                      "source address is the client for the failed-authentication limit, the "
                      "audit trail and the X-Forwarded-For sent on; a LOCAL or UNKNOWN header "
                      "keeps the balancer's address. A connection from there without a valid "
                      "header (within --header-timeout), or from anywhere else with one, is "
                      "closed before TLS. "
                      "Repeatable, or comma-separated")
    edge.add_argument("--forwarded-for-from", action="append", default=[], metavar="CIDR",
                      help="proxies that terminate TLS in front of the gateway and append the "
                      "client to X-Forwarded-For (an ingress): on connections from these "
                      "addresses the client is the right-most X-Forwarded-For entry that is not "
                      "one of them (what a client writes further left is ignored). Repeatable, "
                      "or comma-separated")
    hub.add_argument("--hub-max-concurrent-reviews", type=positive_int, default=64, metavar="N",
                     help="TokenReview and SubjectAccessReview calls to the hub in flight at "
                     "once, per gateway process (identical ones are coalesced; default: "
                     "%(default)s)")
    hub.add_argument("--hub-review-wait", type=_duration, default=1.0, metavar="DURATION",
                     help="how long a review waits for one of those slots before the request "
                     "gets 503 with Retry-After (default: 1s)")
    lim = parser.add_argument_group("limits and timeouts")
    lim.add_argument("--max-streams-per-identity", type=positive_int, default=500, metavar="N",
                     help="long-running requests (watches, logs -f, exec, attach, "
                     "port-forward) one identity may hold open on one cluster at once; 429 "
                     "beyond (default: %(default)s). The identity is the hub user (with "
                     "--token-passthrough: the token). A controller that watches every resource "
                     "type of a CRD-heavy cluster (Argo CD's cluster cache) needs one watch per "
                     "type: size it for that")
    fair = parser.add_argument_group(
        "fair queuing of short requests between identities (as kube-apiserver's API Priority "
        "and Fairness; watches, logs -f, exec, attach and port-forward are not queued: "
        "--max-streams-per-identity caps them)")
    fair.add_argument("--max-executing-requests", type=_non_negative_int, default=400,
                      metavar="N",
                      help="short requests executing at once (seats; a request holds one from "
                      "admission until its response ends). Past it, requests wait in queues, "
                      "one set of queues per identity (the hub user), and a freed seat goes to "
                      "the identity that has had the least seat-time, so one identity flooding "
                      "the gateway cannot starve the others. Size it below the concurrency at "
                      "which the gateway's latency grows; 0 turns fair queuing off (default: "
                      "%(default)s, kube-apiserver's --max-requests-inflight)")
    fair.add_argument("--fair-queues", type=positive_int, default=64, metavar="N",
                      help="queues shared by all identities (default: %(default)s)")
    fair.add_argument("--fair-hand-size", type=positive_int, default=8, metavar="N",
                      help="queues each identity is shuffle-sharded onto: it takes the "
                      "shortest of them and keeps it while it has requests waiting or "
                      "executing (default: %(default)s; at most --fair-queues)")
    fair.add_argument("--fair-queue-length", type=positive_int, default=128, metavar="N",
                      help="requests waiting in one queue (so of one identity) at most; one "
                      "more gets 429 with Retry-After (default: %(default)s)")
    fair.add_argument("--fair-queue-wait", type=_duration, default=15.0, metavar="DURATION",
                      help="how long a request may wait for a seat before it gets 429 with "
                      "Retry-After (default: 15s, a quarter of kube-apiserver's request "
                      "timeout)")
    lim.add_argument("--revalidate-streams", action=argparse.BooleanOptionalAction,
                     default=True,
                     help="ask the hub again about open long-running requests (watches, logs "
                     "-f, exec, attach, port-forward) as their cached TokenReview and "
                     "authorization expire (--token-cache-ttl), and close them once the hub "
                     "cleanly says no (token revoked, ServiceAccount deleted, "
                     "managedclusters/proxy lost): within the TTL + 5s. A watch ends cleanly "
                     "(client-go re-lists and gets 401/403), exec/attach end with a Status "
                     "kubectl prints (WebSocket or SPDY), other streams are closed. Hub errors "
                     "never close a "
                     "stream. Not for --token-passthrough requests (default: on)")
    lim.add_argument("--max-header-bytes", type=positive_int, default=64 * 1024,
                     help="request head size limit (431 beyond; default: %(default)s)")
    lim.add_argument("--max-headers", type=positive_int, default=128,
                     help="header field count limit (431 beyond; default: %(default)s)")
    lim.add_argument("--max-request-line", type=positive_int, default=16 * 1024,
                     help="request line length limit (414 beyond; default: %(default)s)")
    lim.add_argument("--max-request-body", type=_size, default=3 * 1024 * 1024, metavar="SIZE",
                     help="request body size limit in bytes, or with Ki/Mi/Gi (default: 3Mi, "
                     "kube-apiserver's own limit). 413 before anything is forwarded when "
                     "Content-Length says more (no 100 Continue is sent); a chunked body is "
                     "counted as it streams, and the request is cancelled upstream and "
                     "answered 413 once it passes the limit")
    lim.add_argument("--header-timeout", type=_duration, default=30.0, metavar="DURATION",
                     help="time to receive a request head (408 beyond; default: 30s)")
    lim.add_argument("--idle-timeout", type=_duration, default=120.0, metavar="DURATION",
                     help="close keep-alive connections idle this long (default: 120s)")
    lim.add_argument("--response-header-timeout", type=_duration, default=60.0,
                     metavar="DURATION",
                     help="time from a short request to its response head (504 beyond; 0: "
                     "none; default: 60s, kube-apiserver's own request timeout). Watches, "
                     "logs -f and upgrades are exempt, and there is no total timeout")
    lim.add_argument("--max-connections", type=positive_int, default=10000,
                     help="client connections at once (default: %(default)s)")
    lim.add_argument("--max-inflight", type=positive_int, default=10000,
                     help="requests in progress at once (429 beyond; default: %(default)s)")
    lim.add_argument("--no-http2", action="store_true",
                     help="offer only HTTP/1.1 at the front door (ALPN). By default h2 is "
                     "offered too: kubectl and client-go then carry every request and watch of "
                     "a context as streams of one connection (upgrades such as exec and "
                     "port-forward still use HTTP/1.1)")
    lim.add_argument("--max-h2-streams", type=positive_int, default=250, metavar="N",
                     help="concurrent streams per HTTP/2 client connection "
                     "(SETTINGS_MAX_CONCURRENT_STREAMS; default: %(default)s, Go's own). "
                     "client-go opens another connection when one is full; each open stream "
                     "is a request in progress (--max-inflight counts it)")
    lim.add_argument("--unknown-cluster-grace", type=_duration, default=60.0,
                     metavar="DURATION",
                     help="after start, answer 503 (not 404) for clusters not seen yet, while "
                     "agents reconnect (default: 60s). Only without a --cluster-inventory")
    lim.add_argument("--cluster-inventory", default="auto",
                     choices=("auto", "managedclusters", "clusterprofiles", "none"),
                     help="where the hub lists its clusters, to answer a cluster that is not "
                     "connected at once: 404 if the inventory does not know it, 503 if it "
                     "does. managedclusters: OCM ManagedCluster objects; clusterprofiles: "
                     "ClusterProfile objects (in the --clusterprofile-namespace namespaces, "
                     "default all); auto: the first of the two that the hub has, the gateway "
                     "may list, and that lists at least one cluster; none: no inventory, "
                     "--unknown-cluster-grace instead (default: %(default)s). Needs list and "
                     "watch on the resource (deploy/hub grants both)")
    lim.add_argument("--replicas", type=positive_int, default=None, metavar="N",
                     help="deprecated: instances are discovered from Leases (--lease-namespace). "
                     "Only without Leases: gateway pods sharing the tunnel address, i.e. the "
                     "Deployment's replicas (default: 1); agents keep one session to each of "
                     "replicas x workers processes. Given with Leases, it is ignored (a "
                     "warning says so)")
    lim.add_argument("--lease-namespace", default=None, metavar="NAMESPACE",
                     help="live instance discovery: every gateway process (each worker too) "
                     "holds a coordination.k8s.io Lease in this hub namespace, renewed every "
                     "5s and deleted on exit, and tells its agents the live instances so they "
                     "hold one session to each (no replica count to keep in step). Default: "
                     "the pod's namespace when running in a cluster, else off; 'off' disables. "
                     "Needs hub RBAC on leases in that namespace (deploy/hub/rbac.yaml)")
    lim.add_argument("--lease-duration", type=positive_int, default=15, metavar="SECONDS",
                     help="with Leases: an instance whose Lease was not renewed for this long "
                     "is gone (killed, cut off) and no longer announced; renewed every third "
                     "of it (default: %(default)s)")
    lim.add_argument("--ready-wait", type=_duration, default=30.0, metavar="DURATION",
                     help="with Leases: /readyz stays 503 until this instance serves every "
                     "cluster the other live instances serve, for at most this long after "
                     "start (default: 30s; 0: no gate), so the Service sends no request to an "
                     "instance that agents have not reached yet")
    lim.add_argument("--workers", type=positive_int, default=1, metavar="N",
                     help="gateway processes sharing the front door and tunnel ports "
                     "(default: %(default)s). Agents keep one session to each. Each worker "
                     "uses one core and its own memory; worker 0 serves health and metrics "
                     "(the sum of all workers: requests and sessions at most ~1s behind, an "
                     "idle session's RTT and bytes at most ~30s; /readyz is 200 only when "
                     "every worker is ready, --ready-wait included) and writes ClusterProfiles")
    lim.add_argument("--shutdown-timeout", type=_duration, default=25.0, metavar="DURATION",
                     help="on SIGTERM, wait this long for in-flight requests (default: 25s)")
    lim.add_argument("--shutdown-delay", type=_duration, default=0.0, metavar="DURATION",
                     help="on SIGTERM, first answer /readyz with 503 and keep serving this "
                     "long, so the Service and load balancers stop sending here before the "
                     "front door closes; each HTTP/1.1 response meanwhile closes its "
                     "connection, so keep-alive clients reconnect elsewhere (default: 0s; "
                     "deploy/hub uses 5s). Then --shutdown-timeout applies")
    fleet = parser.add_argument_group(
        "fleet scale: writes to the hub and per-cluster metrics")
    fleet.add_argument("--hub-write-qps", type=_rate, default=DEFAULT_HUB_WRITE_QPS,
                       metavar="PER_SECOND",
                       help="requests per second this gateway process may send to write hub "
                       "objects as agents come and go (ClusterProfile access providers, OCM "
                       "TunnelConnected conditions, its instance Lease, and the reads that "
                       "prepare those writes), after a burst of --hub-write-burst, as client-go's "
                       "QPS. Writes are coalesced per object: a storm of reconnecting agents "
                       "costs at most one write per object that must change, at this rate "
                       "(default: %(default)s)")
    fleet.add_argument("--hub-write-burst", type=positive_int, default=DEFAULT_HUB_WRITE_BURST,
                       metavar="N",
                       help="hub writes allowed at once before --hub-write-qps applies "
                       "(default: %(default)s)")
    fleet.add_argument("--cluster-metrics", choices=("basic", "detailed"), default="basic",
                       help="per-cluster series on /metrics. basic: counters and gauges only, "
                       f"at most {BASIC_SERIES_PER_CLUSTER} series per cluster (requests by "
                       "status class; tunnel sessions, RTT, open and opened streams, bytes each "
                       "way; agent version); latency histograms for the whole gateway, and the "
                       "earliest agent certificate expiry with counts expiring within 7 and 30 "
                       "days. detailed: also latency histograms per cluster "
                       f"({len(REQUEST_BUCKETS) + 3} series per cluster and request class) and "
                       "each cluster's agent certificate expiry (default: %(default)s)")
    add_tunnel_liveness_arguments(parser, "agent", HUB_PING_AFTER)
    add_audit_arguments(parser)
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"),
                        help="log level of diagnostics on stderr (default: %(default)s); the "
                        "audit trail (one JSON line per request) always goes to stdout")
    join = parser.add_argument_group(
        "joining clusters (hubproxy cluster add|list|remove; see deploy/README.md)")
    join.add_argument("--join-ca-secret", metavar="NAME",
                      help="enable joining: the Secret (in --join-namespace; tls.crt/tls.key = "
                      "the tunnel CA, the CA of --agent-ca) that signs agents' certificate "
                      "requests. The tunnel port then also serves the ALPN hubproxy-join/1: a "
                      "join token + CSR, or a renewal with the current certificate. Off by "
                      "default; when set and unreadable the gateway does not start")
    join.add_argument("--join-namespace", default=_own_namespace(), metavar="NAMESPACE",
                      help="namespace of the CA Secret and the cluster records (default: the "
                      "pod's own namespace, else hubproxy)")
    join.add_argument("--join-certificate-lifetime", type=_duration, default=7 * 86400.0,
                      metavar="DURATION",
                      help="lifetime of certificates signed for joined agents (default: 7d); "
                      "agents renew at two thirds of it")
    join.add_argument("--join-poll-interval", type=_duration, default=2.0, metavar="DURATION",
                      help="how often every gateway process re-reads the cluster records: a "
                      "removed cluster's sessions close within about this long (default: 2s)")
    clusterprofile.add_arguments(parser)
    ocm.add_arguments(parser)


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    webhook = WebhookSettings()
    kube = parser.add_argument_group(
        "Kubernetes-format audit (opt-in; the gateway's own JSON line per request stays on "
        "stdout unless --audit-log-path is -)")
    kube.add_argument("--audit-log-path", metavar="PATH",
                      help="write an audit.k8s.io/v1 Event per request stage to PATH, one JSON "
                      "object per line, appended (as kube-apiserver's --audit-log-path with "
                      "--audit-log-format=json; rotate with copytruncate); '-': stdout, instead "
                      "of the gateway's JSON lines")
    kube.add_argument("--audit-webhook-config-file", metavar="FILE",
                      help="post the Events to a webhook, as kube-apiserver's flag of that "
                      "name: a kubeconfig whose current cluster's server is the URL (its CA "
                      "verifies it) and whose user authenticates the gateway (token, token file, "
                      "client certificate or exec plugin); an audit.k8s.io/v1 EventList per "
                      "batch")
    kube.add_argument("--audit-policy-file", metavar="FILE",
                      help="which requests are audited: an audit.k8s.io/v1 Policy whose rules "
                      "have a level (None or Metadata) and may list users, userGroups, verbs "
                      "and clusters (hubproxy's own); the first matching rule wins, no match is "
                      "None. Anything else in a rule is refused at start. Default: every "
                      "request at Metadata. Never a token, never a body")
    kube.add_argument("--audit-webhook-batch-max-size", type=positive_int,
                      default=webhook.batch_max_size, metavar="N",
                      help="events per EventList at most (default: %(default)s)")
    kube.add_argument("--audit-webhook-batch-max-wait", type=_duration,
                      default=webhook.batch_max_wait, metavar="DURATION",
                      help="how long a batch waits to fill before it is sent (default: "
                      f"{webhook.batch_max_wait:g}s)")
    kube.add_argument("--audit-webhook-batch-buffer-size", type=positive_int,
                      default=webhook.buffer_size, metavar="N",
                      help="events held while the webhook is slow or down; past it, events "
                      "are dropped and counted in hubproxy_audit_events_dropped_total, never "
                      "making a request wait (default: %(default)s)")
    kube.add_argument("--audit-webhook-initial-backoff", type=_duration,
                      default=webhook.initial_backoff, metavar="DURATION",
                      help="wait before a failed batch (connection error, 429, 5xx) is sent "
                      f"again, 1.5 times longer each time, {webhook.max_attempts} attempts in "
                      f"all (default: {webhook.initial_backoff:g}s)")


def _audit_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Kubernetes-audit part of the config; ValueError if a file is missing or the
    policy cannot be used (said at start, not at the first request)."""
    from gateway.ops.k8saudit.policy import PolicyError, load_policy

    for flag, path in (("--audit-policy-file", args.audit_policy_file),
                       ("--audit-webhook-config-file", args.audit_webhook_config_file)):
        if path and not os.path.isfile(path):
            raise ValueError(f"{flag} {path}: no such file")
    if args.audit_policy_file:
        if not (args.audit_log_path or args.audit_webhook_config_file):
            raise ValueError("--audit-policy-file needs --audit-log-path or "
                             "--audit-webhook-config-file (where the events go)")
        try:
            load_policy(args.audit_policy_file)
        except PolicyError as exc:
            raise ValueError(f"--audit-policy-file {args.audit_policy_file}: {exc}") from None
    return {
        "audit_policy_file": args.audit_policy_file or None,
        "audit_log_path": args.audit_log_path or None,
        "audit_webhook_config_file": args.audit_webhook_config_file or None,
        "audit_webhook": WebhookSettings(
            batch_max_size=args.audit_webhook_batch_max_size,
            batch_max_wait=args.audit_webhook_batch_max_wait,
            buffer_size=args.audit_webhook_batch_buffer_size,
            initial_backoff=args.audit_webhook_initial_backoff),
    }


def _own_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or "hubproxy"
    except OSError:
        return "hubproxy"


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """A validated :class:`GatewayConfig`; ValueError with a clear message otherwise."""
    from gateway.hub.admission.identity import validate_prefix
    from gateway.wire.identity import IdentityError

    if not args.agent_ca:
        raise ValueError("--agent-ca is required: agents must be verified against a CA "
                         "(refusing to start without one)")
    if not os.path.isfile(args.agent_ca):
        raise ValueError(f"--agent-ca {args.agent_ca}: no such file (refusing to start)")
    startup.check_ca_file(args.agent_ca, "--agent-ca")
    startup.check_key_pair(args.tls_dir, "--tls-dir")
    startup.check_key_pair(args.tunnel_tls_dir, "--tunnel-tls-dir")
    try:
        validate_prefix(args.identity_prefix)
    except IdentityError as exc:
        raise ValueError(f"--identity-prefix: {exc}") from None
    from gateway.hub.admission.forwarded import parse_networks

    proxy_protocol_from = parse_networks(args.proxy_protocol_from, "--proxy-protocol-from")
    forwarded_for_from = parse_networks(args.forwarded_for_from, "--forwarded-for-from")
    if args.fair_hand_size > args.fair_queues:
        raise ValueError(f"--fair-hand-size {args.fair_hand_size} is more than --fair-queues "
                         f"{args.fair_queues}")
    keepalive, tunnel_timeout = tunnel_liveness(args)
    try:
        naming = AgentNaming(args.agent_identity, args.ocm_addon_name)
    except ValueError as exc:
        raise ValueError(f"--ocm-addon-name: {exc}") from None
    health = None if args.health_listen in ("", "off") else parse_address(args.health_listen)
    head = Limits(max_head_bytes=args.max_header_bytes, max_request_line=args.max_request_line,
                  max_field_line=min(args.max_header_bytes, 64 * 1024),
                  max_headers=args.max_headers)
    limits = FrontDoorLimits(
        head=head,
        header_timeout=args.header_timeout,
        idle_timeout=args.idle_timeout,
        response_header_timeout=args.response_header_timeout,
        max_connections=args.max_connections,
        max_inflight=args.max_inflight,
        max_request_body=args.max_request_body,
        http2=not args.no_http2,
        max_h2_streams=args.max_h2_streams,
    )
    return GatewayConfig(
        listen=tuple(args.listen),
        tunnel_listen=tuple(args.tunnel_listen),
        health_listen=health,
        tls_dir=args.tls_dir,
        tunnel_tls_dir=args.tunnel_tls_dir,
        agent_ca=args.agent_ca,
        agent_naming=naming,
        hub_kubeconfig=args.hub_kubeconfig,
        audiences=tuple(args.audience or ()),
        token_cache_ttl=args.token_cache_ttl,
        hub_outage_grace=args.hub_outage_grace,
        identity_prefix=args.identity_prefix,
        authorize=args.authorize,
        token_passthrough=bool(args.token_passthrough),
        auth_failure_rate=args.auth_failure_rate,
        auth_failure_burst=args.auth_failure_burst,
        proxy_protocol_from=proxy_protocol_from,
        forwarded_for_from=forwarded_for_from,
        hub_max_concurrent_reviews=args.hub_max_concurrent_reviews,
        hub_review_wait=args.hub_review_wait,
        max_streams_per_identity=args.max_streams_per_identity,
        max_executing_requests=args.max_executing_requests,
        fair_queues=args.fair_queues,
        fair_hand_size=args.fair_hand_size,
        fair_queue_length=args.fair_queue_length,
        fair_queue_wait=args.fair_queue_wait,
        revalidate_streams=args.revalidate_streams,
        limits=limits,
        unknown_cluster_grace=args.unknown_cluster_grace,
        cluster_inventory=args.cluster_inventory,
        inventory_namespaces=tuple(getattr(args, "clusterprofile_namespace", None) or ()),
        shutdown_timeout=args.shutdown_timeout,
        shutdown_delay=args.shutdown_delay,
        tunnel_keepalive=keepalive,
        tunnel_timeout=tunnel_timeout,
        tunnel_max_handshakes=args.tunnel_max_handshakes,
        tunnel_backlog=args.tunnel_backlog,
        workers=args.workers,
        replicas=args.replicas or 1,
        hub_instance=workers_instance_id(),
        lease_namespace=lease_namespace(args.lease_namespace),
        lease_duration=args.lease_duration,
        ready_wait=args.ready_wait,
        join_ca_secret=args.join_ca_secret or None,
        join_namespace=args.join_namespace,
        join_certificate_lifetime=args.join_certificate_lifetime,
        join_poll_interval=args.join_poll_interval,
        **_audit_settings(args),
        hub_write_qps=args.hub_write_qps,
        hub_write_burst=args.hub_write_burst,
        cluster_metrics=args.cluster_metrics,
    )


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def lease_namespace(flag: str | None) -> str | None:
    """--lease-namespace: the namespace given, None for 'off', else the pod's namespace."""
    if flag is not None:
        return None if flag.strip() in ("", "off") else flag.strip()
    with contextlib.suppress(OSError), open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as file:
        return file.read().strip() or None
    return None


def start_instance_discovery(config: GatewayConfig, gateway: Any, api_client: Any) -> Any:
    """This process's Lease and the live set announced to agents; None when off."""
    if not config.lease_namespace or not config.hub_instance:
        return None
    from gateway.hub.instances.announcer import InstanceAnnouncer

    announcer = InstanceAnnouncer(
        api_client, config.lease_namespace, config.hub_instance,
        clusters=gateway.registry.clusters, on_change=gateway.announce_instances,
        duration=config.lease_duration, ready_wait=config.ready_wait,
        writes=gateway.hub_writes)
    gateway.registry.subscribe(announcer.cluster_changed)
    if config.ready_wait > 0:
        gateway.readiness.gates.append(announcer.readiness_reason)
    announcer.start()
    return announcer


async def serve(config: GatewayConfig, args: argparse.Namespace | None = None,
                link: MetricsLink | None = None) -> int:
    from gateway.hub.app import build_gateway

    try:
        gateway, api_client = await build_gateway(config)
    except startup.StartupError as exc:
        print(f"hubproxy gateway: {exc}", file=sys.stderr)
        return startup.EXIT_CODE
    joining = None
    if config.join_ca_secret is not None:
        joining = await _joining(config, api_client)
        if joining is None:
            await api_client.close()
            return startup.EXIT_CODE
        gateway.tunnel_join, gateway.tunnel_refuse = joining.handle, joining.refuse
    inventory_task = None
    if config.cluster_inventory != "none":
        from gateway.hub import inventory

        cluster_list = inventory.ClusterInventory(api_client, config.cluster_inventory,
                                                  config.inventory_namespaces)
        gateway.inventory = cluster_list
        inventory_task = inventory.start(cluster_list)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    extras: list[asyncio.Task[None]] = []
    announcer = None
    peers: PeerSnapshots | SnapshotSender | None = None
    try:
        try:
            await gateway.start()
        except startup.StartupError as exc:
            print(f"hubproxy gateway: {exc}", file=sys.stderr)
            return startup.EXIT_CODE
        if link is not None and config.worker_index == 0:
            peers = link.receiver()
            peers.start()
            gateway.metrics.peers = peers.snapshots
            # /readyz is worker 0's: Ready only when every worker is.
            gateway.readiness.gates.append(workers_readiness_gate(peers.by_worker,
                                                                 config.workers))
        elif link is not None:
            peers = link.sender(config.worker_index)

            def part() -> dict[str, Any]:
                figures = gateway.metrics.part()
                figures["scalars"][WORKER_NOT_READY] = gateway.readiness.reason()
                return figures

            peers.start(part, changed=gateway.metrics.take_changed)
        announcer = start_instance_discovery(config, gateway, api_client)
        if joining is not None:  # every process: each has its own listener to police
            joining.listener = gateway.tunnel_listener
            extras.append(asyncio.ensure_future(joining.run()))
        gctune.settle()
        print(f"hubproxy gateway ready: front door port {gateway.front_port}, tunnel port "
              f"{gateway.tunnel_port}, health port {gateway.health_port or 'off'}",
              file=sys.stderr, flush=True)
        if args is not None and config.worker_index == 0:
            if getattr(args, "clusterprofiles", None) is not None:
                extras.append(asyncio.ensure_future(
                    clusterprofile.run(args, api_client, gateway.registry,
                                       gateway.hub_writes)))
            if getattr(args, "ocm_addon_conditions", False):
                extras.append(asyncio.ensure_future(
                    ocm.run(args, api_client, gateway.registry, gateway.hub_writes)))
        await stop.wait()
        log.info("shutting down: draining for up to %.0fs", config.shutdown_timeout)
        # The Lease goes first (in parallel with the drain): peers and agents stop counting
        # this instance while its in-flight requests finish.
        leaving = asyncio.ensure_future(announcer.stop()) if announcer is not None else None
        await gateway.shutdown()
        if leaving is not None:
            await leaving
            announcer = None
    finally:
        if announcer is not None:
            await announcer.stop()
        for task in extras:
            task.cancel()
        if inventory_task is not None:
            inventory_task.cancel()
        if peers is not None:
            peers.stop()
        await gateway.close()
        audit.install_writer(None)  # flushes the last lines
        with contextlib.suppress(Exception):
            await api_client.close()
    return 0


async def _joining(config: GatewayConfig, api_client: object) -> JoinService | None:
    """The join service, its CA and records read once; None (after saying why) if they fail."""
    import datetime

    from gateway.hub.join.store import CASecretError, RecordStore

    assert config.join_ca_secret is not None
    service = JoinService(RecordStore(api_client, config.join_namespace),
                          config.join_ca_secret,
                          lifetime=datetime.timedelta(seconds=config.join_certificate_lifetime),
                          poll_interval=config.join_poll_interval)
    try:
        await service.start()
    except CASecretError as exc:
        print(f"hubproxy gateway: --join-ca-secret: {exc} (refusing to start)", file=sys.stderr)
        return None
    except Exception as exc:
        print(f"hubproxy gateway: cannot read the cluster records in {config.join_namespace} "
              f"(HTTP {getattr(exc, 'status', None) or type(exc).__name__}); refusing to start",
              file=sys.stderr)
        return None
    return service


def run(args: argparse.Namespace) -> int:
    diagnostics.configure(args.log_level)
    logging.getLogger("hubproxy.audit").setLevel(logging.INFO)
    audit.install_writer(audit.AuditWriter(sys.stdout))
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"hubproxy gateway: {exc}", file=sys.stderr)
        return 2
    if args.replicas is not None and config.lease_namespace:
        log.warning("--replicas is deprecated and ignored: gateway instances are discovered "
                    "from Leases in namespace %s (--lease-namespace off to use the count)",
                    config.lease_namespace)
    problem = clusterprofile.validate(args)
    if problem:
        print(f"hubproxy gateway: {problem}", file=sys.stderr)
        return 2
    try:
        startup.require_cluster_or_kubeconfig(config.hub_kubeconfig, "--hub-kubeconfig")
        check_ports_free(config)
    except startup.StartupError as exc:
        print(f"hubproxy gateway: {exc}", file=sys.stderr)
        return startup.EXIT_CODE
    # Client connections, plus agent sessions and hub connections.
    raise_open_file_limit(config.limits.max_connections + 1024)
    if config.workers > 1:
        if config.listen[1] == 0 or config.tunnel_listen[1] == 0:
            print("hubproxy gateway: --workers needs fixed --listen and --tunnel-listen ports",
                  file=sys.stderr)
            return 2
        from gateway.hub import workers

        audit.install_writer(audit.AuditWriter(sys.stdout, atomic=True))
        return workers.run(config, lambda worker, link: _serve_in_loop(worker, args, link))
    return _serve_in_loop(config, args)


def check_ports_free(config: GatewayConfig) -> None:
    """Every port this gateway will listen on is free (before anything is built or forked)."""
    startup.check_port_free(*config.listen, "--listen")
    startup.check_port_free(*config.tunnel_listen, "--tunnel-listen")
    if config.health_listen is not None:
        startup.check_port_free(*config.health_listen, "--health-listen")


def _serve_in_loop(config: GatewayConfig, args: argparse.Namespace,
                   link: MetricsLink | None = None) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(config, args, link))
    return uvloop.run(serve(config, args, link))
