"""The agent reaches the hub through an egress proxy (issue 12 item 4), with real processes:
gateway, agents and Debian's tinyproxy (an HTTP CONNECT proxy) on 127.0.0.1.

* HTTPS_PROXY with basic auth: the agent CONNECTs through the proxy (its log shows it), a request
  through the gateway works, the password appears in no agent log line;
* a proxy that refuses (wrong password: 407, or 401 from tinyproxy; port not allowed: 403): one
  clear agent line each, not one per retry;
* NO_PROXY matching the hub: the agent dials directly, the proxy sees nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from certs import layout
from gateway.fixtures import agent_args
from tests.gateway.hub.hubsim import (
    DEMO_USER,
    agent_kubeconfig_file,
    hub_and_cluster,
    start_gateway,
)
from tests.support import BackgroundProcess, ProcessGroup, free_port, wait_for_port

TINYPROXY = shutil.which("tinyproxy")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.slow,
    pytest.mark.skipif(
        TINYPROXY is None and os.environ.get("CI") != "true",
        reason="needs Debian's tinyproxy (apt-get install -y tinyproxy; .ci/run installs it)"),
]
PASSWORD = "s3cret-" + os.urandom(4).hex()
RETRY_WINDOW = 5.0  # the agent redials several times in this (backoff 0.2 s doubling)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    layout.init(root, layout.InitOptions(clusters=["c1"]))
    return root


def tinyproxy(group: ProcessGroup, directory: Path, *, connect_port: int,
              auth: bool) -> tuple[BackgroundProcess, int]:
    """A tinyproxy in the foreground (its PID is ours), logging every CONNECT to stdout."""
    assert TINYPROXY is not None, "CI=true: .ci/run should have installed tinyproxy"
    port = free_port()
    config = directory / f"tinyproxy-{port}.conf"
    config.write_text("\n".join([
        f"Port {port}", "Listen 127.0.0.1", "Timeout 30", "LogLevel Connect", "MaxClients 20",
        "Allow 127.0.0.1", f"ConnectPort {connect_port}",
        *([f"BasicAuth hub {PASSWORD}"] if auth else []), ""]))
    proc = group.start([TINYPROXY, "-d", "-c", str(config)])
    wait_for_port(port)
    return proc, port


def start_agent(group: ProcessGroup, pki: Path, tunnel: int, kubeconfig: Path,
                env: dict[str, str]) -> BackgroundProcess:
    # Lower-case variables win; blank ones count as unset, so these are the only settings.
    clean = {"https_proxy": "", "no_proxy": "", "HTTPS_PROXY": "", "NO_PROXY": ""}
    return group.hubproxy(*agent_args(pki, "c1", hub=f"127.0.0.1:{tunnel}",
                                      kubeconfig=kubeconfig, health_listen="off"),
                          "--allow-loopback-targets", env={**clean, **env})


async def whoami(front: int, ca: Path, token: str) -> tuple[int, dict]:
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--noproxy", "*", "--cacert", str(ca), "-X", "POST",
        "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {token}",
        "-H", "Content-Type: application/json",
        "-d", '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}',
        f"https://127.0.0.1:{front}/c1/apis/authentication.k8s.io/v1/selfsubjectreviews",
        stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(curl.communicate(), 20)
    body, _, code = out.decode().rpartition("\n")
    return int(code), json.loads(body) if body.startswith("{") else {}


def connects(proxy: BackgroundProcess, tunnel: int) -> int:
    return sum(f"CONNECT 127.0.0.1:{tunnel} HTTP/1.1" in line for line in proxy.lines)


async def test_agent_dials_the_hub_through_a_connect_proxy(pki: Path, tmp_path: Path) -> None:
    async with hub_and_cluster(tmp_path) as sims:
        agent_kc = agent_kubeconfig_file(sims, tmp_path)
        front, tunnel, health = free_port(), free_port(), free_port()
        group = ProcessGroup()
        try:
            await start_gateway(group, pki, sims, front=front, tunnel=tunnel, health=health)
            proxy, proxy_port = tinyproxy(group, tmp_path, connect_port=tunnel, auth=True)
            strict, strict_port = tinyproxy(group, tmp_path, connect_port=443, auth=False)
            ca = pki / "front-ca" / "ca.crt"

            # Through the proxy, with basic auth from the URL.
            via = start_agent(group, pki, tunnel, agent_kc, {
                "HTTPS_PROXY": f"http://hub:{PASSWORD}@127.0.0.1:{proxy_port}"})
            await asyncio.to_thread(via.wait_for_line, "connected to the hub", 30)
            code, review = await whoami(front, ca, sims.user_token)
            assert code == 201 and review["status"]["userInfo"]["username"] == DEMO_USER
            await asyncio.to_thread(proxy.wait_for_line, f"CONNECT 127.0.0.1:{tunnel} HTTP/1.1",
                                    10)
            assert f"through the proxy http://hub@127.0.0.1:{proxy_port}" in via.output

            # Refusals: one clear line each, however often the agent retries.
            wrong = start_agent(group, pki, tunnel, agent_kc, {
                "https_proxy": f"http://hub:wrong-{PASSWORD}@127.0.0.1:{proxy_port}"})
            denied = start_agent(group, pki, tunnel, agent_kc, {
                "HTTPS_PROXY": f"127.0.0.1:{strict_port}"})  # no scheme: http
            # 407, or 401 from tinyproxy: what matters is the line names authentication.
            await asyncio.to_thread(wrong.wait_for_line, "proxy authentication required", 30)
            await asyncio.to_thread(denied.wait_for_line, "refused the CONNECT: 403", 30)
            # asked, refused: tinyproxy may log the request after it has answered it
            await asyncio.to_thread(strict.wait_for_line, f"CONNECT 127.0.0.1:{tunnel} HTTP/1.1",
                                    10)
            before = connects(proxy, tunnel)
            await asyncio.sleep(RETRY_WINDOW)
            assert connects(proxy, tunnel) >= before + 2, "the agent should keep retrying"
            for agent, said in ((wrong, "proxy authentication required"),
                                (denied, "refused the CONNECT: 403")):
                lines = [line for line in agent.lines if "through the proxy" in line
                         and "WARNING" in line]
                assert len(lines) == 1, lines
                assert said in lines[0] and "refused the CONNECT: 40" in lines[0]
                assert "connected to the hub" not in agent.output

            # NO_PROXY matching the hub: straight to the hub, the proxy sees nothing new.
            via.stop()
            direct = start_agent(group, pki, tunnel, agent_kc, {
                "HTTPS_PROXY": f"http://127.0.0.1:{proxy_port}",
                "NO_PROXY": "localhost,10.0.0.0/8,127.0.0.1"})
            seen = connects(proxy, tunnel)
            await asyncio.to_thread(direct.wait_for_line, "connected to the hub", 30)
            assert "NO_PROXY matches the hub" in direct.output
            code, _ = await whoami(front, ca, sims.user_token)
            assert code == 201
            # Only the still-retrying 'wrong' agent reaches this proxy now: none from 'direct'
            # (it would have been refused with 407, it has no credentials).
            assert not any("through the proxy" in line for line in direct.lines)
            assert connects(proxy, tunnel) >= seen

            for agent in (via, wrong, denied, direct):
                assert PASSWORD not in agent.output
        finally:
            group.stop_all()
