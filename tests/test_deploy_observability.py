"""deploy/observability: every dashboard query names series we export, and the monitors point at
the port the Deployments name."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import yaml

from gateway.agent.metrics import AgentMetrics
from gateway.hub import fleet
from gateway.ops.metrics import GatewayMetrics

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
OBSERVABILITY = DEPLOY / "observability"
KUBECTL = shutil.which("kubectl") or "kubectl"
SERIES = re.compile(r"\bhubproxy_[a-z0-9_]+\b")


def exported_series() -> set[str]:
    """Every series name the gateway and the agent can put on /metrics, from their own render
    with each family populated (histograms give _bucket, _sum and _count)."""
    gateway = GatewayMetrics(cluster_detail=True)  # the detailed per-cluster series too
    gateway.request("c1", 200, 1, 1, 0.01, "short")
    gateway.hub_call("tokenreview", 0.01, ok=True)
    gateway.certificates = lambda: {"serving": 2e9}
    part = {"c1": {"sessions": [{"agent_version": "0.1.0", "agent_instance": "00000001",
                                 "hub_worker": 0, "connected_at": 1.0, "rtt_ms": 1.0,
                                 "active_streams": 1, "streams_total": 1, "bytes_in": 1,
                                 "bytes_out": 1, "certificate_not_after": 2e9,
                                 "draining": False}]}}
    gateway.fleet = lambda: part
    gateway.fleet_stats = fleet.tunnel_stats
    gateway.hub_writes = lambda: {"writes": [["clusterprofiles", "ok", 1]],
                                  "reads": {"clusterprofiles": 1},
                                  "pending": {"clusterprofiles": 0}, "waited": 0.0}
    agent = AgentMetrics()
    agent.stream_done("kube-apiserver", "complete", 1.0, 1.01)
    agent.stats = SimpleNamespace(streams=1, refused=0, active=0)
    agent.pool = SimpleNamespace(in_use=0, idle=1, max_connections=10, dials=1,
                                 protocol_dials={"h1": 0, "h2": 1}, h2_max_streams=100,
                                 h2_connections=lambda: [])
    agent.sessions = lambda: [SimpleNamespace(closed=False, rtt=0.001, bytes_received=1,
                                              bytes_sent=1)]
    agent.certificates = lambda: {"agent": 2e9}
    agent.version = "0.1.0"
    names: set[str] = set()
    for text in (gateway.render().decode(), agent.render().decode()):
        for line in text.splitlines():
            if line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads((OBSERVABILITY / "grafana-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"]
            for target in panel.get("targets", ())]


def test_every_dashboard_query_names_series_we_export() -> None:
    exported = exported_series()
    queries = dashboard_queries()
    assert len(queries) >= 15
    used = set()
    for expr in queries:
        names = SERIES.findall(expr)
        assert names, expr
        missing = [n for n in names if n not in exported]
        assert not missing, (expr, missing)
        used.update(names)
    # The panels cover what operators asked for (issue 16, item 3).
    for needed in ("hubproxy_request_duration_seconds_bucket",
                   "hubproxy_hub_request_duration_seconds_bucket", "hubproxy_hub_requests_total",
                   "hubproxy_auth_cache_hits_total", "hubproxy_authz_cache_hits_total",
                   "hubproxy_tunnel_rtt_seconds", "hubproxy_tunnel_bytes_total",
                   "hubproxy_certificate_expiry_timestamp_seconds",
                   "hubproxy_agent_upstream_response_seconds_bucket",
                   "hubproxy_agent_upstream_connections", "hubproxy_requests_by_protocol_total",
                   "hubproxy_h2_open_streams", "hubproxy_agent_upstream_h2_streams"):
        assert needed in used, needed


def test_a_name_we_do_not_export_would_be_caught() -> None:
    assert "hubproxy_request_latency_seconds_bucket" not in exported_series()


def test_monitors_scrape_the_port_the_deployments_name() -> None:
    rendered = subprocess.run([KUBECTL, "kustomize", str(OBSERVABILITY)], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(rendered)}
    # The monitors need the Prometheus Operator's CRDs: not in the kustomization (which a bare
    # cluster must admit), applied on their own.
    assert "ServiceMonitor" not in docs
    service = docs["Service"]
    monitor = yaml.safe_load((OBSERVABILITY / "servicemonitor.yaml").read_text())
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert json.loads(docs["ConfigMap"]["data"]["hubproxy.json"])["uid"] == "hubproxy"
    podmonitor = yaml.safe_load((OBSERVABILITY / "podmonitor-agent.yaml").read_text())
    for deployment_file, port in ((DEPLOY / "hub" / "deployment.yaml",
                                   service["spec"]["ports"][0]["targetPort"]),
                                  (DEPLOY / "agent" / "deployment.yaml",
                                   podmonitor["spec"]["podMetricsEndpoints"][0]["port"])):
        deployment = yaml.safe_load(deployment_file.read_text())
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert port in [p["name"] for p in container["ports"]], deployment_file
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        if "agent" in str(deployment_file):
            assert podmonitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        else:
            assert service["spec"]["selector"].items() <= labels.items()
