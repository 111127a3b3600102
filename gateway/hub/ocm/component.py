"""`hubproxy gateway --ocm-addon-conditions`: the ManagedClusterAddOn condition writer as a part
of the gateway process (worker 0 only, like the ClusterProfile writer).

The writer lives in the gateway because "the tunnel is up" means "an agent is connected to this
gateway", which only the gateway's session registry knows.
"""

from __future__ import annotations

from typing import Any

from gateway.hub.config import AddOnConditionSettings
from gateway.hub.hubwrites import HubWrites
from gateway.hub.ocm.writer import AddOnConditionWriter


async def run(settings: AddOnConditionSettings, addon: str, api_client: Any,
              registry: Any, writes: HubWrites | None = None) -> None:
    """Run the writer for the add-on ``addon`` until cancelled (returns at once when off), its
    writes at the process's shared rate (``writes``)."""
    if not settings.enabled:
        return
    writer = AddOnConditionWriter(api_client, addon=addon, connected_clusters=registry.clusters,
                                  grace=settings.grace, writes=writes)
    registry.subscribe(writer.cluster_changed)
    await writer.run()
