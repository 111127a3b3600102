"""Build a kubernetes-asyncio client configuration from a ClusterProfile and a provider file.

This is the Python counterpart of cluster-inventory-api's ``pkg/access``: the provider file is
the upstream JSON format ``{"providers": [{"name": ..., "execConfig": {...}}]}``; the first
provider *in file order* that the ClusterProfile lists (``status.accessProviders``, falling back
to the deprecated ``status.credentialProviders``; an access provider wins over a credential
provider of the same name) is used. The exec plugin receives the cluster information client-go
would give it (``provideClusterInfo``), including the ``client.authentication.k8s.io/exec``
extension as ``spec.cluster.config``.

kubernetes-asyncio's own exec support never passes cluster information, so the plugin is run
here. Each call deep-copies the provider's exec configuration: nothing one ClusterProfile adds
(additional args or env from its extensions) leaks into the next.

Example::

    providers = load_providers("/etc/hubproxy/providers.json")
    profile = await custom_api.get_namespaced_custom_object(
        "multicluster.x-k8s.io", "v1alpha1", "fleet", "clusterprofiles", "cluster1")
    configuration = await build_configuration(profile, providers)
    async with ApiClient(configuration) as api:
        pods = await CoreV1Api(api).list_namespaced_pod("default")
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

EXEC_EXTENSION = "client.authentication.k8s.io/exec"
ADDITIONAL_ARGS_EXTENSION = "clusterprofiles.multicluster.x-k8s.io/exec/additional-args"
ADDITIONAL_ENVS_EXTENSION = "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs"
# Refresh a credential this long before it expires, so no request goes out with a dying token.
EXPIRY_MARGIN_SECONDS = 30.0


class AccessError(Exception):
    """The ClusterProfile or provider file cannot produce a working configuration."""


@dataclass(frozen=True)
class Provider:
    name: str
    exec_config: Mapping[str, Any]
    cli_args_policy: str = "Ignore"
    env_vars_policy: str = "Ignore"


def parse_providers(document: Mapping[str, Any]) -> list[Provider]:
    providers = document.get("providers")
    if not isinstance(providers, list):
        raise AccessError('provider file must hold {"providers": [...]}')
    parsed = []
    for index, entry in enumerate(providers):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise AccessError(f"providers[{index}] needs a string name")
        exec_config = entry.get("execConfig")
        if not isinstance(exec_config, dict) or not exec_config.get("command"):
            raise AccessError(f"providers[{index}] ({entry['name']}) needs execConfig.command")
        parsed.append(
            Provider(
                entry["name"],
                exec_config,
                entry.get("profileSourcedCLIArgsPolicy") or "Ignore",
                entry.get("profileSourcedEnvVarsPolicy") or "Ignore",
            )
        )
    return parsed


def load_providers(path: str | os.PathLike[str]) -> list[Provider]:
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AccessError(f"cannot read provider file {path}: {exc}") from None
    return parse_providers(document)


def select_provider(
    profile: Mapping[str, Any], providers: Sequence[Provider]
) -> tuple[Provider, Mapping[str, Any]]:
    """The first provider in file order that the profile offers, and that entry's cluster."""
    status = profile.get("status") or {}
    offered: dict[str, Mapping[str, Any]] = {}
    for key in ("credentialProviders", "accessProviders"):  # later wins, as upstream
        for entry in status.get(key) or []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                offered[entry["name"]] = entry
    name = (profile.get("metadata") or {}).get("name", "?")
    for provider in providers:
        entry = offered.get(provider.name)
        if entry is not None:
            cluster = entry.get("cluster")
            if not isinstance(cluster, dict) or not cluster.get("server"):
                raise AccessError(f"ClusterProfile {name}: provider {provider.name} has no server")
            return provider, cluster
    raise AccessError(f"no matching access provider found for ClusterProfile {name!r}")


def _extensions(cluster: Mapping[str, Any]) -> dict[str, Any]:
    return {
        ext["name"]: ext.get("extension")
        for ext in cluster.get("extensions") or []
        if isinstance(ext, dict) and isinstance(ext.get("name"), str)
    }


def exec_config_for(provider: Provider, cluster: Mapping[str, Any]) -> dict[str, Any]:
    """A private copy of the provider's exec config with the profile's extensions applied."""
    config = copy.deepcopy(dict(provider.exec_config))
    extensions = _extensions(cluster)
    if ADDITIONAL_ARGS_EXTENSION in extensions and provider.cli_args_policy != "Ignore":
        if provider.cli_args_policy != "Append":
            raise AccessError(
                f"unsupported profileSourcedCLIArgsPolicy {provider.cli_args_policy!r}"
            )
        extra = _as_data(extensions[ADDITIONAL_ARGS_EXTENSION])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise AccessError(f"{ADDITIONAL_ARGS_EXTENSION} must be a list of strings")
        config["args"] = [*(config.get("args") or []), *extra]
    policy = provider.env_vars_policy
    if ADDITIONAL_ENVS_EXTENSION in extensions and policy != "Ignore":
        if policy not in ("AppendIfNotExists", "Replace"):
            raise AccessError(f"unsupported profileSourcedEnvVarsPolicy {policy!r}")
        extra_env = _as_data(extensions[ADDITIONAL_ENVS_EXTENSION])
        if not isinstance(extra_env, dict):
            raise AccessError(f"{ADDITIONAL_ENVS_EXTENSION} must be a map of strings")
        merged = {e["name"]: e["value"] for e in config.get("env") or []}
        for key, value in extra_env.items():
            if policy == "Replace" or key not in merged:
                merged[str(key)] = str(value)
        config["env"] = [{"name": k, "value": v} for k, v in merged.items()]
    return config


