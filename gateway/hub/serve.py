"""Run the hub-side gateway: the :9092 front door, the :8091 agent tunnel and the :8000 health port.

Users call https://<gateway>:9092/<cluster>/<kubernetes API path> with a hub bearer token. The
gateway verifies the token with a hub TokenReview (cached), checks that the hub user may use the
cluster (SubjectAccessReview on managedclusters/proxy, unless --authorize=none), and forwards
the request through the cluster's agent tunnel with the user's identity, prefixed
(--identity-prefix), for the agent to impersonate. Hub tokens never leave the hub.

Agents connect to --tunnel-listen with client certificates issued by --agent-ca; the cluster
name is taken from the certificate. --agent-ca is required: without it the gateway refuses to
start (fail closed). Certificates are reloaded when their files change.

Errors are Kubernetes Status JSON: 400 bad request/path (or ambiguous credentials/upgrades),
401 bad token, 403 refused (impersonation headers, hub authorization, Service not allowed),
404 unknown cluster, 413 request body over --max-request-body, 429 overload (gateway, too many
failed authentications from one address, too many long-running requests of one identity), 503
cluster not connected or hub auth unavailable/busy, 502/504 upstream unreachable/timeout.
SIGTERM: stop accepting, finish in-flight requests (up to --shutdown-timeout), then exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from typing import Any

from gateway.hub.clusterprofile import component as clusterprofile
from gateway.hub.config import GatewayConfig
from gateway.hub.join.service import JoinService
from gateway.hub.ocm import component as ocm
from gateway.hub.workers import NOT_READY as WORKER_NOT_READY
from gateway.hub.workers import instance_id as workers_instance_id
from gateway.hub.workers import readiness_gate as workers_readiness_gate
from gateway.ops import audit, diagnostics, gctune, settings, startup
from gateway.ops.metricslink import MetricsLink, PeerSnapshots, SnapshotSender
from gateway.ops.rlimits import raise_open_file_limit

log = logging.getLogger("hubproxy.gateway")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``hubproxy gateway``: every setting of :class:`GatewayConfig`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    settings.add_flags(parser, GatewayConfig)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """A validated :class:`GatewayConfig`; ValueError with a clear message otherwise."""
    config = settings.from_args(GatewayConfig, args)
    config.validate()
    assert config.agent_ca and config.tls_dir and config.tunnel_tls_dir  # validate() said so
    if not os.path.isfile(config.agent_ca):
        raise ValueError(f"--agent-ca {config.agent_ca}: no such file (refusing to start)")
    startup.check_ca_file(config.agent_ca, "--agent-ca")
    startup.check_key_pair(config.tls_dir, "--tls-dir")
    startup.check_key_pair(config.tunnel_tls_dir, "--tunnel-tls-dir")
    check_audit_files(config)
    return dataclasses.replace(config, hub_instance=workers_instance_id())


def check_audit_files(config: GatewayConfig) -> None:
    """The Kubernetes-audit files exist and the policy can be used: said at start, not at the
    first request (ValueError naming the flag)."""
    from gateway.ops.k8saudit.policy import PolicyError, load_policy

    for flag, path in (("--audit-policy-file", config.audit_policy_file),
                       ("--audit-webhook-config-file", config.audit_webhook_config_file)):
        if path and not os.path.isfile(path):
            raise ValueError(f"{flag} {path}: no such file")
    if config.audit_policy_file:
        try:
            load_policy(config.audit_policy_file)
        except PolicyError as exc:
            raise ValueError(f"--audit-policy-file {config.audit_policy_file}: {exc}") from None


def start_instance_discovery(config: GatewayConfig, gateway: Any, api_client: Any) -> Any:
    """This process's Lease and the live set announced to agents; None when off."""
    if not config.lease_namespace or not config.hub_instance:
        return None
    from gateway.hub.instances.announcer import InstanceAnnouncer

    announcer = InstanceAnnouncer(
        api_client, config.lease_namespace, config.hub_instance,
        clusters=gateway.registry.clusters, on_change=gateway.announce_instances,
        duration=config.lease_duration, ready_wait=config.ready_wait,
        writes=gateway.hub_writes)
    gateway.registry.subscribe(announcer.cluster_changed)
    if config.ready_wait > 0:
        gateway.readiness.gates.append(announcer.readiness_reason)
    announcer.start()
    return announcer


