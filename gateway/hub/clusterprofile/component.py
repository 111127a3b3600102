"""`hubproxy gateway --clusterprofiles=on|off`: the writer as a part of the gateway process.

Its settings are ``GatewayConfig.clusterprofiles``
(:class:`gateway.hub.config.ClusterProfileSettings`).

* unset (default): ClusterProfiles are not touched and no hub RBAC for them is needed;
* ``on``: keep our access-provider entry on served clusters' profiles (see writer.py);
* ``off``: the feature is being disabled: remove our entry from every profile once, then idle.

The writer lives in the gateway because "served" means "an agent is connected to this
gateway", which only the gateway's session registry knows.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from gateway.hub.clusterprofile.provider import ca_certificates_only
from gateway.hub.clusterprofile.writer import AccessProviderWriter
from gateway.hub.config import ClusterProfileSettings
from gateway.hub.hubwrites import HubWrites

log = logging.getLogger("hubproxy.clusterprofile")


def ca_file(settings: ClusterProfileSettings, tls_dir: str) -> Path:
    """The CA bundle to publish: --clusterprofile-ca, else ca.crt in the front door's --tls-dir."""
    if settings.ca:
        return Path(settings.ca)
    return Path(tls_dir) / "ca.crt"


def build_writer(settings: ClusterProfileSettings, tls_dir: str, api_client: Any,
                 registry: Any, writes: HubWrites | None = None) -> AccessProviderWriter:
    """A writer fed by the session registry (`clusters()` and `subscribe(cb)`), its writes at
    the process's shared rate (``writes``)."""
    path = ca_file(settings, tls_dir)
    writer = AccessProviderWriter(
        api_client,
        provider_name=settings.provider_name,
        public_url=settings.public_url or "",
        ca_bundle=lambda: ca_certificates_only(path.read_bytes()),
        connected_clusters=registry.clusters,
        namespaces=list(settings.namespaces),
        grace=settings.grace,
        writes=writes,
    )
    registry.subscribe(writer.cluster_changed)
    return writer


async def run(settings: ClusterProfileSettings, tls_dir: str, api_client: Any,
              registry: Any, writes: HubWrites | None = None) -> None:
    """Run the feature as configured until cancelled (returns at once when unset)."""
    if settings.mode is None:
        return
    writer = build_writer(settings, tls_dir, api_client, registry, writes)
    if settings.mode == "on":
        await writer.run()
        return
    while True:  # off: remove our entries; retry until the hub answers
        try:
            removed = await writer.remove_all()
        except Exception as exc:
            log.warning("removing our ClusterProfile entries failed (%s); retrying", exc)
            await asyncio.sleep(10)
            continue
        log.info("clusterprofiles=off: removed our entry from %d ClusterProfiles", removed)
        return
