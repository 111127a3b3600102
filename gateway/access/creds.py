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
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gateway.ops import startup
from gateway.ops.version import version

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_TOKEN_FILE = SERVICEACCOUNT_DIR / "token"
# Set while we run so that a kubeconfig whose user is this very plugin cannot loop back into it.
REENTRY_GUARD = "HUBPROXY_CREDS_ACTIVE"

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")


class CredentialError(Exception):
    """A failure to report on stderr (exit 1). Messages never contain a token."""


@dataclass(frozen=True)
class ExecRequest:
    """What the plugin needs from ``KUBERNETES_EXEC_INFO``."""

    api_version: str
    cluster_name: str
    server: str


def parse_exec_info(raw: str | None, cluster_name: str | None = None) -> ExecRequest:
    """Validate an ExecCredential input document as client-go writes it.

    ``cluster_name`` (``--cluster``) stands in for the cluster information when the client
    cannot send it: Argo CD's ``execProviderConfig`` has no ``provideClusterInfo``. What the
    client sends, when it sends it, wins.
    """
    if raw is None or not raw.strip():
        raise CredentialError(
            "KUBERNETES_EXEC_INFO is not set: run hubproxy-creds as a client-go exec plugin"
            " with provideClusterInfo: true"
        )
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CredentialError(f"KUBERNETES_EXEC_INFO is not valid JSON: {exc.msg}") from None
    if not isinstance(document, dict):
        raise CredentialError("KUBERNETES_EXEC_INFO must be a JSON object (an ExecCredential)")
    if document.get("kind") != "ExecCredential":
        raise CredentialError(
            f"KUBERNETES_EXEC_INFO has kind {document.get('kind')!r}, expected ExecCredential"
        )
    api_version = document.get("apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise CredentialError(
            f"unsupported ExecCredential apiVersion {api_version!r};"
            f" supported: {', '.join(EXEC_API_VERSIONS)}"
        )
    spec = document.get("spec")
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) and cluster_name is not None:
        cluster = {"config": {"clusterName": cluster_name}}
    if not isinstance(cluster, dict):
        raise CredentialError(
            "no cluster information in KUBERNETES_EXEC_INFO: set provideClusterInfo: true"
            " in the exec configuration (or pass --cluster NAME)"
        )
    config = cluster.get("config")
    cluster_name = config.get("clusterName") if isinstance(config, dict) else None
    if not isinstance(cluster_name, str) or not cluster_name:
        raise CredentialError(
            "spec.cluster.config.clusterName is missing: add the exec extension"
            ' client.authentication.k8s.io/exec {"clusterName": "<cluster>"} to the cluster'
        )
    if len(cluster_name) > 253 or not _DNS1123_SUBDOMAIN.match(cluster_name):
        raise CredentialError(
            f"clusterName {cluster_name!r} is not a valid DNS-1123 subdomain"
        )
    server = cluster.get("server")
    return ExecRequest(api_version, cluster_name, server if isinstance(server, str) else "")