async def serve(config: GatewayConfig, link: MetricsLink | None = None) -> int:
    from gateway.hub.app import build_gateway

    try:
        gateway, api_client = await build_gateway(config)
    except startup.StartupError as exc:
        print(f"hubproxy gateway: {exc}", file=sys.stderr)
        return startup.EXIT_CODE
    joining = None
    if config.join_ca_secret is not None:
        joining = await _joining(config, api_client)
        if joining is None:
            await api_client.close()
            return startup.EXIT_CODE
        gateway.tunnel_join, gateway.tunnel_refuse = joining.handle, joining.refuse
    inventory_task = None
    if config.cluster_inventory != "none":
        from gateway.hub import inventory

        cluster_list = inventory.ClusterInventory(api_client, config.cluster_inventory,
                                                  config.inventory_namespaces)
        gateway.inventory = cluster_list
        inventory_task = inventory.start(cluster_list)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    extras: list[asyncio.Task[None]] = []
    announcer = None
    peers: PeerSnapshots | SnapshotSender | None = None
    try:
        try:
            await gateway.start()
        except startup.StartupError as exc:
            print(f"hubproxy gateway: {exc}", file=sys.stderr)
            return startup.EXIT_CODE
        if link is not None and config.worker_index == 0:
            peers = link.receiver()
            peers.start()
            gateway.metrics.peers = peers.snapshots
            # /readyz is worker 0's: Ready only when every worker is.
            gateway.readiness.gates.append(workers_readiness_gate(peers.by_worker,
                                                                 config.workers))
        elif link is not None:
            peers = link.sender(config.worker_index)

            def part() -> dict[str, Any]:
                figures = gateway.metrics.part()
                figures["scalars"][WORKER_NOT_READY] = gateway.readiness.reason()
                return figures

            peers.start(part, changed=gateway.metrics.take_changed)
        announcer = start_instance_discovery(config, gateway, api_client)
        if joining is not None:  # every process: each has its own listener to police
            joining.listener = gateway.tunnel_listener
            extras.append(asyncio.ensure_future(joining.run()))
        gctune.settle()
        if config.worker_index == 0:
            log.info("settings not at their defaults: %s",
                     " ".join(settings.changed(config)) or "none")
        print(f"hubproxy gateway ready: front door port {gateway.front_port}, tunnel port "
              f"{gateway.tunnel_port}, health port {gateway.health_port or 'off'}",
              file=sys.stderr, flush=True)
        if config.worker_index == 0 and config.tls_dir is not None:
            if config.clusterprofiles.mode is not None:
                extras.append(asyncio.ensure_future(clusterprofile.run(
                    config.clusterprofiles, config.tls_dir, api_client, gateway.registry,
                    gateway.hub_writes)))
            if config.ocm_addon.enabled:
                extras.append(asyncio.ensure_future(ocm.run(
                    config.ocm_addon, config.ocm_addon_name, api_client, gateway.registry,
                    gateway.hub_writes)))
        await stop.wait()
        log.info("shutting down: draining for up to %.0fs", config.shutdown_timeout)
        # The Lease goes first (in parallel with the drain): peers and agents stop counting
        # this instance while its in-flight requests finish.
        leaving = asyncio.ensure_future(announcer.stop()) if announcer is not None else None
        await gateway.shutdown()
        if leaving is not None:
            await leaving
            announcer = None
    finally:
        if announcer is not None:
            await announcer.stop()
        for task in extras:
            task.cancel()
        if inventory_task is not None:
            inventory_task.cancel()
        if peers is not None:
            peers.stop()
        await gateway.close()
        audit.install_writer(None)  # flushes the last lines
        with contextlib.suppress(Exception):
            await api_client.close()
    return 0


async def _joining(config: GatewayConfig, api_client: object) -> JoinService | None:
    """The join service, its CA and records read once; None (after saying why) if they fail."""
    import datetime

    from gateway.hub.join.store import CASecretError, RecordStore

    assert config.join_ca_secret is not None
    service = JoinService(RecordStore(api_client, config.join_namespace),
                          config.join_ca_secret,
                          lifetime=datetime.timedelta(seconds=config.join_certificate_lifetime),
                          poll_interval=config.join_poll_interval)
    try:
        await service.start()
    except CASecretError as exc:
        print(f"hubproxy gateway: --join-ca-secret: {exc} (refusing to start)", file=sys.stderr)
        return None
    except Exception as exc:
        print(f"hubproxy gateway: cannot read the cluster records in {config.join_namespace} "
              f"(HTTP {getattr(exc, 'status', None) or type(exc).__name__}); refusing to start",
              file=sys.stderr)
        return None
    return service


def run(args: argparse.Namespace) -> int:
    diagnostics.configure(args.log_level)
    logging.getLogger("hubproxy.audit").setLevel(logging.INFO)
    audit.install_writer(audit.AuditWriter(sys.stdout))
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"hubproxy gateway: {exc}", file=sys.stderr)
        return 2
    if config.replicas is not None and config.lease_namespace:
        log.warning("--replicas is deprecated and ignored: gateway instances are discovered "
                    "from Leases in namespace %s (--lease-namespace off to use the count)",
                    config.lease_namespace)
    try:
        startup.require_cluster_or_kubeconfig(config.hub_kubeconfig, "--hub-kubeconfig")
        check_ports_free(config)
    except startup.StartupError as exc:
        print(f"hubproxy gateway: {exc}", file=sys.stderr)
        return startup.EXIT_CODE
    # Client connections, plus agent sessions and hub connections.
    raise_open_file_limit(config.limits.max_connections + 1024)
    if config.workers > 1:
        if config.listen[1] == 0 or config.tunnel_listen[1] == 0:
            print("hubproxy gateway: --workers needs fixed --listen and --tunnel-listen ports",
                  file=sys.stderr)
            return 2
        from gateway.hub import workers

        audit.install_writer(audit.AuditWriter(sys.stdout, atomic=True))
        return workers.run(config, _serve_in_loop)
    return _serve_in_loop(config)


def check_ports_free(config: GatewayConfig) -> None:
    """Every port this gateway will listen on is free (before anything is built or forked)."""
    startup.check_port_free(*config.listen, "--listen")
    startup.check_port_free(*config.tunnel_listen, "--tunnel-listen")
    if config.health_listen is not None:
        startup.check_port_free(*config.health_listen, "--health-listen")


def _serve_in_loop(config: GatewayConfig, link: MetricsLink | None = None) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(config, link))
    return uvloop.run(serve(config, link))
