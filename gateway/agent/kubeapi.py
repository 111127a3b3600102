"""How the agent reaches its own kube-apiserver: address, trust, and its own credential.

Two sources, as client-go has them:

* **in-cluster**: ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` and the projected
  service-account files ``/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}``;
* **a kubeconfig** (``--kubeconfig``, optionally ``--context``): ``server``, the CA
  (``certificate-authority-data`` or ``certificate-authority``), and a ``token``, a
  ``tokenFile`` or a client certificate.

Contracts:

* The apiserver is verified against the cluster CA only (no system roots), host name checked.
  No CA, or ``insecure-skip-tls-verify``, is refused at start-up: the agent sends a credential
  that can impersonate anyone, so it must know whom it talks to (fail closed).
* A token file is re-read when it changes (kubelet rotates projected tokens), checked with a
  cheap ``stat`` at most every ``check_interval`` seconds; the CA and client-certificate files are
  reloaded the same way (``certs.tls.ReloadingContext``).
* Exec and auth-provider users are refused with a clear message (an agent must not run plugins).
* Nothing here logs or formats a token; :meth:`KubeAPIAccess.describe` is safe to log.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from certs.tls import ReloadingContext
from gateway.ops.startup import yaml_problem

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeAPIConfigError(ValueError):
    """The apiserver address, CA or credential cannot be used; the message says which."""


class TokenSource:
    """A bearer token, static or from a file that is re-read when it changes on disk."""

    def __init__(
        self, *, token: str | None = None, path: str | None = None, check_interval: float = 1.0
    ) -> None:
        if (token is None) == (path is None):
            raise ValueError("exactly one of token or path")
        self.path = path
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._checked_at = 0.0
        self._token = token or ""
        if path is not None:
            self._reload(force=True)
            if not self._token:
                raise KubeAPIConfigError(f"token file {path} is empty")

    def _reload(self, *, force: bool = False) -> None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if force:
                raise KubeAPIConfigError(
                    f"cannot read token file {self.path}: {exc.strerror}"
                ) from None
            log.warning("token file %s unreadable, keeping the previous token: %s",
                        self.path, exc.strerror)
            return
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == self._signature and not force:
            return
        try:
            token = Path(self.path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            # Never str(exc): a UnicodeDecodeError quotes a byte of the file, i.e. of the token.
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            if force:
                raise KubeAPIConfigError(f"cannot read token file {self.path}: {why}") from None
            log.warning("token file %s unreadable, keeping the previous token: %s", self.path, why)
            return
        self._signature = signature
        if not token or any(c in token for c in "\r\n\0"):
            if force:
                raise KubeAPIConfigError(f"token file {self.path} holds no usable token")
            log.warning("token file %s holds no usable token, keeping the previous one", self.path)
            return
        if self._token and token != self._token:
            log.info("token file %s changed, using the new token", self.path)
        self._token = token

    def current(self) -> str:
        if self.path is not None:
            now = time.monotonic()
            if now - self._checked_at >= self.check_interval:
                with self._lock:
                    self._checked_at = now
                    self._reload()
        return self._token

    def describe(self) -> str:
        return f"token file {self.path}" if self.path else "static token"


@dataclass
class KubeAPIAccess:
    """Where the agent's kube-apiserver is and how the agent authenticates to it."""

    host: str
    port: int
    ca_file: str
    token: TokenSource | None
    source: str  # "in-cluster" or the kubeconfig path, for logs
    cert_file: str | None = None  # client certificate (used only when there is no token)
    key_file: str | None = None
    _tempdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)
    tls: ReloadingContext = field(init=False, repr=False)
    tls_h2: ReloadingContext = field(init=False, repr=False)
    # (token, its Authorization value): asked per request, rebuilt only when the token rotates.
    _bearer: tuple[str, bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.token is None and not (self.cert_file and self.key_file):
            raise KubeAPIConfigError("no credential for the apiserver (token or client cert)")
        use_cert = self.token is None
        cert, key = (self.cert_file, self.key_file) if use_cert else (None, None)
        self.tls = _client_tls(self.ca_file, cert, key)
        self.tls_h2 = _client_tls(self.ca_file, cert, key, alpn=["h2", "http/1.1"])

    @property
    def server_hostname(self) -> str:
        return self.host

    def ssl_context(self) -> ssl.SSLContext:
        """ALPN ``http/1.1`` only: upgrades, and everything with ``--apiserver-protocol h1``."""
        return self.tls.current()

    def h2_ssl_context(self) -> ssl.SSLContext:
        """ALPN ``h2, http/1.1``: the server picks (gateway.agent.h2pool)."""
        return self.tls_h2.current()

    def authorization(self) -> bytes | None:
        """The ``Authorization`` value for the agent's own credential (None: client cert)."""
        if self.token is None:
            return None
        token = self.token.current()
        bearer = self._bearer
        if bearer is None or token != bearer[0]:
            bearer = self._bearer = (token, b"Bearer " + token.encode("ascii"))
        return bearer[1]

    def describe(self) -> str:
        cred = self.token.describe() if self.token else "client certificate"
        return f"https://{_authority(self.host, self.port)} ({self.source}, {cred})"


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_server(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "https":
        raise KubeAPIConfigError(f"apiserver URL {url!r} must be https://HOST[:PORT]")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise KubeAPIConfigError(f"apiserver URL {url!r} must not carry a path")
    if not parts.hostname:
        raise KubeAPIConfigError(f"apiserver URL {url!r} has no host")
    try:
        port = parts.port or 443
    except ValueError:
        raise KubeAPIConfigError(f"apiserver URL {url!r} has a bad port") from None
    return parts.hostname, port


def _client_tls(
    ca_file: str, cert_file: str | None = None, key_file: str | None = None,
    alpn: list[str] | None = None,
) -> ReloadingContext:
    def build() -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verify + check_hostname, no roots
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_verify_locations(cafile=ca_file)
        if cert_file and key_file:
            ctx.load_cert_chain(cert_file, key_file)
        # HTTP/1.1 unless asked: upgrades are spliced as HTTP/1.1 bytes; the h2 context is for
        # the rest (gateway.agent.h2pool translates).
        ctx.set_alpn_protocols(alpn or ["http/1.1"])
        return ctx

    files = [f for f in (ca_file, cert_file, key_file) if f]
    try:
        return ReloadingContext(build, files, check_interval=5.0)
    except (OSError, ssl.SSLError, ValueError) as exc:
        why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise KubeAPIConfigError(f"cannot load apiserver TLS files {files} ({why}): fix "
                                 "--apiserver-ca or the kubeconfig's certificate-authority "
                                 "and client certificate") from None


def in_cluster(environ: dict[str, str] | os._Environ[str] | None = None,
               sa_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeAPIAccess:
    env = os.environ if environ is None else environ
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeAPIConfigError(
            "not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset); give --kubeconfig"
        )
    try:
        port_number = int(port)
    except ValueError:
        raise KubeAPIConfigError(f"KUBERNETES_SERVICE_PORT={port!r} is not a port") from None
    return KubeAPIAccess(
        host=host,
        port=port_number,
        ca_file=str(sa_dir / "ca.crt"),
        token=TokenSource(path=str(sa_dir / "token")),
        source="in-cluster",
    )


def _pick(entries: list[Any] | None, name: str, kind: str, path: str) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(kind)
            if isinstance(body, dict):
                return body
    raise KubeAPIConfigError(f"kubeconfig {path}: no {kind} named {name!r}")


def from_kubeconfig(path: str, context: str | None = None) -> KubeAPIAccess:
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise KubeAPIConfigError(f"--kubeconfig {path}: cannot read it "
                                 f"({exc.strerror or type(exc).__name__})") from None
    except yaml.YAMLError as exc:
        # Never str(exc): it quotes the offending line, which may hold a token.
        raise KubeAPIConfigError(f"--kubeconfig {path}: {yaml_problem(exc)}") from None
    if not isinstance(doc, dict):
        raise KubeAPIConfigError(f"kubeconfig {path} is not a mapping")
    base = Path(path).resolve().parent
    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise KubeAPIConfigError(f"kubeconfig {path} has no current-context; give --context")
    ctx = _pick(doc.get("contexts"), ctx_name, "context", path)
    cluster = _pick(doc.get("clusters"), ctx.get("cluster", ""), "cluster", path)
    user = _pick(doc.get("users"), ctx.get("user", ""), "user", path) if ctx.get("user") else {}

    if cluster.get("insecure-skip-tls-verify"):
        raise KubeAPIConfigError(
            f"kubeconfig {path}: insecure-skip-tls-verify is refused (the agent's credential "
            "can impersonate; it must verify the apiserver)"
        )
    host, port = parse_server(str(cluster.get("server", "")))
    tempdir: tempfile.TemporaryDirectory[str] | None = None

    def materialise(data_key: str, file_key: str, body: dict[str, Any], name: str) -> str | None:
        nonlocal tempdir
        if body.get(data_key):
            if tempdir is None:
                tempdir = tempfile.TemporaryDirectory(prefix="hubproxy-agent-")
            target = Path(tempdir.name) / name
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(base64.b64decode(body[data_key]))
            return str(target)
        if body.get(file_key):
            return str(base / body[file_key])
        return None

    ca_file = materialise("certificate-authority-data", "certificate-authority", cluster, "ca.crt")
    if ca_file is None:
        raise KubeAPIConfigError(
            f"kubeconfig {path}: the cluster has no certificate-authority(-data); the agent "
            "never trusts system roots for its apiserver"
        )
    if user.get("exec") or user.get("auth-provider"):
        raise KubeAPIConfigError(
            f"kubeconfig {path}: exec/auth-provider users are not supported by the agent; "
            "use a token, tokenFile or client certificate"
        )
    cert_file = materialise("client-certificate-data", "client-certificate", user, "tls.crt")
    key_file = materialise("client-key-data", "client-key", user, "tls.key")
    token: TokenSource | None = None
    if user.get("token"):
        token = TokenSource(token=str(user["token"]).strip())
    elif user.get("tokenFile"):
        token = TokenSource(path=str(base / user["tokenFile"]))
    elif not (cert_file and key_file):
        raise KubeAPIConfigError(
            f"kubeconfig {path}: the user has no token, tokenFile or client certificate"
        )
    return KubeAPIAccess(
        host=host,
        port=port,
        ca_file=ca_file,
        token=token,
        source=f"kubeconfig {path}",
        cert_file=cert_file,
        key_file=key_file,
        _tempdir=tempdir,
    )


def load(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    apiserver: str | None = None,
    apiserver_ca: str | None = None,
    token_file: str | None = None,
) -> KubeAPIAccess:
    """The agent's apiserver access from flags: kubeconfig if given, else in-cluster.

    ``apiserver`` overrides the address (CA and credential still from the source);
    ``apiserver_ca``/``token_file`` override the CA and the token file.
    """
    if kubeconfig:
        access = from_kubeconfig(kubeconfig, context)
    elif apiserver and apiserver_ca and token_file:
        host, port = parse_server(apiserver)
        return KubeAPIAccess(host=host, port=port, ca_file=apiserver_ca,
                             token=TokenSource(path=token_file), source="flags")
    else:
        access = in_cluster()
    changes: dict[str, Any] = {}
    if apiserver:
        changes["host"], changes["port"] = parse_server(apiserver)
    if apiserver_ca:
        changes["ca_file"] = apiserver_ca
    if token_file:
        changes["token"] = TokenSource(path=token_file)
    return dataclasses.replace(access, **changes) if changes else access
