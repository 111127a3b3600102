"""`hubproxy gateway --clusterprofiles=on|off`: the writer as a part of the gateway process.

* unset (default): ClusterProfiles are not touched and no hub RBAC for them is needed;
* ``on``: keep our access-provider entry on served clusters' profiles (see writer.py);
* ``off``: the feature is being disabled: remove our entry from every profile once, then idle.

The writer lives in the gateway because "served" means "an agent is connected to this
gateway", which only the gateway's session registry knows.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from gateway.hub.clusterprofile.provider import ca_certificates_only
from gateway.hub.clusterprofile.writer import AccessProviderWriter
from gateway.hub.hubwrites import HubWrites

log = logging.getLogger("hubproxy.clusterprofile")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "ClusterProfile access provider (multicluster.x-k8s.io/v1alpha1)"
    )
    group.add_argument(
        "--clusterprofiles",
        choices=("on", "off"),
        default=None,
        help="on: publish our status.accessProviders entry on the ClusterProfiles of clusters "
        "this gateway serves; off: remove it everywhere (feature disabled). Unset: leave "
        "ClusterProfiles alone",
    )
    group.add_argument(
        "--public-url",
        help="URL consumers use to reach this gateway, e.g. https://hubproxy.example:9092 "
        "(required with --clusterprofiles=on); each cluster is <public-url>/<cluster>",
    )
    group.add_argument(
        "--access-provider-name",
        default="hubproxy",
        help="name of our accessProviders entry (default: %(default)s; "
        "'open-cluster-management' for drop-in use with OCM consumers)",
    )
    group.add_argument(
        "--clusterprofile-namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="namespace whose ClusterProfiles to manage (repeatable; default: all namespaces)",
    )
    group.add_argument(
        "--clusterprofile-ca",
        metavar="FILE",
        help="CA bundle to publish (default: ca.crt in --tls-dir); leaf certificates are "
        "dropped, only CAs are published",
    )
    group.add_argument(
        "--clusterprofile-grace",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="keep a cluster's entry this long after its last agent disconnects, and after "
        "the gateway starts, so a reconnecting agent (or a restarted gateway) does not make "
        "consumers flap (default: %(default)s)",
    )


def validate(args: argparse.Namespace) -> str | None:
    """A usage error to report, or None."""
    if args.clusterprofiles == "on" and not args.public_url:
        return "--clusterprofiles=on needs --public-url (the URL consumers reach us at)"
    return None


def ca_file(args: argparse.Namespace) -> Path:
    if args.clusterprofile_ca:
        return Path(args.clusterprofile_ca)
    return Path(args.tls_dir) / "ca.crt"


def build_writer(args: argparse.Namespace, api_client: Any, registry: Any,
                 writes: HubWrites | None = None) -> AccessProviderWriter:
    """A writer fed by the session registry (`clusters()` and `subscribe(cb)`), its writes at
    the process's shared rate (``writes``)."""
    path = ca_file(args)
    writer = AccessProviderWriter(
        api_client,
        provider_name=args.access_provider_name,
        public_url=args.public_url or "",
        ca_bundle=lambda: ca_certificates_only(path.read_bytes()),
        connected_clusters=registry.clusters,
        namespaces=args.clusterprofile_namespace,
        grace=args.clusterprofile_grace,
        writes=writes,
    )
    registry.subscribe(writer.cluster_changed)
    return writer


async def run(args: argparse.Namespace, api_client: Any, registry: Any,
              writes: HubWrites | None = None) -> None:
    """Run the feature as configured until cancelled (returns at once when unset)."""
    if args.clusterprofiles is None:
        return
    writer = build_writer(args, api_client, registry, writes)
    if args.clusterprofiles == "on":
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
