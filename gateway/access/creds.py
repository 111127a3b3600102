"""hubproxy-creds: a client-go exec credential plugin for clusters reached through the gateway.

client-go (kubectl, controllers, kubernetes-asyncio) runs this with ``KUBERNETES_EXEC_INFO``
holding an ``ExecCredential`` (``client.authentication.k8s.io/v1`` or ``v1beta1``). The kubeconfig
or ClusterProfile access provider must set ``provideClusterInfo: true`` and carry the exec
extension ``{"clusterName": "<cluster>"}``, which arrives as ``spec.cluster.config``.

Modes:

* default: answer with the caller's own **hub** service-account token (``--token-file``, by
  default the projected token of the pod), or a fresh one minted with TokenRequest
  (``--token-request-audience``). The gateway verifies it on the hub and impersonates the caller
  on the managed cluster; the token never reaches the managed cluster.
* ``--managed-serviceaccount=NAME``: compatible with OCM's ``cp-creds``: answer with the token in
  Secret ``<clusterName>-<NAME>`` (key ``token``) of the plugin's own namespace, for gateways that
  run with ``--token-passthrough``.

Contract: the ExecCredential goes to stdout with the input's apiVersion and, when the token is a
JWT with ``exp``, an ``expirationTimestamp``. Any failure prints one line to stderr and exits 1;
usage errors, and a hub kubeconfig that cannot be used (missing, not YAML, none outside a pod),
exit 2. A token is never written anywhere but stdout.

Each credential refresh starts this program, so the default mode imports only the standard
library (:mod:`gateway.access.execcredential`); the modes that call the hub API live in
:mod:`gateway.access.hubtokens` and are imported only when asked for. The static build,
``hubproxy-plugin`` (deploy/plugin), leaves them out and says so; ``--install`` copies that
build for an initContainer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.access.execcredential import (
    DEFAULT_TOKEN_FILE,
    CredentialError,
    ExecRequest,
    exec_credential,
    parse_exec_info,
    read_token_file,
    token_expiry,
)

__all__ = ["CredentialError", "build_parser", "exec_credential", "main", "parse_exec_info",
           "token_expiry"]

# Set while we run so that a kubeconfig whose user is this very plugin cannot loop back into it.
REENTRY_GUARD = "HUBPROXY_CREDS_ACTIVE"
# The static build (deploy/plugin: PyInstaller, then staticx) runs from an unpacked copy of
# itself; staticx names the executable that was started here.
STATIC_EXECUTABLE_ENV = "STATICX_PROG_PATH"


class _PrintVersion(argparse.Action):
    """--version, reading the package metadata only when asked (it costs a start-up)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from gateway.ops.version import version

        print(f"hubproxy-creds {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hubproxy-creds",
        description=__doc__.split("\n\n")[0],
        epilog=(
            "Use as a kubeconfig user: exec: {apiVersion: client.authentication.k8s.io/v1,"
            " command: hubproxy-creds, provideClusterInfo: true, interactiveMode: Never}, with"
            ' the cluster extension client.authentication.k8s.io/exec {"clusterName": NAME}.'
        ),
    )
    parser.add_argument("--version", action=_PrintVersion, nargs=0,
                        help="print the version and exit")
    parser.add_argument(
        "--cluster",
        metavar="NAME",
        help="the cluster's name when the client cannot send cluster information (Argo CD"
        " before 3.5: its execProviderConfig has no provideClusterInfo); what the client sends"
        " wins",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        default=DEFAULT_TOKEN_FILE,
        help="hub service-account token to present (default: %(default)s)",
    )
    parser.add_argument(
        "--token-request-audience",
        metavar="AUDIENCE",
        help="mint a fresh token for this audience with TokenRequest instead of reading one",
    )
    parser.add_argument(
        "--token-expiration-seconds",
        type=int,
        default=3600,
        help="lifetime asked of TokenRequest (default: %(default)s)",
    )
    parser.add_argument(
        "--service-account",
        metavar="NAMESPACE/NAME",
        help="service account for TokenRequest (default: the one named in --token-file)",
    )
    parser.add_argument(
        "--managed-serviceaccount",
        metavar="NAME",
        help="OCM cp-creds mode: present the token in Secret <clusterName>-NAME of this namespace"
        " (for gateways running with --token-passthrough)",
    )
    parser.add_argument(
        "--install",
        metavar="FILE",
        type=Path,
        help="static build (hubproxy-plugin) only: copy this executable to FILE (mode 0555) and"
        " exit; for an initContainer that fills a volume where the plugin image cannot be"
        " mounted as an image volume",
    )
    parser.add_argument(
        "--hub-kubeconfig",
        default=os.environ.get("HUBPROXY_HUB_KUBECONFIG"),
        help="kubeconfig for the hub API (default: in-cluster, then $KUBECONFIG)",
    )
    return parser


def hub_mode(args: argparse.Namespace) -> bool:
    """Whether the token comes from the hub API rather than from --token-file."""
    return bool(args.managed_serviceaccount or args.token_request_audience)


def credential(args: argparse.Namespace, request: ExecRequest) -> dict[str, object]:
    if hub_mode(args):
        # Only these modes talk to the hub, so only they import its client (kubernetes-asyncio,
        # aiohttp, ssl): the default mode is a process start per credential refresh, and the
        # static plugin (deploy/plugin) leaves that client out.
        try:
            from gateway.access import hubtokens
        except ImportError:
            raise CredentialError(
                "--managed-serviceaccount and --token-request-audience need the hub API client,"
                " which this build of hubproxy-creds leaves out: use the Python package"
                " (pip install hubproxy) or the hubproxy image"
            ) from None
        return hubtokens.credential(args, request)
    token = read_token_file(args.token_file)
    return exec_credential(request.api_version, token, token_expiry(token))


def install_static_executable(target: Path) -> None:
    """Copy the running static executable to ``target``, atomically, mode 0555."""
    source = os.environ.get(STATIC_EXECUTABLE_ENV)
    if not source:
        raise CredentialError("--install copies the static build (hubproxy-plugin) only")
    import shutil

    partial = target.with_name(f".{target.name}.partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, partial)
        partial.chmod(0o555)
        partial.replace(target)
    except OSError as exc:
        raise CredentialError(f"cannot install {target}: {exc.strerror}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.install is not None:
        try:
            install_static_executable(args.install)
        except CredentialError as exc:
            print(f"hubproxy-creds: {exc}", file=sys.stderr)
            return exc.exit_code
        print(f"hubproxy-creds: installed {args.install}")
        return 0
    if os.environ.get(REENTRY_GUARD):
        print(
            "hubproxy-creds: called recursively (the hub kubeconfig uses hubproxy-creds itself);"
            " pass --hub-kubeconfig with a direct hub credential",
            file=sys.stderr,
        )
        return 1
    os.environ[REENTRY_GUARD] = "1"
    try:
        answer = credential(args, parse_exec_info(os.environ.get("KUBERNETES_EXEC_INFO"),
                                                  args.cluster))
    except CredentialError as exc:
        print(f"hubproxy-creds: {exc}", file=sys.stderr)
        return exc.exit_code
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