def _as_data(extension: Any) -> Any:
    # An extension is a RawExtension: already-decoded JSON, or a YAML/JSON string.
    return yaml.safe_load(extension) if isinstance(extension, str) else extension


def exec_info(api_version: str, cluster: Mapping[str, Any]) -> dict[str, Any]:
    """The KUBERNETES_EXEC_INFO document client-go writes for provideClusterInfo: true."""
    info_cluster: dict[str, Any] = {"server": cluster["server"]}
    for key in (
        "tls-server-name",
        "insecure-skip-tls-verify",
        "certificate-authority-data",
        "proxy-url",
        "disable-compression",
    ):
        if cluster.get(key):
            info_cluster[key] = cluster[key]
    extension = _extensions(cluster).get(EXEC_EXTENSION)
    if extension is not None:
        info_cluster["config"] = _as_data(extension)
    return {
        "kind": "ExecCredential",
        "apiVersion": api_version,
        "spec": {"cluster": info_cluster, "interactive": False},
    }


@dataclass
class ExecCredentialSource:
    """Runs the exec plugin and keeps its token until shortly before it expires."""

    exec_config: Mapping[str, Any]
    cluster: Mapping[str, Any]
    token: str | None = None
    expires_at: float | None = None  # time.time()
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def _fresh(self) -> bool:
        if self.token is None:
            return False
        return self.expires_at is None or time.time() < self.expires_at - EXPIRY_MARGIN_SECONDS

    async def get_token(self) -> str:
        async with self._lock:
            if not self._fresh():
                self.token, self.expires_at = await self._run()
            assert self.token is not None
            return self.token

    async def _run(self) -> tuple[str, float | None]:
        api_version = self.exec_config.get("apiVersion", "client.authentication.k8s.io/v1")
        env = dict(os.environ)
        env.update({e["name"]: e["value"] for e in self.exec_config.get("env") or []})
        info = exec_info(api_version, self.cluster) if self.exec_config.get(
            "provideClusterInfo"
        ) else {"kind": "ExecCredential", "apiVersion": api_version, "spec": {"interactive": False}}
        env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
        command = [str(self.exec_config["command"]), *map(str, self.exec_config.get("args") or [])]
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise AccessError(f"exec plugin {command[0]!r} cannot run: {exc.strerror}") from None
        stdout, stderr = await proc.communicate()
        if proc.returncode != 0:
            # stderr is the plugin's own one-line message; stdout may hold a token: never shown.
            raise AccessError(
                f"exec plugin {command[0]!r} exited {proc.returncode}: "
                f"{stderr.decode(errors='replace').strip()[:500]}"
            )
        try:
            answer = json.loads(stdout)
            status = answer["status"]
            token = status["token"]
        except (ValueError, KeyError, TypeError):
            raise AccessError(
                f"exec plugin {command[0]!r} printed no ExecCredential token"
            ) from None
        if answer.get("apiVersion") != api_version:
            raise AccessError(
                f"exec plugin answered apiVersion {answer.get('apiVersion')!r},"
                f" asked {api_version!r}"
            )
        expires = status.get("expirationTimestamp")
        expires_at = (
            datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp() if expires else None
        )
        return token, expires_at


def _ca_file(ca_data_b64: str) -> str:
    import base64

    pem = base64.b64decode(ca_data_b64)
    directory = Path(tempfile.gettempdir()) / f"hubproxy-ca-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / (hashlib.sha256(pem).hexdigest()[:32] + ".crt")
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pem)
        tmp.replace(path)
    return str(path)


async def build_configuration(profile: Mapping[str, Any], providers: Sequence[Provider]):
    """A kubernetes_asyncio ``Configuration`` reaching the profile's cluster; fetches a token."""
    from kubernetes_asyncio import client

    provider, cluster = select_provider(profile, providers)
    source = ExecCredentialSource(exec_config_for(provider, cluster), cluster)
    configuration = client.Configuration(host=cluster["server"].rstrip("/"))
    if cluster.get("certificate-authority-data"):
        configuration.ssl_ca_cert = _ca_file(cluster["certificate-authority-data"])
    if cluster.get("insecure-skip-tls-verify"):
        configuration.verify_ssl = False
    if cluster.get("tls-server-name"):
        configuration.tls_server_name = cluster["tls-server-name"]
    if cluster.get("proxy-url"):
        configuration.proxy = cluster["proxy-url"]
    configuration.api_key_prefix["BearerToken"] = "Bearer"
    configuration.api_key["BearerToken"] = await source.get_token()

    async def refresh(config: Any) -> None:
        config.api_key["BearerToken"] = await source.get_token()

    configuration.refresh_api_key_hook = refresh
    return configuration
