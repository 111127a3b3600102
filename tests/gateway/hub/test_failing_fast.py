"""Failing fast, with real processes: a frozen agent (SIGSTOP) or a frozen gateway is found
within 10 s by the tunnel's keepalive, and a hung managed apiserver costs a short request the
response-header timeout (504), while watches and ``logs -f`` are exempt from it."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.cli import build_parser
from gateway.demo import sample_pod
from gateway.hub.serve import config_from_args
from tests.gateway.hub.hubsim import Fleet, gateway_and_agent

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _client(fleet: Fleet, timeout: float = 30) -> aiohttp.ClientSession:
    context = ssl.create_default_context(cafile=str(fleet.ca))
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context, force_close=True),
        headers={"Authorization": f"Bearer {fleet.sims.user_token}"},
        timeout=aiohttp.ClientTimeout(total=timeout))


async def _get(fleet: Fleet, path: str, timeout: float = 30) -> tuple[int, bytes, float]:
    started = time.monotonic()
    async with _client(fleet, timeout) as client, client.get(fleet.url(path)) as response:
        if response.status == 200 and "watch=" in path:
            body = b""  # the head is what was waited for; no event may ever come
        elif response.status == 200 and "follow=" in path:
            body = await response.content.readany()  # a first log line
        else:
            body = await response.read()
        return response.status, body, time.monotonic() - started


def _clusters(fleet: Fleet) -> dict:
    url = f"http://127.0.0.1:{fleet.health}/clusters"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_defaults_meet_the_operators_figures() -> None:
    """Short requests 60 s (kube-apiserver's own request timeout); a silent tunnel peer is
    dead after 8 s: found within 8 + 0.25 s (one keepalive tick). The agent pings after 3 s of
    silence, the gateway after 5 s, so a live agent's PINGs keep the gateway from pinging
    (issue 22: one exchange per idle session, not two)."""
    from tunnel.liveness import MAX_TICK

    pki = "/nonexistent"
    args = build_parser().parse_args(["gateway", "--tls-dir", pki, "--tunnel-tls-dir", pki,
                                      "--agent-ca", pki])
    assert args.response_header_timeout == 60
    assert (args.tunnel_keepalive, args.tunnel_timeout) == (5, 8)
    assert args.tunnel_timeout + MAX_TICK < 10
    agent = build_parser().parse_args(["agent", "--hub", "h:1", "--cluster", "c1",
                                       "--tls-dir", pki])
    assert (agent.tunnel_keepalive, agent.tunnel_timeout) == (3, 8)
    assert agent.tunnel_keepalive < args.tunnel_keepalive


def test_a_timeout_not_longer_than_the_keepalive_is_refused(tmp_path: Path) -> None:
    from certs import layout

    layout.init(tmp_path, layout.InitOptions(clusters=["c1"]))
    args = build_parser().parse_args([
        "gateway", "--tls-dir", str(tmp_path / "gateway"),
        "--tunnel-tls-dir", str(tmp_path / "tunnel-server"),
        "--agent-ca", str(tmp_path / "tunnel-ca" / "ca.crt"),
        "--tunnel-keepalive", "5s", "--tunnel-timeout", "5s"])
    with pytest.raises(ValueError, match="--tunnel-timeout 5s must be longer than "
                       "--tunnel-keepalive 5s"):
        config_from_args(args)


async def test_a_frozen_agent_is_found_within_10s_then_recovers(tmp_path: Path) -> None:
    async with gateway_and_agent(tmp_path) as fleet:
        status, _, _ = await _get(fleet, "/c1/version")
        assert status == 200
        fleet.agent.signal(signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            status, body, _ = await _get(fleet, "/c1/version")
            waited = time.monotonic() - frozen
            assert status == 503, body
            assert b'"kind":"Status"' in body.replace(b" ", b"")
            # Found by the keepalive (8 s of silence), not by anything faster or slower.
            print(f"frozen agent: 503 after {waited:.1f}s")
            assert 4 < waited < 10, waited
            await asyncio.to_thread(fleet.gateway.wait_for_line, "declaring it dead", 5)
            # The fleet view says which cluster went and why.
            [c1] = (await asyncio.to_thread(_clusters, fleet))["clusters"]
            assert (c1["connected"], c1["last_error"]) == (False, "peer dead"), c1
            assert c1["disconnected_at"] is not None
        finally:
            fleet.agent.signal(signal.SIGCONT)
        # The thawed agent sees its session gone and dials again.
        deadline = time.monotonic() + 30
        while True:
            status, _, _ = await _get(fleet, "/c1/version")
            if status == 200:
                break
            assert time.monotonic() < deadline, "the agent did not come back"
            await asyncio.sleep(0.3)
        [c1] = (await asyncio.to_thread(_clusters, fleet))["clusters"]
        assert (c1["connected"], c1["sessions"], c1["last_error"]) == (True, 1, "peer dead")


async def test_a_frozen_gateway_is_found_by_the_agent_within_10s(tmp_path: Path) -> None:
    async with gateway_and_agent(tmp_path) as fleet:
        await asyncio.to_thread(fleet.agent.wait_for_line, "connected to the hub", 10)
        fleet.gateway.signal(signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            await asyncio.to_thread(fleet.agent.wait_for_line, "declaring it dead", 15)
            assert time.monotonic() - frozen < 10
        finally:
            fleet.gateway.signal(signal.SIGCONT)


async def test_a_hung_apiserver_answers_504_but_watches_and_follow_wait(tmp_path: Path) -> None:
    async with gateway_and_agent(tmp_path,
                                 gateway_flags=("--response-header-timeout", "1.5s")) as fleet:
        fleet.sims.managed.apply(sample_pod())

        async def slow(request: web.Request) -> web.StreamResponse | None:
            delay = request.query.get("hold")
            if delay:
                await asyncio.sleep(float(delay))
            return None

        fleet.sims.managed.intercept(slow)
        status, body, took = await _get(fleet, "/c1/api/v1/namespaces/default/pods?hold=30")
        assert status == 504, body
        assert b"did not answer in time" in body and 1.4 < took < 5, took
        # Long-running requests whose head comes later than the timeout still get it.
        for path in ("/c1/api/v1/namespaces/default/configmaps?watch=1&hold=3",
                     "/c1/api/v1/namespaces/default/pods/demo/log?follow=true&hold=3"):
            status, body, took = await _get(fleet, path)
            assert status == 200 and took >= 3, (path, status, body, took)
            assert body.startswith(b"line ") or "watch=" in path, body
