"""The gateway's side of joining: sign CSRs for join tokens and renewals, refuse removed clusters.

:meth:`JoinService.handle` is the tunnel listener's join handler (``tunnel.join``):

* ``/v1/join`` (no client certificate): the token names its cluster; the record of that
  cluster must be pending with the token's hash and unexpired. The certificate is signed for
  **the record's cluster** with only the CSR's public key (``certs.sign``), then the record is
  replaced, with its resourceVersion, by a joined one without the hash (the token is burnt).
  Only if that write wins is the certificate sent: two replicas given the same token cannot
  both answer it.
* ``/v1/renew`` (the agent's current certificate, verified by TLS against the tunnel CA): the
  cluster that certificate names, if its record is joined and accepts the certificate, gets a
  new one. An expired certificate fails the TLS handshake, so it cannot renew: a new join.

Tokens are checked against the polled records first (constant-time hash comparison), so a
flood of guessed tokens costs no hub API call; only a cluster the records do not know yet (added
since the last poll) is looked up, 10 at once then one a second per process. The decisive check is
always on the record just read, and the write with its resourceVersion.

Every refusal is one generic answer to the peer and one WARNING line with the reason here
(never the token); joins, renewals and refusals leave an audit line (``gateway.ops.audit``).

:meth:`JoinService.run` polls the records every ``poll_interval`` seconds in every gateway
process (each replica and each ``--workers`` process has its own listener): a removed
cluster's sessions are closed (:meth:`tunnel.listener.TunnelListener.close_where`) and its
later dials refused (:meth:`refuse`, the listener's hook). The CA Secret is re-read too, so a
rotated CA signs from the next poll on. A failed poll keeps the last known records.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certs.issue import Issued
from certs.sign import CSRError, sign_agent_csr
from gateway.hub.config import GatewayConfig
from gateway.hub.join.records import ClusterRecord, TokenError, token_cluster
from gateway.hub.join.store import CASecretError, Conflict, RecordStore
from gateway.ops import audit
from gateway.wire import join as body
from tunnel.identity import URI_NAMING, AgentIdentityError
from tunnel.join import JoinAnswer, JoinRequest

log = logging.getLogger("hubproxy.gateway.join")

MAX_CONCURRENT = 4  # signing requests handled at once per process
MAX_WAITING = 32  # beyond this many waiting, 429 at once
# Hub lookups of clusters the polled records do not know (added since the last poll), per
# process: a burst, then this many a second.
MISS_LOOKUP_BURST = 10
MISS_LOOKUP_RATE = 1.0
REFUSED = "join token not valid (unknown, used, expired or removed)"


class JoinService:
    def __init__(self, store: RecordStore, ca_secret: str, *,
                 lifetime: datetime.timedelta,
                 poll_interval: float = GatewayConfig.join_poll_interval,
                 clock: Callable[[], datetime.datetime] | None = None) -> None:
        self.store = store
        self.ca_secret = ca_secret
        self.lifetime = lifetime
        self.poll_interval = poll_interval
        self.clock = clock or (lambda: datetime.datetime.now(datetime.UTC))
        self.records: dict[str, ClusterRecord] = {}
        self.ca: Issued | None = None
        self.listener: Any = None  # tunnel.listener.TunnelListener, once started
        self.closed_sessions = 0
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self._last_lookup = time.monotonic()
        self._lookups = float(MISS_LOOKUP_BURST)
        self._waiting = 0

    async def start(self) -> None:
        """Read the CA and the records once; CASecretError if the CA cannot be read."""
        self.ca = await self.store.read_ca(self.ca_secret)
        self.records = {r.cluster: r for r in await self.store.list()}

    # --- revocation ------------------------------------------------------------------------

    def refuse(self, cluster: str, certificate: x509.Certificate) -> str | None:
        record = self.records.get(cluster)
        return record.refusal(certificate.not_valid_before_utc) if record else None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            await self.poll_once()

    async def poll_once(self) -> None:
        try:
            self.records = {r.cluster: r for r in await self.store.list()}
        except Exception as exc:  # keep the last known records; say so
            log.warning("cannot read the cluster records (HTTP %s): keeping the last ones",
                        getattr(exc, "status", None) or type(exc).__name__)
            return
        with contextlib.suppress(CASecretError):
            self.ca = await self.store.read_ca(self.ca_secret)
        if self.listener is not None:
            self.closed_sessions += self.listener.close_where(self.refuse)

    # --- signing ---------------------------------------------------------------------------

    async def handle(self, request: JoinRequest) -> JoinAnswer:
        if self._waiting >= MAX_WAITING:
            return _answer(429, "too many join requests at once; retry")
        self._waiting += 1
        try:
            async with self._slots:
                return await self._handle(request)
        finally:
            self._waiting -= 1

    async def _handle(self, request: JoinRequest) -> JoinAnswer:
        peer = f"{request.peer[0]}:{request.peer[1]}" if request.peer else None
        try:
            parsed = body.decode_request(request.path, request.body)
        except body.JoinBodyError as exc:
            return _answer(400, str(exc))
        try:
            if request.path == body.JOIN:
                assert parsed.token is not None
                return await self._join(parsed.token, parsed.csr, peer)
            return await self._renew(request.peer_certificate, parsed.csr, peer)
        except CSRError as exc:
            return _answer(400, str(exc))
        except (TimeoutError, OSError) as exc:
            log.warning("join from %s: the hub API is unreachable: %s", peer, type(exc).__name__)
            return _answer(503, "the hub cannot check the request now; retry")
        except Exception as exc:
            if getattr(exc, "status", None) is not None:  # an ApiException of the hub
                log.warning("join from %s: the hub API answered HTTP %s", peer,
                            getattr(exc, "status", None))
                return _answer(503, "the hub cannot check the request now; retry")
            raise

    def _refused(self, event: str, cluster: str | None, peer: str | None, why: str) -> JoinAnswer:
        log.warning("%s from %s for cluster %s refused: %s", event.replace("_", " "), peer,
                    cluster or "?", why)
        audit.emit(f"{event}_refused", request_id=_request_id(), cluster=cluster, peer=peer,
                   reason=why)
        return _answer(403, REFUSED if event == "cluster_join" else why)

    async def _join(self, token: str, csr: bytes, peer: str | None) -> JoinAnswer:
        try:
            cluster = token_cluster(token)
        except TokenError as exc:
            return self._refused("cluster_join", None, peer, str(exc))
        now = self.clock()
        # The polled records answer first, so guessed or stale tokens cost the hub API nothing;
        # a cluster added since the last poll is looked up, at most once a second per process.
        cached = self.records.get(cluster)
        if cached is not None:
            why = cached.check_token(token, now)
            if why is not None:
                return self._refused("cluster_join", cluster, peer, why)
        else:
            moment = time.monotonic()  # a token bucket: MISS_LOOKUP_BURST, then the rate
            self._lookups = min(MISS_LOOKUP_BURST, self._lookups + (
                moment - self._last_lookup) * MISS_LOOKUP_RATE)
            self._last_lookup = moment
            if self._lookups < 1:
                return self._refused("cluster_join", cluster, peer, "no such cluster record")
            self._lookups -= 1
        found = await self.store.get(cluster)
        if found is None:
            return self._refused("cluster_join", cluster, peer, "no such cluster record")
        record, version = found
        self.records.setdefault(cluster, record)  # known from now on, until the next poll
        why = record.check_token(token, now)
        if why is not None:
            return self._refused("cluster_join", cluster, peer, why)
        certificate = self._sign(csr, record.cluster, now)
        joined = record.joined(certificate.not_valid_before_utc, certificate.not_valid_after_utc)
        try:
            await self.store.put(joined, version)  # burns the token, or loses the race
        except Conflict:
            return self._refused("cluster_join", cluster, peer, "the join token was already used")
        self.records[cluster] = joined
        audit.emit("cluster_join", request_id=_request_id(), cluster=cluster, peer=peer,
                   serial=format(certificate.serial_number, "x"),
                   not_after=certificate.not_valid_after_utc.isoformat())
        log.info("cluster %s joined from %s; certificate valid until %s", cluster, peer,
                 certificate.not_valid_after_utc.isoformat())
        return _certificate(certificate)

    async def _renew(self, der: bytes | None, csr: bytes, peer: str | None) -> JoinAnswer:
        if der is None:
            return self._refused("cluster_renew", None, peer,
                                 "renewal needs the agent's current client certificate")
        current = x509.load_der_x509_certificate(der)
        try:
            cluster = URI_NAMING.cluster_of(current)
        except AgentIdentityError as exc:
            return self._refused("cluster_renew", None, peer, str(exc))
        for _ in range(3):  # a concurrent renewal of another agent replica moves the record
            found = await self.store.get(cluster)
            if found is None:
                return self._refused("cluster_renew", cluster, peer,
                                     "the cluster did not join (no record): renew it the way "
                                     "it was issued")
            record, version = found
            why = record.refusal(current.not_valid_before_utc)
            if why is not None:
                return self._refused("cluster_renew", cluster, peer, why)
            now = self.clock()
            certificate = self._sign(csr, cluster, now)
            renewed = ClusterRecord(**{**record.__dict__,
                                       "certificate_expires": certificate.not_valid_after_utc})
            try:
                await self.store.put(renewed, version)
            except Conflict:
                continue
            self.records[cluster] = renewed
            audit.emit("cluster_renew", request_id=_request_id(), cluster=cluster, peer=peer,
                       serial=format(certificate.serial_number, "x"),
                       not_after=certificate.not_valid_after_utc.isoformat())
            return _certificate(certificate)
        return _answer(503, "the cluster record keeps changing; retry")

    def _sign(self, csr: bytes, cluster: str, now: datetime.datetime) -> x509.Certificate:
        if self.ca is None:
            raise CSRError("the hub has no signing CA")
        return sign_agent_csr(self.ca, csr, cluster, lifetime=self.lifetime, now=now)


def _answer(status: int, error: str) -> JoinAnswer:
    return JoinAnswer(status, body.encode_answer(error=error))


def _certificate(certificate: x509.Certificate) -> JoinAnswer:
    return JoinAnswer(200, body.encode_answer(
        certificate.public_bytes(serialization.Encoding.PEM)))


def _request_id() -> str:
    return secrets.token_hex(8)
