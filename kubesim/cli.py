"""Run kubesim, a kube-apiserver stand-in for tests and demos (not a production component).

    hubproxy kubesim --listen 127.0.0.1:6443 --cert-dir /tmp/sim --token-auth-file tokens.csv \\
        --rbac-file rbac.yaml --crd clusterprofiles.yaml --name cluster1

Prints `kubesim ready on https://HOST:PORT` once it listens; SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from kubesim.auth import parse_token_file
from kubesim.server import Config, KubeSim, start
from kubesim.testing import load_yaml_objects
from kubesim.tls import ensure_serving_cert, server_context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:6443", help="HOST:PORT to serve HTTPS on")
    parser.add_argument("--tls-cert-file", help="serving certificate (PEM)")
    parser.add_argument("--tls-private-key-file", help="serving key (PEM)")
    parser.add_argument(
        "--cert-dir",
        help="directory for a self-generated CA (ca.crt) and serving "
        "certificate, used when --tls-cert-file is not given",
    )
    parser.add_argument(
        "--client-ca-file", help="CA for optional x509 client certificates (CN=user, O=groups)"
    )
    parser.add_argument(
        "--token-auth-file", help='kube-apiserver token CSV: token,user,uid,"group1,group2"'
    )
    parser.add_argument(
        "--rbac-file", help="YAML with Roles/ClusterRoles/(Cluster)RoleBindings to load at start"
    )
    parser.add_argument(
        "--crd", action="append", default=[], help="CustomResourceDefinition YAML (repeatable)"
    )
    parser.add_argument(
        "--api-audiences",
        action="append",
        default=[],
        help="audiences of the API (repeatable); default the in-cluster issuer URL",
    )
    parser.add_argument(
        "--name", default="kubesim", help="cluster name, shown in /version gitVersion"
    )


def _config(args: argparse.Namespace) -> Config:
    config = Config(name=args.name)
    if args.token_auth_file:
        config.static_users = parse_token_file(Path(args.token_auth_file).read_text())
    if args.rbac_file:
        config.rbac = load_yaml_objects(Path(args.rbac_file))
    for crd in args.crd:
        config.crds.extend(load_yaml_objects(Path(crd)))
    if args.api_audiences:
        config.api_audiences = tuple(args.api_audiences)
    return config


async def serve(args: argparse.Namespace) -> int:
    host, _, port_text = args.listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if args.tls_cert_file and args.tls_private_key_file:
        cert, key = args.tls_cert_file, args.tls_private_key_file
    else:
        if not args.cert_dir:
            print(
                "kubesim: give --tls-cert-file/--tls-private-key-file or --cert-dir",
                file=sys.stderr,
            )
            return 2
        files = ensure_serving_cert(args.cert_dir, (host,))
        cert, key = files.cert_file, files.key_file
    sim = KubeSim(_config(args))
    runner = await start(sim, host, int(port_text), server_context(cert, key, args.client_ca_file))
    print(f"kubesim ready on https://{sim.server_address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(args))
    return uvloop.run(serve(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubesim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
