"""Add, list and remove the clusters that join this hub (run with hub admin credentials).

    hubproxy cluster add NAME --hub HUB:8091 [--ttl 1h] | kubectl --context NAME apply -f -
    hubproxy cluster list
    hubproxy cluster remove NAME

``add`` makes a single-use join token (default lifetime 1h), stores only its hash in the
record Secret ``hubproxy-cluster-NAME`` (namespace --namespace, the gateway's), and prints
the agent's manifests carrying the token and the hub's CA: applied to the managed cluster,
the agent makes its own key there, gets its certificate for NAME with the token, and dials in.
The token is printed once, inside those manifests, and nowhere else.

The agent's RBAC is one of its two profiles (``--profile``, default ``legacy`` as
``deploy/agent``; ``read-only``: constrained impersonation, reads only). Both name one
ClusterRole, so ``add`` first reads that ClusterRole on the managed cluster -- through the
kubeconfig context ``kubectl --context NAME apply`` would use (``--managed-context``,
``--managed-kubeconfig``) -- and refuses, before any token is made, to print manifests that
would replace another profile's (or a hand-edited one) unless ``--force``; when it cannot read
it, it says so and refuses too.

``list`` shows each record: pending (token not used yet; its expiry), joined (the expiry of the
last certificate signed), revoked. ``remove`` revokes the cluster: every gateway process closes
its sessions within its --join-poll-interval and refuses its certificates from then on; a new
``add`` is needed to join it again (its old certificates stay refused).

Hub access: --kubeconfig, else $KUBECONFIG or ~/.kube/config, else in-cluster. Each command
writes an audit line (JSON) to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import secrets
import sys
from typing import Any

from gateway.hub.join import manifests
from gateway.hub.join.records import (
    JOINED,
    PENDING,
    REVOKED,
    ClusterRecord,
    new_token,
    rfc3339,
    token_hash,
)
from gateway.hub.join.store import CASecretError, Conflict, RecordStore
from gateway.ops import audit
from gateway.ops.flags import parse_duration
from tunnel.identity import AgentIdentityError, validate_cluster_name


def _duration(value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be positive")
    return seconds


def _cluster(value: str) -> str:
    try:
        return validate_cluster_name(value)
    except AgentIdentityError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="hub kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--namespace", default="hubproxy", metavar="NAMESPACE",
                        help="the gateway's namespace, where records and the CA Secret are "
                        "(its --join-namespace; default: %(default)s)")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="make a join token and print the agent's manifests")
    add.add_argument("name", type=_cluster, metavar="NAME", help="the cluster's name")
    add.add_argument("--hub", required=True, metavar="HOST:PORT",
                     help="the gateway's tunnel address as the managed cluster reaches it")
    add.add_argument("--hub-server-name", metavar="NAME",
                     help="name to verify in the hub's tunnel certificate (default: the --hub "
                     "host)")
    add.add_argument("--ttl", type=_duration, default=3600.0, metavar="DURATION",
                     help="how long the join token may be used, once (default: 1h)")
    add.add_argument("--ca-secret", default="hubproxy-tunnel-ca", metavar="NAME",
                     help="the gateway's --join-ca-secret; its tls.crt is the hub CA the agent "
                     "trusts (default: %(default)s)")
    add.add_argument("--hub-ca", metavar="FILE",
                     help="the tunnel CA certificate to give the agent, instead of reading "
                     "--ca-secret")
    add.add_argument("--image", default=manifests.DEFAULT_IMAGE,
                     help="agent image (default: %(default)s)")
    add.add_argument("--replicas", type=int, default=2, help="agent replicas (default: 2)")
    add.add_argument("--profile", choices=manifests.PROFILES, default=manifests.DEFAULT_PROFILE,
                     help="the agent's RBAC: legacy (the impersonate verb: the hub identity may "
                     "do whatever this cluster's RBAC lets it) or read-only (constrained "
                     "impersonation, Kubernetes >= 1.36: get, list and watch only) "
                     "(default: %(default)s, as deploy/agent)")
    add.add_argument("--force", action="store_true",
                     help="print the manifests even though they would replace the ClusterRole "
                     f"{manifests.IMPERSONATOR} of another profile (or one edited by hand) on "
                     "the managed cluster, or when it cannot be read")
    add.add_argument("--managed-context", metavar="CONTEXT",
                     help="kubeconfig context of the managed cluster, where add reads which "
                     "profile the agent has now (default: the cluster's NAME, as in "
                     "`kubectl --context NAME apply`)")
    add.add_argument("--managed-kubeconfig", metavar="FILE",
                     help="kubeconfig holding that context (default: the hub's, --kubeconfig "
                     "or $KUBECONFIG or ~/.kube/config)")
    sub.add_parser("list", help="each cluster's state and certificate expiry")
    remove = sub.add_parser("remove", help="revoke a cluster: close its sessions, refuse it")
    remove.add_argument("name", type=_cluster, metavar="NAME")


def _kubeconfig_path(kubeconfig: str | None) -> str:
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return path.split(os.pathsep)[0]


async def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    path = _kubeconfig_path(kubeconfig)
    if kubeconfig or os.path.exists(path):
        await config.load_kube_config(config_file=path, client_configuration=cfg,
                                      persist_config=False)
    else:
        config.load_incluster_config(client_configuration=cfg)
    return client.ApiClient(configuration=cfg)


class ProfileCheckFailed(Exception):
    """The managed cluster's impersonation ClusterRole could not be read; the message says
    why, without a credential."""


async def installed_profile(kubeconfig: str, context: str) -> tuple[bool, str | None]:
    """(whether the managed cluster has the agent's ClusterRole, its profile -- None for rules
    of no profile) through ``context`` of ``kubeconfig``. Raises :class:`ProfileCheckFailed`."""
    from kubernetes_asyncio import client, config

    try:
        contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
    except Exception as exc:  # missing file, not YAML: say which file, never its content
        raise ProfileCheckFailed(f"cannot read {kubeconfig} ({type(exc).__name__})") from None
    if context not in {c.get("name") for c in contexts or ()}:
        raise ProfileCheckFailed(f"no context {context!r} in {kubeconfig}")
    cfg = client.Configuration()
    try:
        await config.load_kube_config(config_file=kubeconfig, context=context,
                                      client_configuration=cfg, persist_config=False)
    except Exception as exc:
        raise ProfileCheckFailed(f"context {context!r} of {kubeconfig} is not usable "
                                 f"({type(exc).__name__})") from None
    api_client = client.ApiClient(configuration=cfg)
    try:
        role = await client.RbacAuthorizationV1Api(api_client).read_cluster_role(
            manifests.IMPERSONATOR, _request_timeout=30)
    except Exception as exc:
        status = getattr(exc, "status", None)
        if status == 404:
            return False, None
        why = f"HTTP {status}" if status else type(exc).__name__
        raise ProfileCheckFailed(f"reading ClusterRole {manifests.IMPERSONATOR} through "
                                 f"context {context!r} failed ({why})") from None
    finally:
        await api_client.close()
    rules = api_client.sanitize_for_serialization(role).get("rules") or []
    return True, manifests.profile_of(rules)


async def _profile_refusal(args: argparse.Namespace) -> str | None:
    """Why the manifests must not be printed (None: they may). See the module docstring."""
    kubeconfig = args.managed_kubeconfig or _kubeconfig_path(args.kubeconfig)
    context = args.managed_context or args.name
    try:
        exists, current = await installed_profile(kubeconfig, context)
    except ProfileCheckFailed as exc:
        if args.force:
            print(f"hubproxy cluster add: not checking the agent's profile on {args.name}: "
                  f"{exc} (--force)", file=sys.stderr)
            return None
        return (f"cannot check which agent profile cluster {args.name} has: {exc}; give "
                "--managed-context or --managed-kubeconfig, or --force to print the manifests "
                "without checking")
    if not exists or current == args.profile:
        return None
    what = (f"the {current} agent profile" if current is not None else
            "rules of no hubproxy profile (edited by hand?)")
    if args.force:
        print(f"hubproxy cluster add: {args.name} has {what} in ClusterRole "
              f"{manifests.IMPERSONATOR}; these manifests replace it with the {args.profile} "
              "profile (--force)", file=sys.stderr)
        return None
    keep = f"give --profile {current} to keep it, or " if current is not None else ""
    return (f"cluster {args.name} has {what} in ClusterRole {manifests.IMPERSONATOR}; the "
            f"{args.profile} manifests would replace it: {keep}--force to replace it")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


async def _add(args: argparse.Namespace, store: RecordStore) -> int:
    found = await store.get(args.name)
    if found is not None and found[0].state == JOINED:
        print(f"hubproxy cluster add: {args.name} has joined already; `hubproxy cluster remove "
              f"{args.name}` first to join it anew", file=sys.stderr)
        return 1
    refusal = await _profile_refusal(args)
    if refusal is not None:
        print(f"hubproxy cluster add: {refusal}", file=sys.stderr)
        return 1
    if args.hub_ca:
        with open(args.hub_ca) as f:
            hub_ca = f.read()
    else:
        from cryptography.hazmat.primitives import serialization

        hub_ca = (await store.read_ca(args.ca_secret)).cert.public_bytes(
            serialization.Encoding.PEM).decode()
    token = new_token(args.name)
    expires = _now() + datetime.timedelta(seconds=args.ttl)
    previous = found[0] if found else None
    record = ClusterRecord(args.name, PENDING, token_hash(token), expires,
                           accept_from=previous.accept_from if previous else None)
    await store.put(record, found[1] if found else None)
    audit.emit("cluster_add", request_id=secrets.token_hex(8), cluster=args.name,
               token_expires=rfc3339(expires), profile=args.profile)
    print(f"# hubproxy: join token for cluster {args.name}, single use, valid until "
          f"{rfc3339(expires)}.\n# Apply to the managed cluster: ... | kubectl --context "
          f"{args.name} apply -f -", flush=True)
    print(manifests.render(manifests.agent_manifests(
        cluster=args.name, hub=args.hub, token=token, hub_ca_pem=hub_ca, image=args.image,
        hub_server_name=args.hub_server_name, replicas=args.replicas,
        profile=args.profile)), end="")
    return 0


async def _list(store: RecordStore) -> int:
    records = await store.list()
    print(f"{'CLUSTER':<30} {'STATE':<8} {'TOKEN EXPIRES':<21} CERTIFICATE EXPIRES")
    for r in records:
        print(f"{r.cluster:<30} {r.state:<8} {rfc3339(r.token_expires) or '-':<21} "
              f"{rfc3339(r.certificate_expires) or '-'}")
    return 0


async def _remove(args: argparse.Namespace, store: RecordStore) -> int:
    for _ in range(5):
        found = await store.get(args.name)
        if found is None:
            print(f"hubproxy cluster remove: no cluster {args.name} (it did not join with "
                  "hubproxy cluster add)", file=sys.stderr)
            return 1
        record, version = found
        revoked = ClusterRecord(record.cluster, REVOKED, accept_from=record.accept_from,
                                certificate_expires=record.certificate_expires)
        try:
            await store.put(revoked, version)
        except Conflict:
            continue
        audit.emit("cluster_remove", request_id=secrets.token_hex(8), cluster=args.name,
                   previous_state=record.state)
        print(f"cluster {args.name} removed: its sessions close within the gateways' "
              "--join-poll-interval", file=sys.stderr)
        return 0
    print("hubproxy cluster remove: the record keeps changing; retry", file=sys.stderr)
    return 1


async def _main(args: argparse.Namespace) -> int:
    api_client = await _api_client(args.kubeconfig)
    try:
        store = RecordStore(api_client, args.namespace)
        if args.action == "add":
            return await _add(args, store)
        if args.action == "list":
            return await _list(store)
        return await _remove(args, store)
    finally:
        await api_client.close()


def run(args: argparse.Namespace) -> int:
    audit.install_writer(audit.AuditWriter(sys.stderr))
    try:
        return asyncio.run(_main(args))
    except CASecretError as exc:
        print(f"hubproxy cluster {args.action}: {exc}; or give --hub-ca", file=sys.stderr)
        return 1
    except Conflict:
        print(f"hubproxy cluster {args.action}: someone else changed the record; retry",
              file=sys.stderr)
        return 1
    except Exception as exc:
        status = getattr(exc, "status", None)
        if status is None:
            raise
        print(f"hubproxy cluster {args.action}: the hub answered HTTP {status}",
              file=sys.stderr)
        return 1
    finally:
        audit.install_writer(None)
