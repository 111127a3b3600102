"""The JSON bodies of a join or renew request and its answer (tunnel.join carries them).

``POST /v1/join``  ``{"token": "<join token>", "csr": "<PEM CSR>"}``: no client certificate;
the hub signs a certificate for the cluster the token was made for.
``POST /v1/renew`` ``{"csr": "<PEM CSR>"}``: over TLS with the agent's current, valid client
certificate; the hub signs for the cluster that certificate names.
Answer ``200 {"certificate": "<PEM>"}`` or ``4xx/5xx {"error": "<why>"}`` (never a token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

JOIN = "/v1/join"
RENEW = "/v1/renew"


class JoinBodyError(ValueError):
    """A body that is not what the path expects."""


@dataclass(frozen=True)
class CertificateRequest:
    csr: bytes
    token: str | None = None  # /v1/join only


def encode_request(request: CertificateRequest) -> bytes:
    body: dict[str, str] = {"csr": request.csr.decode("ascii")}
    if request.token is not None:
        body["token"] = request.token
    return json.dumps(body).encode()


def decode_request(path: str, body: bytes) -> CertificateRequest:
    try:
        data = json.loads(body)
    except ValueError:
        raise JoinBodyError("body is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("csr"), str):
        raise JoinBodyError('body must be a JSON object with a "csr" string')
    token = data.get("token")
    if path == JOIN and not isinstance(token, str):
        raise JoinBodyError('a join needs a "token" string')
    if path == RENEW and token is not None:
        raise JoinBodyError("a renewal carries no token")
    return CertificateRequest(data["csr"].encode("ascii", "replace"),
                              token if isinstance(token, str) else None)


def encode_answer(certificate_pem: bytes | None = None, error: str | None = None) -> bytes:
    if certificate_pem is not None:
        return json.dumps({"certificate": certificate_pem.decode("ascii")}).encode()
    return json.dumps({"error": error or "refused"}).encode()


def decode_answer(status: int, body: bytes) -> bytes:
    """The certificate PEM of a 200 answer; JoinBodyError with the hub's reason otherwise."""
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    if status == 200 and isinstance(data.get("certificate"), str):
        return str(data["certificate"]).encode("ascii")
    raise JoinBodyError(f"the hub answered {status}: {data.get('error') or 'no reason given'}")
