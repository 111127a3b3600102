"""A kubesim hub (the gateway's TokenReview/SAR) and one kubesim managed cluster ``c1``, with the
tokens and the hub kubeconfig a gateway process needs: the setup of the process-level tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.demo import GATEWAY_USER, hub_rbac, managed_rbac, write_private
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
