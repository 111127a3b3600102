"""Authentication: static token file users and service-account tokens kubesim mints itself.

- Static tokens come from a kube-apiserver `--token-auth-file` CSV: `token,user,uid,"g1,g2"`.
  Like the real apiserver they are audience-agnostic: valid for the API audiences only.
- Service-account tokens are JWT-shaped (`header.claims.signature`, HS256 with a per-server
  secret instead of the real RS256) with the claims of a bound token: `iss`, `sub`, `aud`,
  `exp`, `iat`, `nbf`, `jti` and `kubernetes.io: {namespace, serviceaccount: {name, uid}}`.
  They are valid while unexpired, for the audiences they carry, and while their
  ServiceAccount still exists with the same uid.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import hmac
import io
import json
import secrets
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ALL_AUTHENTICATED = "system:authenticated"
ALL_UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
SA_PREFIX = "system:serviceaccount:"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def to_api(self) -> dict[str, Any]:
        """The `userInfo`/`user` shape of TokenReview and SelfSubjectReview."""
        out: dict[str, Any] = {"username": self.name}
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


class AuthenticationFailed(Exception):
    """The token is not valid (for these audiences); the message is TokenReview.status.error."""


def split_service_account(username: str) -> tuple[str, str] | None:
    """`system:serviceaccount:ns:name` -> (ns, name); None for any other user name."""
    if not username.startswith(SA_PREFIX):
        return None
    parts = username[len(SA_PREFIX) :].split(":")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def service_account_groups(namespace: str) -> tuple[str, str]:
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")


# What kube-apiserver's TokenReview says (status.error) for a token no authenticator claims
# (not a JWT, or another issuer's), as a real 1.36 apiserver answers it.
NOT_RECOGNISED = "invalid bearer token"


@dataclass(frozen=True)
class StaticUser:
    token: str
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()


def parse_token_file(text: str) -> list[StaticUser]:
    """Parse kube-apiserver's token file CSV (blank lines and `#` comments skipped)."""
    users = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 2:
            raise ValueError(f"token file line needs at least token,user: {len(row)} column(s)")
        token, name = row[0].strip(), row[1].strip()
        uid = row[2].strip() if len(row) > 2 else ""
        groups = tuple(g.strip() for g in row[3].split(",") if g.strip()) if len(row) > 3 else ()
        users.append(StaticUser(token, name, uid, groups))
    return users


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Authenticator:
    """Turns a bearer token into a UserInfo for a set of target audiences."""

    # (namespace, name) -> ServiceAccount uid, or None if it does not exist
    service_account_uid: Callable[[str, str], str | None]
    api_audiences: tuple[str, ...] = (DEFAULT_ISSUER,)
    issuer: str = DEFAULT_ISSUER
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    static: dict[str, StaticUser] = field(default_factory=dict)

    def add_static(self, users: Iterable[StaticUser]) -> None:
        for user in users:
            self.static[user.token] = user

    # --- minting ----------------------------------------------------------------------
    def mint(
        self,
        namespace: str,
        name: str,
        sa_uid: str,
        audiences: Iterable[str] | None = None,
        expiration_seconds: int = 3600,
        bound: dict[str, Any] | None = None,
    ) -> tuple[str, int]:
        """A signed service-account token and its expiry (unix seconds)."""
        now = int(time.time())
        exp = now + int(expiration_seconds)
        kube: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": name, "uid": sa_uid},
        }
        if bound:
            kube.update(bound)
        claims = {
            "aud": list(audiences or self.api_audiences),
            "exp": exp,
            "iat": now,
            "iss": self.issuer,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": kube,
            "nbf": now,
            "sub": f"{SA_PREFIX}{namespace}:{name}",
        }
        header = {"alg": "HS256", "kid": "kubesim", "typ": "JWT"}
        signing_input = f"{_b64(_compact(header))}.{_b64(_compact(claims))}"
        sig = hmac.new(self.secret, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(sig)}", exp

    # --- verification -----------------------------------------------------------------
    def authenticate(
        self, token: str, audiences: Iterable[str] | None = None
    ) -> tuple[UserInfo, list[str]]:
        """(user, audiences the token is good for) or AuthenticationFailed."""
        targets = list(audiences) if audiences else list(self.api_audiences)
        static = self.static.get(token)
        if static is not None and hmac.compare_digest(static.token, token):
            # Audience-agnostic authenticators are valid only for the API's own audiences.
            auds = [a for a in self.api_audiences if a in targets]
            if not auds:
                raise AuthenticationFailed("[invalid bearer token, token lookup failed]")
            groups = (
                static.groups
                if ALL_AUTHENTICATED in static.groups
                else (*static.groups, ALL_AUTHENTICATED)
            )
            return UserInfo(static.name, static.uid, groups), auds
        return self._service_account(token, targets)

    def _service_account(self, token: str, targets: list[str]) -> tuple[UserInfo, list[str]]:
        parts = token.split(".")
        if len(parts) != 3:  # not a JWT: no authenticator claims it
            raise AuthenticationFailed(NOT_RECOGNISED)
        try:
            signing_input = f"{parts[0]}.{parts[1]}".encode()
            expected = hmac.new(self.secret, signing_input, hashlib.sha256).digest()
            if not hmac.compare_digest(expected, _unb64(parts[2])):
                raise AuthenticationFailed(
                    "[invalid bearer token, square/go-jose: error in cryptographic primitive]"
                )
            claims = json.loads(_unb64(parts[1]))
        except (ValueError, TypeError) as exc:
            raise AuthenticationFailed(NOT_RECOGNISED) from exc
        now = time.time()
        if claims.get("iss") != self.issuer:  # another issuer's JWT: not ours to judge
            raise AuthenticationFailed(NOT_RECOGNISED)
        if claims.get("exp", 0) < now or claims.get("nbf", 0) > now + 60:
            raise AuthenticationFailed("[invalid bearer token, service account token has expired]")
        token_auds = claims.get("aud") or []
        auds = [a for a in targets if a in token_auds]
        if not auds:
            raise AuthenticationFailed(
                "[invalid bearer token, token audiences "
                f"{json.dumps(token_auds)} is invalid for the "
                f"target audiences {json.dumps(targets)}]"
            )
        kube = claims.get("kubernetes.io") or {}
        namespace = kube.get("namespace", "")
        sa = kube.get("serviceaccount") or {}
        current_uid = self.service_account_uid(namespace, sa.get("name", ""))
        if current_uid is None or current_uid != sa.get("uid"):
            raise AuthenticationFailed(
                "[invalid bearer token, service account token has been invalidated]"
            )
        extra = {CREDENTIAL_ID: (f"JTI={claims.get('jti', '')}",)}
        groups = (*service_account_groups(namespace), ALL_AUTHENTICATED)
        return UserInfo(f"{SA_PREFIX}{namespace}:{sa['name']}", sa["uid"], groups, extra), auds


def token_claims(token: str) -> dict[str, Any]:
    """The (unverified) claims of a JWT-shaped token, for tests and for `exp`."""
    return json.loads(_unb64(token.split(".")[1]))
