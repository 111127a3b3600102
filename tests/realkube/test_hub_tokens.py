"""Hub tokens of every kind the real hub issues, through the gateway: each gets its answer.

- a bound ServiceAccount token from TokenRequest (`kubectl create token`): admitted;
- audiences: a gateway run with `--audience hubproxy` admits only tokens requested for that
  audience, and a gateway without `--audience` refuses them (the hub API audience is implied);
- an expired token: TokenRequest will not issue one (its minimum is 10 minutes), so a real
  token is re-signed with the hub's own signing key with `exp` in the past; the same token
  re-signed unchanged is admitted, so expiry is the only reason for the refusal;
- the token of a ServiceAccount deleted afterwards: refused once the caches expire.
Refusals are 401 Status JSON.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.realkube.conftest import CLUSTER, Fleet
from tests.realkube.hubproxy import Gateway, start_gateway, wait_connected

PATH = f"/{CLUSTER}/api"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def resign(token: str, key_pem: bytes, **claims: Any) -> str:
    """``token`` with ``claims`` replaced, signed RS256 with the hub's service-account key."""
    header, payload, _ = token.split(".")
    body = {**json.loads(unb64(payload)), **claims}
    signing_input = f"{header}.{b64(json.dumps(body).encode())}".encode()
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input.decode()}.{b64(signature)}"


def assert_unauthorized(answer: tuple[int, Any]) -> None:
    code, status = answer
    assert code == 401, status
    assert status["kind"] == "Status" and status["apiVersion"] == "v1"
    assert (status["status"], status["reason"], status["code"]) == (
        "Failure", "Unauthorized", 401)


def may_use_cluster(fleet: Fleet, account: str) -> None:
    fleet.hub.admin("create", "serviceaccount", account, "-n", "fleet")
    fleet.hub.admin("create", "clusterrolebinding", f"{account}-uses-{CLUSTER}",
                    f"--clusterrole=use-{CLUSTER}", f"--serviceaccount=fleet:{account}")


@pytest.fixture(scope="module")
def audience_gateway(fleet: Fleet) -> Iterator[Gateway]:
    gateway = start_gateway(fleet.group, fleet.pki, fleet.gateway_kubeconfig,
                            fleet.agent_kubeconfig, "--audience", "hubproxy",
                            "--token-cache-ttl", "0")
    try:
        wait_connected(gateway, fleet.hub.create_token("fleet", "alice", audience="hubproxy"))
        yield gateway
    finally:
        for process in (gateway.agent, gateway.process):
            if process is not None:
                process.stop()


def test_bound_serviceaccount_token_is_admitted(fleet: Fleet) -> None:
    may_use_cluster(fleet, "carol")
    token = fleet.hub.create_token("fleet", "carol", duration="10m")
    code, body = fleet.gateway.curl_json(PATH, token)
    assert code == 200, body
    assert body["kind"] == "APIVersions"


def test_audience_is_checked_on_both_sides(fleet: Fleet, audience_gateway: Gateway) -> None:
    for_hubproxy = fleet.hub.create_token("fleet", "alice", audience="hubproxy")
    for_other = fleet.hub.create_token("fleet", "alice", audience="something-else")
    assert audience_gateway.curl(PATH, for_hubproxy)[0] == 200
    assert_unauthorized(audience_gateway.curl_json(PATH, fleet.alice))  # hub API audience
    assert_unauthorized(audience_gateway.curl_json(PATH, for_other))
    # A gateway without --audience accepts only the hub API's own audience.
    assert fleet.gateway.curl(PATH, fleet.alice)[0] == 200
    assert_unauthorized(fleet.gateway.curl_json(PATH, for_hubproxy))


def test_expired_token_is_refused(fleet: Fleet) -> None:
    key = fleet.hub.signing_key.read_bytes()
    token = fleet.hub.create_token("fleet", "alice", duration="10m")
    now = int(time.time())
    resigned = resign(token, key)
    expired = resign(token, key, iat=now - 7200, nbf=now - 7200, exp=now - 3600)
    assert fleet.gateway.curl(PATH, resigned)[0] == 200  # our signature is the hub's
    assert_unauthorized(fleet.gateway.curl_json(PATH, expired))
    forged = resign(token, rsa_key_pem())  # and a key the hub does not know is refused
    assert_unauthorized(fleet.gateway.curl_json(PATH, forged))


def rsa_key_pem() -> bytes:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())


def test_token_of_a_deleted_serviceaccount_is_refused(fleet: Fleet) -> None:
    may_use_cluster(fleet, "dave")
    token = fleet.hub.create_token("fleet", "dave")
    assert fleet.gateway.curl(PATH, token)[0] == 200
    fleet.hub.admin("delete", "serviceaccount", "dave", "-n", "fleet")
    # Refused within ~11 s: kube-apiserver caches a successful token authentication for 10 s
    # (TokenSuccessCacheTTL, no flag; TokenReview goes through the same cache), and the
    # gateway for 1 s (--token-cache-ttl).
    deadline = time.monotonic() + 25
    while (answer := fleet.gateway.curl_json(PATH, token))[0] == 200:
        assert time.monotonic() < deadline, "a deleted ServiceAccount's token still works"
        time.sleep(0.2)
    assert_unauthorized(answer)
