"""Print a kubeconfig whose clusters go through the gateway.

``hubproxy kubeconfig --server https://hub.example:9092 --ca front-ca.crt --cluster c1 --cluster c2
(--token T | --token-file F | --exec)`` prints YAML with one cluster and one context per managed
cluster (``server: <URL>/<cluster>``, the CA embedded as ``certificate-authority-data``), the
first cluster as current context, and one user:

* ``--token``: a static bearer token (the gateway checks it on the hub with TokenReview);
* ``--token-file``: ``tokenFile`` pointing at a file that client-go re-reads (rotating SA tokens);
* ``--exec``: the ``hubproxy-creds`` exec plugin (``client.authentication.k8s.io/v1``,
  ``provideClusterInfo: true``), and each cluster carries the exec extension
  ``{"clusterName": "<cluster>"}`` so the plugin knows which cluster it is asked for.

With ``--output FILE`` the kubeconfig is written with mode 0600 (it may hold a token).
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from cryptography import x509

from certs.identity import validate_cluster_name

EXEC_API_VERSION = "client.authentication.k8s.io/v1"
EXEC_EXTENSION = "client.authentication.k8s.io/exec"
DEFAULT_EXEC_COMMAND = "hubproxy-creds"
USER_NAME = "hubproxy"


def cluster_server(server: str, cluster: str) -> str:
    """``https://host:9092`` (or with a trailing path) + ``/<cluster>``."""
    return server.rstrip("/") + "/" + validate_cluster_name(cluster)


def build_kubeconfig(
    server: str,
    ca_pem: bytes,
    clusters: list[str],
    *,
    token: str | None = None,
    token_file: str | None = None,
    exec_command: str | None = None,
    exec_args: list[str] | None = None,
) -> dict[str, Any]:
    """The kubeconfig as a dict. Exactly one of token / token_file / exec_command is given."""
    if sum(x is not None for x in (token, token_file, exec_command)) != 1:
        raise ValueError("exactly one of --token, --token-file or --exec is required")
    _check_server(server)
    if not clusters:
        raise ValueError("at least one --cluster is required")
    names = list(dict.fromkeys(validate_cluster_name(c) for c in clusters))
    ca_data = base64.b64encode(ca_pem).decode("ascii")

    kube_clusters = []
    for name in names:
        cluster: dict[str, Any] = {
            "server": cluster_server(server, name),
            "certificate-authority-data": ca_data,
        }
        if exec_command is not None:
            cluster["extensions"] = [
                {"name": EXEC_EXTENSION, "extension": {"clusterName": name}}
            ]
        kube_clusters.append({"name": name, "cluster": cluster})

    user: dict[str, Any]
    if token is not None:
        user = {"token": token}
    elif token_file is not None:
        user = {"tokenFile": token_file}
    else:
        user = {
            "exec": {
                "apiVersion": EXEC_API_VERSION,
                "command": exec_command,
                "args": list(exec_args or []),
                "provideClusterInfo": True,
                "interactiveMode": "Never",
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": kube_clusters,
        "users": [{"name": USER_NAME, "user": user}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": USER_NAME}} for name in names
        ],
        "current-context": names[0],
    }


def _check_server(server: str) -> None:
    parts = urlsplit(server)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"--server must be an https:// URL with a host, got {server!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"--server must not have a query or fragment, got {server!r}")


def _read_ca(path: Path) -> bytes:
    data = path.read_bytes()
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise ValueError(f"--ca {path}: no PEM certificate found") from exc
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, metavar="URL",
                        help="gateway front door, e.g. https://hubproxy.example.com:9092")
    parser.add_argument("--ca", required=True, type=Path, metavar="FILE",
                        help="CA bundle users trust for the gateway (front-ca/ca.crt)")
    parser.add_argument("--cluster", action="append", default=[], metavar="NAME",
                        help="managed cluster (repeatable); the first is the current context")
    auth = parser.add_mutually_exclusive_group(required=True)
    auth.add_argument("--token", metavar="T", help="static hub bearer token")
    auth.add_argument("--token-file", metavar="F", help="file holding a hub token (re-read)")
    auth.add_argument("--exec", action="store_true",
                      help="use the hubproxy-creds exec credential plugin")
    parser.add_argument("--exec-command", default=DEFAULT_EXEC_COMMAND, metavar="CMD",
                        help=f"exec plugin command (default {DEFAULT_EXEC_COMMAND})")
    parser.add_argument("--exec-arg", action="append", default=[], metavar="ARG",
                        help="argument for the exec plugin (repeatable)")
    parser.add_argument("--output", "-o", type=Path, metavar="FILE",
                        help="write to FILE (mode 0600) instead of stdout")


def run(args: argparse.Namespace) -> int:
    try:
        config = build_kubeconfig(
            args.server,
            _read_ca(args.ca),
            list(args.cluster or []),
            token=args.token,
            token_file=(os.path.abspath(args.token_file) if args.token_file else None),
            exec_command=args.exec_command if args.exec else None,
            exec_args=list(args.exec_arg or []),
        )
    except (ValueError, OSError) as exc:
        print(f"hubproxy kubeconfig: {exc}", file=sys.stderr)
        return 1
    text = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)
    return 0
