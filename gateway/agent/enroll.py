"""Join and renewal on the agent: a key made here, a certificate from the hub, kept in a Secret.

With ``--credentials-secret NS/NAME`` the agent's identity lives in that Secret of its own
namespace (the only object its Role lets it read and update). ``ca.crt`` there is the hub's
tunnel CA; at first ``join-token`` is the single-use token ``hubproxy cluster add`` made.

Start-up (:meth:`Enrollment.ensure`): a Secret holding a certificate for this cluster that has
not expired is used as it is. Otherwise, with a join token, the agent makes an EC P-256 key, sends
a CSR with the token on the tunnel port's join ALPN (``tunnel.join``), and stores key and
certificate in the Secret in place of the token (an update with the read resourceVersion). If
the hub refuses the token, another replica may just have used it: the Secret is re-read for a
while before giving up. The private key never leaves this process and that Secret.

Renewal (:meth:`Enrollment.renew_forever`): at two thirds of the certificate's lifetime, a new
key and CSR go to ``/v1/renew`` over TLS with the current certificate; the new pair is stored
in the Secret, then written to ``--tls-dir``. If another replica renewed first (a newer
certificate in the Secret, or a conflict on update), that one is adopted. Failures retry every
few seconds until the certificate expires; after that only a new join helps.

Files: ``tls.crt``/``tls.key``/``ca.crt`` in ``--tls-dir`` are symlinks into a directory that is
replaced in one rename (as the kubelet updates Secret volumes), so the tunnel's reloading
context never sees a key from one pair and a certificate from another; the dialer then opens a
session with the new certificate and drains the old one (``tunnel.dialer``).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
import os
import random
import secrets
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certs.files import key_pem
from certs.issue import new_key
from certs.sign import agent_csr
from certs.tls import TLS1_3, client_context
from gateway.agent.kubeapi import KubeAPIAccess
from gateway.wire import join as body
from tunnel.identity import URI_NAMING, AgentIdentityError
from tunnel.join import JOIN_ALPN, request
from tunnel.proxy import ProxyConfig, ProxyError

log = logging.getLogger("hubproxy.agent.enroll")

TOKEN_KEY = "join-token"
ADOPT_WAIT = 30.0  # after a refused join: how long to look for another replica's credentials
RETRY = 5.0  # between failed renewals


class EnrollmentError(Exception):
    """The agent has no usable certificate and cannot get one (the message says why)."""


@dataclass
class Credentials:
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def renew_at(self) -> datetime.datetime:
        cert = self.certificate
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        return start + (end - start) * 2 / 3


class CredentialSecret:
    """GET and PUT of one Secret on the agent's own kube-apiserver, with its own credential."""

    def __init__(self, kube: KubeAPIAccess, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace, self.name = namespace, name
        host = f"[{kube.host}]" if ":" in kube.host else kube.host
        self.url = f"https://{host}:{kube.port}/api/v1/namespaces/{namespace}/secrets/{name}"

    async def _call(self, method: str, payload: dict[str, Any] | None = None
                    ) -> tuple[int, dict[str, Any]]:
        headers = {"Accept": "application/json"}
        auth = self.kube.authorization()
        if auth is not None:
            headers["Authorization"] = auth.decode("ascii")
        connector = aiohttp.TCPConnector(ssl=self.kube.ssl_context())
        try:
            async with aiohttp.ClientSession(connector=connector) as session, session.request(
                    method, self.url, json=payload, headers=headers,
                    server_hostname=self.kube.server_hostname,
                    timeout=aiohttp.ClientTimeout(total=15)) as response:
                data = await response.json(content_type=None)
                return response.status, data if isinstance(data, dict) else {}
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise EnrollmentError(f"cannot reach the kube-apiserver for Secret "
                                  f"{self.namespace}/{self.name}: {type(exc).__name__}") from None

    async def get(self) -> tuple[dict[str, bytes], dict[str, Any]]:
        status, secret = await self._call("GET")
        if status != 200:
            raise EnrollmentError(f"cannot read Secret {self.namespace}/{self.name} "
                                  f"(HTTP {status}: {secret.get('reason') or ''})")
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return data, secret

    async def put(self, secret: dict[str, Any], data: dict[str, bytes]) -> bool:
        """Replace the Secret's data (with its resourceVersion); False on a conflict."""
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": secret["metadata"],
                "type": secret.get("type", "Opaque"),
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
        status, answer = await self._call("PUT", body)
        if status == 409:
            return False
        if status != 200:
            raise EnrollmentError(f"cannot update Secret {self.namespace}/{self.name} "
                                  f"(HTTP {status}: {answer.get('reason') or ''})")
        return True


def write_tls_dir(directory: Path, credentials: Credentials) -> None:
    """Replace tls.crt, tls.key and ca.crt in ``directory`` at once (symlinks + one rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    version = directory / f"..{secrets.token_hex(6)}"
    version.mkdir(mode=0o700)
    for name, data, mode in (("tls.key", credentials.key_pem, 0o600),
                             ("tls.crt", credentials.cert_pem, 0o644),
                             ("ca.crt", credentials.ca_pem, 0o644)):
        fd = os.open(version / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    link = directory / "..data"
    previous = os.readlink(link) if link.is_symlink() else None
    tmp = directory / "..data_tmp"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(version.name)
    tmp.rename(link)  # the one atomic step
    for name in ("tls.key", "tls.crt", "ca.crt"):
        path = directory / name
        if not path.is_symlink():
            if path.exists():
                path.unlink()
            path.symlink_to(f"..data/{name}")
    if previous:
        for leftover in (directory / previous).glob("*"):
            leftover.unlink()
        (directory / previous).rmdir()


class Enrollment:
    def __init__(self, *, cluster: str, secret: CredentialSecret, tls_dir: Path,
                 hub: tuple[str, int], server_hostname: str | None = None,
                 proxy: ProxyConfig | None = None,
                 clock: Callable[[], datetime.datetime] | None = None) -> None:
        self.cluster = cluster
        self.secret = secret
        self.tls_dir = tls_dir
        self.hub = hub
        self.server_hostname = server_hostname
        self.proxy = proxy
        self.clock = clock or (lambda: datetime.datetime.now(datetime.UTC))
        self.credentials: Credentials | None = None
        self.renewals = 0

    # --- start-up --------------------------------------------------------------------------

    async def ensure(self) -> Credentials:
        """Usable credentials in ``tls_dir``, from the Secret or from a join."""
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            data, secret = await self.secret.get()
            found = self._usable(data)
            if found is not None:
                return self._install(found, "from the credentials Secret")
            token = data.get(TOKEN_KEY, b"").decode().strip()
            if "ca.crt" not in data:
                raise EnrollmentError(f"Secret {self.secret.namespace}/{self.secret.name} has "
                                      "no ca.crt (the hub CA): apply hubproxy cluster add's "
                                      "output again")
            if not token:
                raise EnrollmentError(
                    f"Secret {self.secret.namespace}/{self.secret.name} has neither a valid "
                    "certificate nor a join token: run `hubproxy cluster add "
                    f"{self.cluster}` on the hub and apply its output here")
            try:
                credentials = await self._join(token, data["ca.crt"])
            except EnrollmentError as exc:
                # Another replica may have used the token a moment ago: look for its result.
                deadline = deadline or loop.time() + ADOPT_WAIT
                if loop.time() >= deadline:
                    raise
                log.warning("%s; looking for credentials another replica may have stored", exc)
                await asyncio.sleep(1.0 + random.random())
                continue
            stored = {k: v for k, v in data.items() if k != TOKEN_KEY}
            stored.update({"tls.key": credentials.key_pem, "tls.crt": credentials.cert_pem})
            if not await self.secret.put(secret, stored):
                continue  # someone else wrote it first: read theirs
            return self._install(credentials, "joined the hub")

    def _usable(self, data: dict[str, bytes]) -> Credentials | None:
        if not all(k in data for k in ("tls.key", "tls.crt", "ca.crt")):
            return None
        credentials = Credentials(data["tls.key"], data["tls.crt"], data["ca.crt"])
        try:
            cert = credentials.certificate
            named = URI_NAMING.cluster_of(cert)
        except (ValueError, AgentIdentityError):
            return None
        if named != self.cluster or cert.not_valid_after_utc <= self.clock():
            return None
        return credentials

    def _install(self, credentials: Credentials, how: str) -> Credentials:
        write_tls_dir(self.tls_dir, credentials)
        self.credentials = credentials
        log.info("agent certificate for %s (%s), valid until %s; renewal at %s", self.cluster,
                 how, credentials.certificate.not_valid_after_utc.isoformat(),
                 credentials.renew_at().isoformat())
        return credentials

    # --- talking to the hub ----------------------------------------------------------------

    async def _ask(self, path: str, token: str | None, ca_pem: bytes,
                   current: Credentials | None) -> Credentials:
        key = new_key("ec")
        csr = agent_csr(key, self.cluster)
        context = await asyncio.to_thread(self._context, ca_pem, current)
        host, port = self.hub
        try:
            answer = await request(host, port, context, path,
                                   body.encode_request(body.CertificateRequest(csr, token)),
                                   server_hostname=self.server_hostname, proxy=self.proxy)
            cert_pem = body.decode_answer(answer.status, answer.body)
            cert = x509.load_pem_x509_certificate(cert_pem)
        except (OSError, ssl.SSLError, TimeoutError, ValueError, ProxyError) as exc:
            raise EnrollmentError(f"{path} at the hub {host}:{port} failed: "
                                  f"{getattr(exc, 'reason', None) or exc}") from None
        public = serialization.PublicFormat.SubjectPublicKeyInfo
        if cert.public_key().public_bytes(serialization.Encoding.DER, public) != \
                key.public_key().public_bytes(serialization.Encoding.DER, public):
            raise EnrollmentError("the hub's certificate is not for the key we sent")
        return Credentials(key_pem(key), cert_pem, ca_pem)

    def _context(self, ca_pem: bytes, current: Credentials | None) -> ssl.SSLContext:
        # The CA and the current pair are in the files we wrote (current) or only in the
        # Secret (first join): load the CA from memory, the pair from the tls dir.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = TLS1_3
        ctx.load_verify_locations(cadata=ca_pem.decode())
        if current is not None:
            ctx = client_context(self.tls_dir / "ca.crt", self.tls_dir / "tls.crt",
                                 self.tls_dir / "tls.key", min_version=TLS1_3)
        ctx.set_alpn_protocols([JOIN_ALPN])
        return ctx

    async def _join(self, token: str, ca_pem: bytes) -> Credentials:
        return await self._ask(body.JOIN, token, ca_pem, None)

    # --- renewal ---------------------------------------------------------------------------

    async def renew_forever(self) -> None:
        while True:
            assert self.credentials is not None
            wait = (self.credentials.renew_at() - self.clock()).total_seconds()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                await self.renew_once()
            except EnrollmentError as exc:
                expires = self.credentials.certificate.not_valid_after_utc
                left = (expires - self.clock()).total_seconds()
                log.warning("certificate renewal failed: %s (%s)", exc,
                            f"{left:.0f}s left before it expires" if left > 0 else
                            "it has expired: a new join is needed (hubproxy cluster add)")
                await asyncio.sleep(min(RETRY, max(left / 4, 0.5)) if left > 0 else 60.0)

    async def renew_once(self) -> None:
        current = self.credentials
        assert current is not None
        data, secret = await self.secret.get()
        stored = self._usable(data)
        if stored is not None and stored.certificate.not_valid_after_utc > \
                current.certificate.not_valid_after_utc:
            self._install(stored, "renewed by another replica")
            return
        fresh = await self._ask(body.RENEW, None, current.ca_pem, current)
        data.pop(TOKEN_KEY, None)
        data.update({"tls.key": fresh.key_pem, "tls.crt": fresh.cert_pem})
        if not await self.secret.put(secret, data):
            raise EnrollmentError("the credentials Secret changed meanwhile; reading it again")
        self.renewals += 1
        self._install(fresh, "renewed")
