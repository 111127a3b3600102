"""Refused agents, seen from both ends (issue 12 item 5), over real mTLS on 127.0.0.1.

The listener classifies every refused connection by reason, logs certificate trouble at
WARNING with the peer address (throttled), and tells the agent why: the TLS alert OpenSSL
produced (kept and sent by the listener) or, for a certificate naming no cluster, a GOAWAY.
The dialer logs that reason once instead of "connected" / "session ended".
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs.files import write_pair
from certs.issue import _issue_leaf, issue_agent
from certs.tls import TLS1_2, client_context
from tests.support import eventually
from tests.tunnel.pki import PKI, make_pki
from tests.tunnel.test_listener_dialer import dialer, hub
from tunnel.connection import ALPN
from tunnel.handshake import (
    EXPIRED,
    NOT_YET_VALID,
    UNKNOWN_CA,
    LogThrottle,
    classify_hub_failure,
    describe_hub_refusal,
)


@pytest.fixture
def pki(tmp_path) -> PKI:
    return make_pki(tmp_path)


def context_for(pki: PKI, name: str, issued) -> ssl.SSLContext:
    d = pki.root / "agents" / name
    d.mkdir(parents=True)
    write_pair(d, issued, pki.tunnel_ca.cert, force=False)
    return client_context(d / "ca.crt", d / "tls.crt", d / "tls.key", min_version=TLS1_2,
                          alpn_protocols=[ALPN])


def agent_says(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused this agent" in r.getMessage()
            and r.levelno == logging.WARNING]


def hub_says(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "agent connection from" in r.getMessage()
            and r.levelno == logging.WARNING]


@pytest.mark.parametrize("case", ["expired", "not-yet-valid", "other-ca", "no-uri-san",
                                  "no-cert"])
async def test_refusal_reason_reaches_hub_log_metrics_and_agent(
        pki: PKI, case: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hubproxy.tunnel")
    now = datetime.datetime.now(datetime.UTC)
    ca = pki.tunnel_ca
    if case == "expired":
        context = context_for(pki, case, issue_agent(ca, "c1", days=1,
                                                     valid_from=now - datetime.timedelta(days=3)))
        reason, hub_text, agent_text = EXPIRED, "has expired", "our certificate has expired"
    elif case == "not-yet-valid":
        context = context_for(pki, case, issue_agent(ca, "c1", days=1,
                                                     valid_from=now + datetime.timedelta(days=2)))
        reason, hub_text, agent_text = (NOT_YET_VALID, "not valid yet",
                                        "the hub refused our certificate")
    elif case == "other-ca":
        context = context_for(pki, case, issue_agent(pki.other_ca, "c1", days=1))
        reason, hub_text, agent_text = (UNKNOWN_CA, "not signed by the tunnel CA",
                                        "not signed by a CA the hub trusts")
    elif case == "no-uri-san":
        # Signed by the tunnel CA for client auth, but no hubproxy://cluster/ URI SAN.
        leaf = _issue_leaf(ca, "c1", [x509.DNSName("c1.example")],
                           ExtendedKeyUsageOID.CLIENT_AUTH, days=1, key_type="ec")
        context = context_for(pki, case, leaf)
        reason, hub_text, agent_text = ("wrong_name", "names no valid cluster",
                                        "must name exactly one cluster")
    else:
        context = pki.bare_client_context()
        reason, hub_text, agent_text = ("no_certificate", "sent no client certificate",
                                        "we sent none")
    async with hub(pki) as listener, dialer(listener.port, lambda: context) as agent:
        await eventually(lambda: listener.handshake_failures[reason] >= 3)
        await eventually(lambda: agent_says(caplog))
        assert not listener.sessions and agent.connects == 0
        assert agent.last_refusal is not None and agent_text in agent.last_refusal
    # Hub: one WARNING for several failures from one host, with the peer address and reason.
    (line,) = hub_says(caplog)
    assert f"({reason})" in line and hub_text in line and "127.0.0.1:" in line
    # Agent: one WARNING with the hub's reason, never "connected to the hub".
    (said,) = agent_says(caplog)
    assert agent_text in said, said
    assert not any("connected to the hub" in r.getMessage() for r in caplog.records)


async def test_good_agent_counts_no_failure(pki: PKI) -> None:
    async with hub(pki) as listener, dialer(listener.port, lambda: pki.agent_context("c1")):
        await eventually(lambda: listener.registry.clusters() == {"c1"})
        assert sum(listener.handshake_failures.values()) == 0


async def test_plain_tcp_probes_are_counted_not_logged_as_certificate_trouble(
        pki: PKI, caplog: pytest.LogCaptureFixture) -> None:
    """Load balancer TCP checks connect and close: counted (aborted), no WARNING."""
    caplog.set_level(logging.DEBUG, logger="hubproxy.tunnel")
    async with hub(pki) as listener:
        for _ in range(3):
            _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.close()
        await eventually(lambda: listener.handshake_failures["aborted"] == 3)
        assert not hub_says(caplog)


def test_log_throttle_allows_one_line_per_key_per_interval() -> None:
    now = [0.0]
    throttle = LogThrottle(interval=60, max_keys=2, clock=lambda: now[0])
    assert throttle.allow("a") == (True, 0)
    assert throttle.allow("a") == (False, 0)
    assert throttle.allow("b") == (True, 0)  # another key is not held back
    now[0] = 59.9
    assert throttle.allow("a") == (False, 0)
    now[0] = 60.0
    assert throttle.allow("a") == (True, 2)  # says how many were left out
    assert throttle.allow("c") == (True, 0)  # a third key evicts the oldest ("b")
    assert throttle.allow("b") == (True, 0)
    assert len(throttle._last) == 2


def test_classification_of_exceptions_without_a_handshake() -> None:
    assert classify_hub_failure(TimeoutError()).reason == "timeout"
    assert classify_hub_failure(ConnectionResetError()).reason == "aborted"
    plain = ssl.SSLError(1, "[SSL: HTTP_REQUEST] http request")
    plain.reason = "HTTP_REQUEST"  # what OpenSSL sets for an HTTP client on a TLS port
    assert classify_hub_failure(plain).reason == "protocol"
    assert describe_hub_refusal(ConnectionResetError(), None) is None
    assert describe_hub_refusal(None, "names 0") == "the hub refused our certificate: names 0"
