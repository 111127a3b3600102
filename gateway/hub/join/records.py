"""A joined cluster's record and its join token (pure: no I/O).

Token: ``hpjoin1:<cluster>:<secret>``, the secret 32 random bytes in base64url. The cluster
part is not secret; it tells the hub which record to read (one GET, no scan). The hub stores
only ``sha256(token)`` (hex): the token is unguessable, so a plain hash is enough, and a copy of
the record does not let anyone join.

Record: Secret ``hubproxy-cluster-<cluster>`` (label ``hubproxy.dev/cluster-record=true``) in
the gateway's namespace, ``data``:

* ``cluster``; ``state``: ``pending`` (token made, not used), ``joined``, ``revoked``;
* ``tokenHash``, ``tokenExpires`` (RFC 3339): while pending only; emptied when the token is
  burnt by the join;
* ``acceptFrom`` (RFC 3339): certificates of this cluster whose notBefore is earlier are
  refused: a cluster removed and added again does not take back its old certificates;
* ``certificateExpires``: the last certificate the hub signed (``cluster list``).

Clusters with no record (certificates from ``hubproxy certs issue-agent``, OCM) are not
affected: the records govern only what joining created.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import secrets
from dataclasses import dataclass, replace

from tunnel.identity import AgentIdentityError, validate_cluster_name

TOKEN_PREFIX = "hpjoin1"
SECRET_PREFIX = "hubproxy-cluster-"
RECORD_LABEL = "hubproxy.dev/cluster-record"
PENDING, JOINED, REVOKED = "pending", "joined", "revoked"
STATES = (PENDING, JOINED, REVOKED)
MAX_TOKEN = 400


class TokenError(ValueError):
    """Not a join token (shape only; whether it is valid is the record's business)."""


def new_token(cluster: str) -> str:
    validate_cluster_name(cluster)
    return f"{TOKEN_PREFIX}:{cluster}:{secrets.token_urlsafe(32)}"


def token_cluster(token: str) -> str:
    """The cluster a token claims to be for (checked against the record's hash later)."""
    if len(token) > MAX_TOKEN:
        raise TokenError("join token too long")
    prefix, _, rest = token.partition(":")
    cluster, _, secret = rest.partition(":")
    if prefix != TOKEN_PREFIX or not secret:
        raise TokenError("not a hubproxy join token")
    try:
        return validate_cluster_name(cluster)
    except AgentIdentityError:
        raise TokenError("not a hubproxy join token") from None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def secret_name(cluster: str) -> str:
    name = SECRET_PREFIX + validate_cluster_name(cluster)
    if len(name) > 253:
        raise ValueError(f"cluster name {cluster[:40]!r}... too long for a record Secret")
    return name


def rfc3339(moment: datetime.datetime | None) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else ""


def parse_time(value: str) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


@dataclass(frozen=True)
class ClusterRecord:
    cluster: str
    state: str
    token_hash: str = ""
    token_expires: datetime.datetime | None = None
    accept_from: datetime.datetime | None = None
    certificate_expires: datetime.datetime | None = None

    def to_data(self) -> dict[str, str]:
        """The Secret's ``data`` (base64, as the API wants it)."""
        fields = {
            "cluster": self.cluster, "state": self.state, "tokenHash": self.token_hash,
            "tokenExpires": rfc3339(self.token_expires),
            "acceptFrom": rfc3339(self.accept_from),
            "certificateExpires": rfc3339(self.certificate_expires),
        }
        return {k: base64.b64encode(v.encode()).decode() for k, v in fields.items()}

    @classmethod
    def from_data(cls, data: dict[str, str] | None) -> ClusterRecord:
        raw = {k: base64.b64decode(v).decode() for k, v in (data or {}).items()}
        state = raw.get("state", "")
        if state not in STATES:
            raise ValueError(f"record has unknown state {state!r}")
        return cls(cluster=validate_cluster_name(raw.get("cluster", "")), state=state,
                   token_hash=raw.get("tokenHash", ""),
                   token_expires=parse_time(raw.get("tokenExpires", "")),
                   accept_from=parse_time(raw.get("acceptFrom", "")),
                   certificate_expires=parse_time(raw.get("certificateExpires", "")))

    def check_token(self, token: str, now: datetime.datetime) -> str | None:
        """Why ``token`` may not join this cluster now, or None when it may."""
        if self.state == REVOKED:
            return "the cluster was removed"
        if self.state != PENDING or not self.token_hash:
            return "the join token was already used"
        if not hmac.compare_digest(self.token_hash, token_hash(token)):
            return "the join token does not match"
        if self.token_expires is None or now >= self.token_expires:
            return "the join token has expired"
        return None

    def joined(self, accept_from: datetime.datetime,
               certificate_expires: datetime.datetime) -> ClusterRecord:
        """The record after its token was used: burnt, certificates from now on accepted."""
        return replace(self, state=JOINED, token_hash="", token_expires=None,
                       accept_from=accept_from, certificate_expires=certificate_expires)

    def refusal(self, not_before: datetime.datetime) -> str | None:
        """Why a certificate of this cluster valid from ``not_before`` is refused, or None."""
        if self.state == REVOKED:
            return "the cluster was removed (hubproxy cluster remove)"
        if self.state == PENDING:
            return "the cluster was added again and has not joined yet"
        if self.accept_from is not None and not_before < self.accept_from:
            return "the certificate predates the cluster's current join"
        return None
