"""JoinService (the gateway's signer) against an in-memory record store: single use, names,
cache-first refusals, revocation. The real-Secret version is tests/realkube/test_join.py."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Callable

from cryptography import x509

from certs.issue import Issued, create_ca, new_key
from certs.sign import agent_csr
from gateway.hub.join.records import PENDING, REVOKED, ClusterRecord, new_token, token_hash
from gateway.hub.join.service import JoinService
from gateway.hub.join.store import Conflict
from tunnel.join import JoinRequest

NOW = datetime.datetime.now(datetime.UTC)


class MemoryStore:
    """What RecordStore does, with resourceVersions, in memory; counts hub calls."""

    def __init__(self, ca: Issued) -> None:
        self.ca = ca
        self.records: dict[str, tuple[ClusterRecord, str]] = {}
        self.gets = 0

    async def get(self, cluster: str) -> tuple[ClusterRecord, str] | None:
        self.gets += 1
        return self.records.get(cluster)

    async def list(self) -> list[ClusterRecord]:
        return [r for r, _ in self.records.values()]

    async def put(self, record: ClusterRecord, version: str | None) -> None:
        current = self.records.get(record.cluster)
        if (current[1] if current else None) != version:
            raise Conflict(record.cluster)
        self.records[record.cluster] = (record, str(int(version or 0) + 1))

    async def read_ca(self, name: str) -> Issued:
        return self.ca


def join_request(token: str, name: str = "c1") -> JoinRequest:
    body = json.dumps({"token": token, "csr": agent_csr(new_key(), name).decode()}).encode()
    return JoinRequest("/v1/join", body, None, ("127.0.0.1", 1))


async def service_with(token: str) -> tuple[JoinService, MemoryStore]:
    store = MemoryStore(create_ca("ca", days=1))
    store.records["c1"] = (ClusterRecord("c1", PENDING, token_hash(token),
                                         NOW + datetime.timedelta(hours=1)), "1")
    service = JoinService(store, "ca", lifetime=datetime.timedelta(days=7))  # type: ignore[arg-type]
    await service.start()
    return service, store


async def test_a_token_is_used_once_even_by_two_requests_at_once() -> None:
    token = new_token("c1")
    service, store = await service_with(token)
    answers = await asyncio.gather(service.handle(join_request(token, "other")),
                                   service.handle(join_request(token)))
    assert sorted(a.status for a in answers) == [200, 403]
    ok = next(a for a in answers if a.status == 200)
    cert = x509.load_pem_x509_certificate(json.loads(ok.body)["certificate"].encode())
    assert cert.subject.rfc4514_string() == "CN=c1"  # the token's cluster, not the CSR's
    assert store.records["c1"][0].token_hash == ""


async def test_guessed_tokens_cost_no_hub_call() -> None:
    token = new_token("c1")
    service, store = await service_with(token)
    for _ in range(50):
        assert (await service.handle(join_request("hpjoin1:c1:" + "A" * 43))).status == 403
        assert (await service.handle(join_request("hpjoin1:nosuch:" + "A" * 43))).status == 403
    assert store.gets <= 11  # the lookup burst for the unknown cluster, then ~one a second


async def test_revoked_clusters_are_refused_and_their_sessions_closed() -> None:
    token = new_token("c1")
    service, store = await service_with(token)
    answer = await service.handle(join_request(token))
    cert = x509.load_pem_x509_certificate(json.loads(answer.body)["certificate"].encode())
    assert service.refuse("c1", cert) is None
    record, version = store.records["c1"]
    store.records["c1"] = (ClusterRecord("c1", REVOKED, accept_from=record.accept_from),
                           version)
    closed: list[str] = []

    class Listener:
        def close_where(self, refuse: Callable[[str, x509.Certificate], str | None]) -> int:
            why = refuse("c1", cert)
            if why:
                closed.append(why)
            return 1 if why else 0

    service.listener = Listener()
    await service.poll_once()
    assert closed == ["the cluster was removed (hubproxy cluster remove)"]
    assert service.closed_sessions == 1
    # Its renewal is refused too (the TLS layer verified the certificate; the record says no).
    from cryptography.hazmat.primitives import serialization

    renew = JoinRequest("/v1/renew", json.dumps(
        {"csr": agent_csr(new_key(), "c1").decode()}).encode(),
        cert.public_bytes(serialization.Encoding.DER), None)
    refused = await service.handle(renew)
    assert refused.status == 403 and b"removed" in refused.body


async def test_a_guess_right_after_cluster_add_does_not_lock_out_the_real_token() -> None:
    """A cluster added since the last poll is looked up once and then known: a guessed token
    sent first does not make the real one wait for the next poll."""
    service, store = await service_with(new_token("c0"))
    token = new_token("c2")
    store.records["c2"] = (ClusterRecord("c2", PENDING, token_hash(token),
                                         NOW + datetime.timedelta(hours=1)), "1")
    assert (await service.handle(join_request("hpjoin1:c2:" + "A" * 43, "c2"))).status == 403
    assert (await service.handle(join_request(token, "c2"))).status == 200