def token_expiry(token: str) -> datetime | None:
    """The ``exp`` claim of a JWT, unverified (the issuer verifies); None for opaque tokens."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    try:
        return datetime.fromtimestamp(exp, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def token_claims(token: str) -> dict[str, object]:
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def exec_credential(api_version: str, token: str, expires: datetime | None) -> dict[str, object]:
    status: dict[str, str] = {"token": token}
    if expires is not None:
        status["expirationTimestamp"] = expires.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": api_version, "kind": "ExecCredential", "status": status}


def read_token_file(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise CredentialError(f"cannot read token file {path}: {exc.strerror}") from None
    if not token:
        raise CredentialError(f"token file {path} is empty")
    return token


def own_namespace(
    environ: Mapping[str, str], namespace_file: Path, kubeconfig_namespace: str | None
) -> str:
    """NAMESPACE, then the service-account namespace file, then the kubeconfig context."""
    if environ.get("NAMESPACE"):
        return environ["NAMESPACE"]
    try:
        from_file = namespace_file.read_text().strip()
    except OSError:
        from_file = ""
    if from_file:
        return from_file
    return kubeconfig_namespace or "default"


def secret_token(secret_data: Mapping[str, str] | None, namespace: str, name: str) -> str:
    if not secret_data or "token" not in secret_data:
        raise CredentialError(f"Secret {namespace}/{name} has no key 'token'")
    try:
        token = base64.b64decode(secret_data["token"], validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        raise CredentialError(
            f"Secret {namespace}/{name} key 'token' is not valid base64 text"
        ) from None
    if not token:
        raise CredentialError(f"Secret {namespace}/{name} key 'token' is empty")
    return token


# --- talking to the hub (only the TokenRequest and managed-serviceaccount modes need it) ---


def check_hub_kubeconfig(kubeconfig: str | None, environ: Mapping[str, str]) -> None:
    """Fail before any hub call, with one line naming the flag, when no hub credential can be
    loaded: a missing or malformed --hub-kubeconfig, or none outside a pod."""
    if kubeconfig:
        startup.read_kubeconfig(kubeconfig, "--hub-kubeconfig")
        return
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return
    paths = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    fallback = paths[0] if paths else str(Path.home() / ".kube" / "config")
    if not os.path.exists(fallback):
        raise startup.StartupError(
            f"not running in a pod and no kubeconfig at {fallback}: give --hub-kubeconfig FILE"
        )
    startup.read_kubeconfig(fallback, "--hub-kubeconfig (defaulted from $KUBECONFIG)"
                            if paths else "--hub-kubeconfig (defaulted to ~/.kube/config)")


async def _hub_client(kubeconfig: str | None):  # -> (ApiClient, context namespace)
    from kubernetes_asyncio import client, config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config()
        except config.ConfigException as exc:
            raise startup.StartupError(
                f"in-cluster credential unusable ({exc}): give --hub-kubeconfig FILE"
            ) from None
        return client.ApiClient(), None
    configuration = client.Configuration()
    try:
        await config.load_kube_config(
            config_file=kubeconfig, client_configuration=configuration, persist_config=False
        )
    except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise startup.StartupError(
            f"--hub-kubeconfig {kubeconfig or '(default)'}: cannot use it ({why})"
        ) from None
    namespace = None
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        namespace = (active or {}).get("context", {}).get("namespace")
    except config.ConfigException:
        namespace = None
    return client.ApiClient(configuration), namespace


def _api_failure(what: str, exc: Exception) -> CredentialError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status:
        return CredentialError(f"{what}: the hub answered {status} {reason or ''}".rstrip())
    return CredentialError(f"{what}: cannot reach the hub API ({type(exc).__name__})")


async def managed_serviceaccount_token(
    cluster_name: str, msa_name: str, kubeconfig: str | None
) -> str:
    from kubernetes_asyncio import client

    api_client, context_namespace = await _hub_client(kubeconfig)
    namespace = own_namespace(os.environ, SERVICEACCOUNT_DIR / "namespace", context_namespace)
    secret_name = f"{cluster_name}-{msa_name}"
    async with api_client:
        try:
            secret = await client.CoreV1Api(api_client).read_namespaced_secret(
                secret_name, namespace
            )
        except client.ApiException as exc:
            if exc.status == 404:
                raise CredentialError(f"Secret {namespace}/{secret_name} not found") from None
            raise _api_failure(f"reading Secret {namespace}/{secret_name}", exc) from None
        except Exception as exc:  # connection errors of any kind
            raise _api_failure(f"reading Secret {namespace}/{secret_name}", exc) from None
    return secret_token(secret.data, namespace, secret_name)


async def requested_token(
    audience: str, expiration_seconds: int, token_file: Path, service_account: str | None,
    kubeconfig: str | None,
) -> tuple[str, datetime | None]:
    from kubernetes_asyncio import client

    if service_account:
        namespace, _, name = service_account.partition("/")
    else:
        claims = token_claims(read_token_file(token_file))
        k8s = claims.get("kubernetes.io") if isinstance(claims.get("kubernetes.io"), dict) else {}
        sa = k8s.get("serviceaccount") if isinstance(k8s, dict) else None
        namespace = str(k8s.get("namespace", "")) if isinstance(k8s, dict) else ""
        name = str(sa.get("name", "")) if isinstance(sa, dict) else ""
    if not namespace or not name:
        raise CredentialError(
            "cannot tell which service account to mint a token for:"
            " pass --service-account NAMESPACE/NAME"
        )
    api_client, _ = await _hub_client(kubeconfig)
    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[audience], expiration_seconds=expiration_seconds)
    )
    async with api_client:
        try:
            answer = await client.CoreV1Api(api_client).create_namespaced_service_account_token(
                name, namespace, body
            )
        except Exception as exc:
            raise _api_failure(f"TokenRequest for {namespace}/{name}", exc) from None
    token = answer.status.token
    expires = answer.status.expiration_timestamp or token_expiry(token)
    return token, expires


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
    parser.add_argument("--version", action="version",
                        version=f"hubproxy-creds {version()}")
    parser.add_argument(
        "--cluster",
        metavar="NAME",
        help="the cluster's name when the client cannot send cluster information (Argo CD's"
        " execProviderConfig has no provideClusterInfo); what the client sends wins",
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
        "--hub-kubeconfig",
        default=os.environ.get("HUBPROXY_HUB_KUBECONFIG"),
        help="kubeconfig for the hub API (default: in-cluster, then $KUBECONFIG)",
    )
    return parser


async def _credential(args: argparse.Namespace, request: ExecRequest) -> dict[str, object]:
    if args.managed_serviceaccount:
        token = await managed_serviceaccount_token(
            request.cluster_name, args.managed_serviceaccount, args.hub_kubeconfig
        )
        return exec_credential(request.api_version, token, token_expiry(token))
    if args.token_request_audience:
        token, expires = await requested_token(
            args.token_request_audience,
            args.token_expiration_seconds,
            args.token_file,
            args.service_account,
            args.hub_kubeconfig,
        )
        return exec_credential(request.api_version, token, expires)
    token = read_token_file(args.token_file)
    return exec_credential(request.api_version, token, token_expiry(token))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if os.environ.get(REENTRY_GUARD):
        print(
            "hubproxy-creds: called recursively (the hub kubeconfig uses hubproxy-creds itself);"
            " pass --hub-kubeconfig with a direct hub credential",
            file=sys.stderr,
        )
        return 1
    os.environ[REENTRY_GUARD] = "1"
    try:
        request = parse_exec_info(os.environ.get("KUBERNETES_EXEC_INFO"), args.cluster)
        if args.managed_serviceaccount or args.token_request_audience:
            check_hub_kubeconfig(args.hub_kubeconfig, os.environ)
        credential = asyncio.run(_credential(args, request))
    except startup.StartupError as exc:
        print(f"hubproxy-creds: {exc}", file=sys.stderr)
        return startup.EXIT_CODE
    except CredentialError as exc:
        print(f"hubproxy-creds: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(credential) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
