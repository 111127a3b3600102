"""`hubproxy gateway --ocm-addon-conditions`: the ManagedClusterAddOn condition writer as a part
of the gateway process (worker 0 only, like the ClusterProfile writer).

The writer lives in the gateway because "the tunnel is up" means "an agent is connected to this
gateway", which only the gateway's session registry knows.
"""

from __future__ import annotations

import argparse
from typing import Any

from gateway.hub.hubwrites import HubWrites
from gateway.hub.ocm.writer import AddOnConditionWriter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Open Cluster Management add-on (deploy/ocm)")
    group.add_argument(
        "--ocm-addon-conditions", action="store_true",
        help="keep a TunnelConnected condition on each served cluster's ManagedClusterAddOn "
        "(named --ocm-addon-name, in the cluster's namespace): True while its agent holds a "
        "session here, False once none has for --ocm-addon-grace. Needs hub RBAC: get, list "
        "and watch managedclusteraddons, patch managedclusteraddons/status (without list, "
        "each add-on is read before it is written). Off by default")
    group.add_argument(
        "--ocm-addon-grace", type=float, default=60.0, metavar="SECONDS",
        help="wait this long after a cluster's last agent left before writing False, so a "
        "reconnecting agent does not make the condition flap (default: %(default)s)")


async def run(args: argparse.Namespace, api_client: Any, registry: Any,
              writes: HubWrites | None = None) -> None:
    """Run the writer until cancelled (returns at once when the feature is off), its writes
    at the process's shared rate (``writes``)."""
    if not args.ocm_addon_conditions:
        return
    writer = AddOnConditionWriter(api_client, addon=args.ocm_addon_name,
                                  connected_clusters=registry.clusters,
                                  grace=args.ocm_addon_grace, writes=writes)
    registry.subscribe(writer.cluster_changed)
    await writer.run()
