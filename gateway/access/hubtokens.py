"""hubproxy-creds' modes that ask the hub API for the token (kubernetes-asyncio).

* ``--managed-serviceaccount=NAME`` (OCM ``cp-creds``): the token in Secret
  ``<clusterName>-NAME`` (key ``token``) of the plugin's own namespace;
* ``--token-request-audience=AUD``: a fresh token for the plugin's service account (or
  ``--service-account``) from TokenRequest.

Kept apart from :mod:`gateway.access.creds` so that the default mode, which only reads a file,
never imports an HTTP client: each credential refresh is a process start. A hub credential
that cannot be used (a missing or malformed ``--hub-kubeconfig``, none outside a pod) is a
:class:`HubUnusable` (exit 2, as every program's start-up error); a refusal or an unreachable
hub is a :class:`CredentialError` (exit 1). Messages never contain a token.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from gateway.access.execcredential import (
    SERVICEACCOUNT_DIR,
    CredentialError,
    ExecRequest,
    exec_credential,
    read_token_file,
    token_claims,
    token_expiry,
)
from gateway.ops import startup


class HubUnusable(CredentialError):
    """No usable hub credential: a start-up error, one line naming the flag."""

    exit_code = startup.EXIT_CODE


def credential(args: argparse.Namespace, request: ExecRequest) -> dict[str, object]:
    """The ExecCredential for ``--managed-serviceaccount`` or ``--token-request-audience``."""
    try:
        check_hub_kubeconfig(args.hub_kubeconfig, os.environ)
        return asyncio.run(_credential(args, request))
    except startup.StartupError as exc:
        raise HubUnusable(str(exc)) from None


async def _credential(args: argparse.Namespace, request: ExecRequest) -> dict[str, object]:
    if args.managed_serviceaccount:
        token = await managed_serviceaccount_token(
            request.cluster_name, args.managed_serviceaccount, args.hub_kubeconfig
        )
        return exec_credential(request.api_version, token, token_expiry(token))
    token, expires = await requested_token(
        args.token_request_audience,
        args.token_expiration_seconds,
        args.token_file,
        args.service_account,
        args.hub_kubeconfig,
    )
    return exec_credential(request.api_version, token, expires)


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
