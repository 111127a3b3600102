"""A kubesim hub (the gateway's TokenReview/SAR) and one kubesim managed cluster ``c1``, with the
tokens and the hub kubeconfig a gateway process needs: the setup of the process-level tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.fixtures import GATEWAY_USER, hub_rbac, managed_rbac, write_private
from kubesim.testing import RunningKubeSim, run_kubesim

DEMO_USER = "cluster:hub:system:serviceaccount:demo:demo"


@dataclass
class HubAndCluster:
    hub: RunningKubeSim
    managed: RunningKubeSim
    user_token: str  # a hub token of demo/demo, allowed on c1 as DEMO_USER
    agent_token: str  # what the agent presents to c1
    hub_kubeconfig: Path  # for `hubproxy gateway --hub-kubeconfig`


@contextlib.asynccontextmanager
async def hub_and_cluster(tmp_path: Path) -> AsyncIterator[HubAndCluster]:
    gateway_token = "gw-" + os.urandom(8).hex()
    agent_token = "agent-" + os.urandom(8).hex()
    async with run_kubesim(tmp_path, name="hub", users=[(gateway_token, GATEWAY_USER, "gw")],
                           rbac=hub_rbac()) as hub, \
            run_kubesim(tmp_path, name="c1", users=[(agent_token, "hubproxy-agent", "a")],
                        rbac=managed_rbac(DEMO_USER)) as managed:
        yield HubAndCluster(
            hub=hub, managed=managed,
            user_token=hub.mint_token("demo", "demo", expiration_seconds=3600),
            agent_token=agent_token,
            hub_kubeconfig=write_private(tmp_path / "hub.kubeconfig",
                                         yaml.safe_dump(hub.kubeconfig(gateway_token))))


@dataclass
class Fleet:
    """A ``hubproxy gateway`` process and one ``hubproxy agent`` process for ``c1``."""

    sims: HubAndCluster
    group: Any  # tests.support.ProcessGroup
    gateway: Any  # BackgroundProcess
    agent: Any  # BackgroundProcess
    front: int
    tunnel: int
    health: int
    agent_health: int
    ca: Path  # the front door's CA

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.front}{path}"


def agent_kubeconfig_file(sims: HubAndCluster, directory: Path) -> Path:
    """A kubeconfig with which an agent reaches the managed kubesim with its own token."""
    from gateway.fixtures import agent_kubeconfig

    token_file = write_private(directory / "agent-token", sims.agent_token)
    return write_private(directory / "agent-kc", yaml.safe_dump(agent_kubeconfig(
        sims.managed.url, sims.managed.ca_file, str(token_file))))


async def start_gateway(group: Any, pki: Path, sims: HubAndCluster, *, front: int, tunnel: int,
                        health: int, shutdown_timeout: str = "3", extra: tuple[str, ...] = ()
                        ) -> Any:
    """`hubproxy gateway` on loopback with the certificates of ``pki`` and the kubesim hub;
    returns once it says it is ready."""
    import asyncio

    gateway = group.hubproxy(
        "gateway", "--tls-dir", str(pki / "gateway"),
        "--tunnel-tls-dir", str(pki / "tunnel-server"),
        "--agent-ca", str(pki / "tunnel-ca" / "ca.crt"),
        "--listen", f"127.0.0.1:{front}", "--tunnel-listen", f"127.0.0.1:{tunnel}",
        "--health-listen", f"127.0.0.1:{health}",
        "--hub-kubeconfig", str(sims.hub_kubeconfig), "--shutdown-timeout", shutdown_timeout,
        *extra)
    await asyncio.to_thread(gateway.wait_for_line, "hubproxy gateway ready", 30)
    return gateway


@contextlib.asynccontextmanager
async def gateway_and_agent(tmp_path: Path, *, gateway_flags: tuple[str, ...] = (),
                            agent_flags: tuple[str, ...] = ()) -> AsyncIterator[Fleet]:
    """Certificates, the two kubesims, a gateway and an agent, all real processes; yields once
    a request through the gateway reaches ``c1``. Stops exactly the processes it started."""
    import asyncio

    from certs import layout
    from gateway.fixtures import agent_args
    from tests.support import ProcessGroup, free_port

    pki = tmp_path / "pki"
    layout.init(pki, layout.InitOptions(clusters=["c1"]))
    async with hub_and_cluster(tmp_path) as sims:
        agent_kc = agent_kubeconfig_file(sims, tmp_path)
        front, tunnel, health, agent_health = free_port(), free_port(), free_port(), free_port()
        group = ProcessGroup()
        try:
            gateway = await start_gateway(group, pki, sims, front=front, tunnel=tunnel,
                                          health=health, shutdown_timeout="2",
                                          extra=gateway_flags)
            agent = group.hubproxy(*agent_args(pki, "c1", hub=f"127.0.0.1:{tunnel}",
                                               kubeconfig=agent_kc,
                                               health_listen=f"127.0.0.1:{agent_health}"),
                                   *agent_flags)
            await asyncio.to_thread(gateway.wait_for_line, "cluster c1 connected", 30)
            yield Fleet(sims=sims, group=group, gateway=gateway, agent=agent, front=front,
                        tunnel=tunnel, health=health, agent_health=agent_health,
                        ca=pki / "front-ca" / "ca.crt")
        finally:
            await asyncio.to_thread(group.stop_all)
