"""The fleet view and the metrics operators asked for, from real processes: ``GET /clusters``
on the gateway's health port, ``hubproxy clusters`` printing it, and ``/metrics`` series for
latency, hub calls, caches, the tunnel and certificate expiry. Plus the pure merge/summary."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from gateway.access.clusters import rows, table
from gateway.hub import fleet
from tests.gateway.hub.hubsim import Fleet, gateway_and_agent

pytestmark = pytest.mark.timeout(120)


def _get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        assert response.headers["Content-Type"] == "application/json"
        return json.loads(response.read())


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"{series} not in /metrics:\n{text}")


async def _traffic(fleet_: Fleet) -> None:
    context = ssl.create_default_context(cafile=str(fleet_.ca))
    headers = {"Authorization": f"Bearer {fleet_.sims.user_token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context),
                                     headers=headers) as client:
        for _ in range(3):
            async with client.get(fleet_.url("/c1/version")) as response:
                assert response.status == 200
                await response.read()
        async with client.get(fleet_.url("/c1/api/v1/namespaces/default/configmaps?watch=1"),
                              timeout=aiohttp.ClientTimeout(total=10)) as response:
            assert response.status == 200
        async with client.get(fleet_.url("/nope/version")) as response:
            assert response.status == 503  # unknown, within the start-up grace


@pytest.mark.slow
async def test_clusters_view_and_metrics_of_a_running_gateway(tmp_path: Path) -> None:
    async with gateway_and_agent(tmp_path) as running:
        await _traffic(running)
        document = await asyncio.to_thread(_get_json, running.health, "/clusters")
        assert document["kind"] == "HubproxyClusterList"
        [c1] = document["clusters"]
        agent_cert = x509.load_pem_x509_certificate(
            (tmp_path / "pki" / "agents" / "c1" / "tls.crt").read_bytes())
        assert c1["name"] == "c1" and c1["connected"] is True
        assert (c1["sessions"], c1["instances"]) == (1, 1)
        from importlib.metadata import version

        assert c1["agent_versions"] == [version("hubproxy")]  # sent in the tunnel SETTINGS
        assert c1["rtt_ms"] is not None and 0 <= c1["rtt_ms"] < 1000
        assert c1["certificate_not_after"] == \
            agent_cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert c1["last_error"] is None
        [session] = c1["session_details"]
        assert session["streams_total"] >= 4 and session["bytes_in"] > 0
        assert re.fullmatch(r"[0-9a-f]{8}", session["agent_instance"])
        # Nothing about callers: no token, no user.
        raw = json.dumps(document)
        assert running.sims.user_token not in raw and "serviceaccount" not in raw

        printed = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "gateway.cli", "clusters", "--url",
                             f"http://127.0.0.1:{running.health}"],
            capture_output=True, text=True, timeout=30)
        assert printed.returncode == 0, printed.stderr
        header, line = printed.stdout.splitlines()
        assert header.split()[:3] == ["CLUSTER", "STATUS", "SESSIONS"]
        assert line.split()[:5] == ["c1", "connected", "1", "1", version("hubproxy")]

        text = await asyncio.to_thread(_scrape, running.health)
        # Latency for the whole gateway: c1's three short requests and the unknown one.
        assert _value(text, 'hubproxy_request_duration_seconds_count{class="short"}') == 4
        assert _value(text, 'hubproxy_request_duration_seconds_count{class="watch"}') == 1
        assert _value(text, 'hubproxy_requests_total{cluster="c1",code="2xx"}') == 4
        assert _value(text, 'hubproxy_requests_total{cluster="_other",code="5xx"}') == 1
        # One TokenReview and a SAR per cluster asked for (c1, nope); the rest were cache hits.
        assert _value(text, 'hubproxy_hub_requests_total{call="tokenreview",outcome="ok"}') == 1
        assert _value(text, 'hubproxy_hub_requests_total{call="subjectaccessreview",'
                            'outcome="ok"}') == 2
        assert _value(text, 'hubproxy_hub_request_duration_seconds_count'
                            '{call="tokenreview"}') == 1
        assert _value(text, "hubproxy_auth_cache_hits_total") >= 4
        assert _value(text, "hubproxy_authz_cache_hits_total") >= 3
        assert _value(text, 'hubproxy_tunnel_sessions{cluster="c1"}') == 1
        assert _value(text, 'hubproxy_tunnel_rtt_seconds{cluster="c1"}') < 1
        assert _value(text, 'hubproxy_tunnel_streams_opened_total{cluster="c1"}') >= 4
        assert _value(text, 'hubproxy_tunnel_bytes_total{cluster="c1",'
                            'direction="from_agent"}') > 0
        assert _value(text, f'hubproxy_agent_info{{cluster="c1",'
                            f'version="{version("hubproxy")}"}}') == 1
        for name in ("serving", "tunnel"):
            cert = x509.load_pem_x509_certificate((tmp_path / "pki" / (
                "gateway" if name == "serving" else "tunnel-server") / "tls.crt").read_bytes())
            assert _value(text, f'hubproxy_certificate_expiry_timestamp_seconds'
                                f'{{certificate="{name}"}}') == \
                round(cert.not_valid_after_utc.timestamp())
        assert _value(text, 'hubproxy_agent_certificate_earliest_expiry_timestamp_seconds') == \
            round(agent_cert.not_valid_after_utc.timestamp())
        # Every family has one TYPE line (Prometheus rejects a repeated one).
        types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
        assert len(types) == len(set(types))
        assert running.sims.user_token not in text and "serviceaccount" not in text

        # The agent's own /metrics on its health port.
        agent_text = await asyncio.to_thread(_scrape, running.agent_health)
        assert _value(agent_text, 'hubproxy_agent_upstream_response_seconds_count'
                                  '{upstream="kube-apiserver"}') >= 4
        assert _value(agent_text, 'hubproxy_agent_streams_finished_total'
                                  '{upstream="kube-apiserver",outcome="complete"}') == 3
        assert _value(agent_text, "hubproxy_agent_streams_total") >= 4
        pooled = sum(_value(agent_text, f'hubproxy_agent_upstream_connections{{state="{state}"}}')
                     for state in ("idle", "in_use"))
        assert 0 <= pooled <= _value(agent_text, "hubproxy_agent_upstream_dials_total")
        assert _value(agent_text, "hubproxy_agent_upstream_dials_total") >= 1
        assert _value(agent_text, "hubproxy_agent_upstream_connections_limit") == 2048
        assert _value(agent_text, "hubproxy_agent_tunnel_sessions") == 1
        assert _value(agent_text, "hubproxy_agent_hub_connected") == 1
        assert _value(agent_text, "hubproxy_agent_tunnel_rtt_seconds") < 1
        assert _value(agent_text, 'hubproxy_certificate_expiry_timestamp_seconds'
                                  '{certificate="agent"}') == \
            round(agent_cert.not_valid_after_utc.timestamp())
        assert _value(agent_text, f'hubproxy_agent_info{{version="{version("hubproxy")}"}}') == 1
        assert running.sims.agent_token not in agent_text


def _part(worker: int, instance: str, *, error: str | None = None, at: float = 0.0) -> dict:
    return {"c1": {"sessions": [{"agent_version": "0.1.0", "agent_instance": instance,
                                 "hub_worker": worker, "connected_at": 100.0,
                                 "rtt_ms": 2.0 + worker,
                                 "active_streams": 1, "streams_total": 3, "bytes_in": 10,
                                 "bytes_out": 20, "certificate_not_after": 1e9 + worker,
                                 "draining": False}],
                   "last_error": error, "last_error_at": at or None, "disconnected_at": None,
                   "ended_bytes_in": 5, "ended_bytes_out": 5, "ended_streams": 1}}


def test_workers_parts_merge_into_one_cluster() -> None:
    merged = fleet.merge([_part(0, "aaaa0001", error="peer dead", at=50.0),
                          _part(1, "aaaa0001", error="protocol error: x", at=60.0),
                          {"c2": {"sessions": [], "last_error": "connection lost: reset",
                                  "last_error_at": 70.0, "disconnected_at": 71.0}}])
    document = fleet.summarize(merged, now=100.0)
    c1, c2 = document["clusters"]
    # One agent process holds a session to each of two workers.
    assert (c1["sessions"], c1["instances"], c1["active_streams"]) == (2, 1, 2)
    assert c1["rtt_ms"] == 3.0 and c1["last_error"] == "protocol error: x"
    assert c1["certificate_not_after"] == "2001-09-09T01:46:40Z"
    assert c2["connected"] is False and c2["disconnected_at"] == "1970-01-01T00:01:11Z"
    stats = fleet.tunnel_stats([_part(0, "a")["c1"], _part(1, "b")["c1"]])
    assert (stats.bytes_from_agent, stats.bytes_to_agent) == (30, 50)
    assert stats.streams_opened == 8 and stats.sessions == 2 and stats.rtt_seconds == 0.003
    assert stats.certificate_not_after == 1e9 and stats.versions == {"0.1.0": 2}
    printed = rows(document, now=100.0 + 3600)
    assert printed[1][:2] == ("c2", "disconnected (1h ago)")
    assert printed[1][-1] == "connection lost: reset (1h ago)"
    assert table({"clusters": []}).startswith("no cluster")


def test_sessions_without_agent_ids_count_as_separate_instances() -> None:
    part = _part(0, "x")
    part["c1"]["sessions"][0]["agent_instance"] = None
    part["c1"]["sessions"][0]["agent_version"] = None
    document = fleet.summarize(fleet.merge([part, _part(1, "y")]))
    [c1] = document["clusters"]
    assert c1["instances"] == 2 and c1["agent_versions"] == ["0.1.0", "unknown"]


def test_agent_outcomes_become_bounded_labels() -> None:
    from gateway.agent.metrics import outcome_kind

    assert outcome_kind("refused OVERLOAD") == "refused_overload"
    assert outcome_kind("reset: bytes after the end of the request body") == "reset"
    assert outcome_kind("upstream failed") == "upstream_failed"
    assert outcome_kind("") == "closed"
