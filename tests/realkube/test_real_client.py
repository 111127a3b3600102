"""The real client behind a load balancer: Debian's HAProxy in front of the gateway (issue 24).

Two clients on two loopback addresses (curl ``--interface 127.0.0.2`` and ``127.0.0.3``) reach
a gateway through HAProxy. Client A sends bad tokens until the failed-authentication limit
answers 429; then client B sends hub tokens minted a moment ago (never reviewed, so each needs
the hub and meets the limiter).

* Before (no trust; HAProxy in TCP mode without a PROXY header): every connection is
  HAProxy's 127.0.0.1, A's failures are B's, and B's valid tokens get 429.
* After (``--proxy-protocol-from 127.0.0.1``; HAProxy ``send-proxy-v2``): A and B are two
  clients; B's tokens pass, and the real managed kube-apiserver's own audit log shows B's
  address first in ``sourceIPs`` (it reads the X-Forwarded-For the gateway sent), as does the
  gateway's audit line.
* An ingress (HAProxy in HTTP mode, TLS terminated and made again, ``option forwardfor``) with
  ``--forwarded-for-from 127.0.0.1``: A writes a different X-Forwarded-For on every bad attempt
  and is limited all the same (the right-most untrusted entry is HAProxy's own, A's real
  address); B passes.

The figures (attempts, statuses) are printed for the issue note (``-s`` shows them).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realkube.conftest import CLUSTER, PREFIX, Fleet
from tests.realkube.hubproxy import CURL, Gateway, start_gateway
from tests.realkube.loadbalancer import start_front_proxy
from tests.support import LOOPBACK, BackgroundProcess

CLIENT_A, CLIENT_B = "127.0.0.2", "127.0.0.3"
LIMIT = ("--auth-failure-burst", "5", "--auth-failure-rate", "0.05")  # 20 s to earn one back
BAD_ATTEMPTS = 12
FRESH_TOKENS = 3


def curl(ca: Path, port: int, path: str, token: str, source: str, *headers: str) -> int:
    """The HTTP status of one request through the balancer, from ``source``."""
    extra = [arg for header in headers for arg in ("-H", header)]
    done = subprocess.run(
        [CURL, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--interface", source,
         "--cacert", str(ca), "-H", f"Authorization: Bearer {token}", *extra,
         f"https://{LOOPBACK}:{port}{path}"],
        capture_output=True, text=True, timeout=30)
    return int(done.stdout or 0)


@dataclass
class Figures:
    bad: list[int]  # client A's statuses, in order
    good: list[int]  # client B's, each a freshly minted valid token


def attack_then_use(fleet: Fleet, port: int, tag: str, *spoof: str) -> Figures:
    """A sends bad tokens (with ``spoof``: a made-up X-Forwarded-For each time), then B sends
    freshly minted valid ones."""
    ca = fleet.pki / "front-ca" / "ca.crt"  # the gateway's (HAProxy serves the same cert)
    bad = [curl(ca, port, f"/{CLUSTER}/api/v1/namespaces/team/configmaps",
                f"bad-{tag}-{i:03d}-" + "x" * 24, CLIENT_A,
                *(f"X-Forwarded-For: {s}.{i}" for s in spoof))
           for i in range(BAD_ATTEMPTS)]
    tokens = [fleet.hub.create_token("fleet", "alice") for _ in range(FRESH_TOKENS)]
    fleet.tokens.extend(tokens)
    good = [curl(ca, port, f"/{CLUSTER}/api/v1/namespaces/team/configmaps/{tag}-b{i}", token,
                 CLIENT_B) for i, token in enumerate(tokens)]
    return Figures(bad, good)


@dataclass
class Setup:
    gateway: Gateway
    balancer: BackgroundProcess
    port: int


def started(fleet: Fleet, *gateway_args: str, **proxy: object) -> Iterator[Setup]:
    gateway = start_gateway(fleet.group, fleet.pki, fleet.gateway_kubeconfig,
                            fleet.agent_kubeconfig, "--token-cache-ttl", "1s", *LIMIT,
                            *gateway_args)
    balancer, port = start_front_proxy(fleet.group, fleet.root, gateway.front_port, **proxy)
    try:
        # Through the balancer: with --proxy-protocol-from the gateway refuses direct clients.
        deadline = time.monotonic() + 30
        ca = fleet.pki / "front-ca" / "ca.crt"
        while curl(ca, port, f"/{CLUSTER}/version", fleet.alice, LOOPBACK) != 200:
            assert time.monotonic() < deadline, gateway.logs()[-3000:]
            time.sleep(0.2)
        yield Setup(gateway, balancer, port)
    finally:
        for process in (balancer, gateway.agent, gateway.process):
            if process is not None:
                process.stop()


@pytest.fixture
def before(fleet: Fleet) -> Iterator[Setup]:
    yield from started(fleet)


@pytest.fixture
def after(fleet: Fleet) -> Iterator[Setup]:
    yield from started(fleet, "--proxy-protocol-from", LOOPBACK, send_proxy=True)


@pytest.fixture
def ingress(fleet: Fleet) -> Iterator[Setup]:
    pem = fleet.root / "ingress.pem"
    pem.write_text((fleet.pki / "gateway" / "tls.crt").read_text()
                   + (fleet.pki / "gateway" / "tls.key").read_text())
    pem.chmod(0o600)
    yield from started(fleet, "--forwarded-for-from", LOOPBACK,
                       tls=(pem, fleet.pki / "front-ca" / "ca.crt"))


def audit_lines(gateway: Gateway, until: Callable[[list[dict[str, object]]], bool] | None = None,
                timeout: float = 5.0) -> list[dict[str, object]]:
    """The gateway's audit lines so far, read again (bounded by ``timeout``) until ``until``
    holds: a request's line is written after its response, and reaches this process through
    the gateway's output pipe, so the client can have its answer before the line is here."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [json.loads(line) for line in gateway.process.output.splitlines()
                 if line.startswith('{"event":"request"')]
        if until is None or until(lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_before_one_clients_bad_tokens_cost_another_a_429(fleet: Fleet, before: Setup) -> None:
    figures = attack_then_use(fleet, before.port, "before")
    print(f"\nbefore (no trust, HAProxy TCP): A's {BAD_ATTEMPTS} bad tokens -> {figures.bad}; "
          f"B's {FRESH_TOKENS} new valid tokens -> {figures.good}")
    assert figures.bad == [401] * 5 + [429] * (BAD_ATTEMPTS - 5)
    assert figures.good == [429] * FRESH_TOKENS  # the shared address's bucket is empty
    assert {line.get("client") for line in audit_lines(before.gateway)} == {LOOPBACK}


def test_proxy_protocol_v2_separates_the_clients(fleet: Fleet, after: Setup) -> None:
    figures = attack_then_use(fleet, after.port, "after")
    print(f"\nafter (--proxy-protocol-from, HAProxy send-proxy-v2): A's {BAD_ATTEMPTS} bad "
          f"tokens -> {figures.bad}; B's {FRESH_TOKENS} new valid tokens -> {figures.good}")
    assert figures.bad == [401] * 5 + [429] * (BAD_ATTEMPTS - 5)
    assert figures.good == [404] * FRESH_TOKENS  # the managed apiserver's own answer
    def b_lines_of(lines: list[dict[str, object]]) -> list[dict[str, object]]:
        return [line for line in lines if "after-b" in str(line.get("path"))]

    lines = audit_lines(after.gateway, until=lambda ls: len(b_lines_of(ls)) >= FRESH_TOKENS)
    assert {line["client"] for line in lines if line["status"] in (401, 429)} == {CLIENT_A}
    b_lines = b_lines_of(lines)
    assert len(b_lines) == FRESH_TOKENS
    assert all(line["client"] == CLIENT_B and line["proxies"] == [LOOPBACK] for line in b_lines)
    # The managed kube-apiserver read the X-Forwarded-For the gateway sent: B comes first.
    seen = [e for e in fleet.managed.audit_events()
            if "/configmaps/after-b" in e["requestURI"]]
    assert len(seen) == FRESH_TOKENS
    assert all(e["sourceIPs"][0] == CLIENT_B for e in seen), [e["sourceIPs"] for e in seen]
    assert all(e["impersonatedUser"]["username"] == f"{PREFIX}system:serviceaccount:fleet:alice"
               for e in seen)


def test_a_plain_connection_to_a_proxy_protocol_gateway_is_refused(fleet: Fleet,
                                                                    after: Setup) -> None:
    """Around the balancer, from a trusted address, without a header: closed before TLS."""
    status = subprocess.run(
        [CURL, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert",
         str(fleet.pki / "front-ca" / "ca.crt"),
         f"https://{LOOPBACK}:{after.gateway.front_port}/{CLUSTER}/version"],
        capture_output=True, text=True, timeout=30)
    print(f"\na TLS client straight to the gateway (no PROXY header): curl exit "
          f"{status.returncode}: {status.stderr.strip()}")
    assert status.returncode != 0 and status.stdout == "000"
    deadline = time.monotonic() + 5
    while "refused: the connection does not start with a PROXY" not in after.gateway.logs():
        assert time.monotonic() < deadline, after.gateway.logs()[-2000:]
        time.sleep(0.1)


def test_an_ingress_x_forwarded_for_is_read_from_the_right(fleet: Fleet, ingress: Setup) -> None:
    figures = attack_then_use(fleet, ingress.port, "xff", "198.51.100")
    print(f"\ningress (--forwarded-for-from, HAProxy HTTP mode, option forwardfor; A spoofs "
          f"X-Forwarded-For each time): A's {BAD_ATTEMPTS} bad tokens -> {figures.bad}; B's "
          f"{FRESH_TOKENS} new valid tokens -> {figures.good}")
    assert figures.bad == [401] * 5 + [429] * (BAD_ATTEMPTS - 5)
    assert figures.good == [404] * FRESH_TOKENS
    lines = audit_lines(ingress.gateway)
    assert {line["client"] for line in lines if line["status"] in (401, 429)} == {CLIENT_A}
