"""Agent identity from certificates, the registry, backoff and the target policy."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from certs.issue import create_ca, issue_agent, issue_server
from tunnel.backoff import Backoff
from tunnel.errors import OpenErrorCode, OpenRefused
from tunnel.identity import AgentIdentityError, cluster_from_certificate
from tunnel.policy import ServiceRule, TargetPolicy, forbidden_address
from tunnel.registry import SessionRegistry
from tunnel.targets import KubeAPITarget, ServiceTarget, TCPTarget

CA = create_ca("ca", days=1)


def der(issued) -> bytes:
    return issued.cert.public_bytes(Encoding.DER)


def test_rule4_cluster_comes_only_from_the_uri_san() -> None:
    assert cluster_from_certificate(der(issue_agent(CA, "cluster1", days=1))) == "cluster1"
    # A serving certificate whose CN/DNS names look like a cluster names none.
    with pytest.raises(AgentIdentityError, match="names 0"):
        cluster_from_certificate(der(issue_server(CA, "cluster1", ["cluster1"], days=1)))
    with pytest.raises(AgentIdentityError, match="no client certificate"):
        cluster_from_certificate(None)
    with pytest.raises(AgentIdentityError, match="unreadable"):
        cluster_from_certificate(b"not a certificate")


class FakeSession:
    def __init__(self, streams: int, draining: bool = False, closed: bool = False) -> None:
        self.active_streams, self.draining, self.closed = streams, draining, closed


def test_registry_picks_least_loaded_usable_session_and_reports_clusters() -> None:
    registry = SessionRegistry()
    events: list[tuple[str, bool]] = []
    registry.subscribe(lambda cluster, up: events.append((cluster, up)))
    busy, idle, draining = FakeSession(5), FakeSession(1), FakeSession(0, draining=True)
    for session in (busy, idle, draining):
        registry.add("c1", session)
    assert registry.pick("c1") is idle
    assert registry.pick("c2") is None
    idle.closed = True
    assert registry.pick("c1") is busy
    assert registry.clusters() == {"c1"}
    for session in (busy, idle, draining):
        registry.remove("c1", session)
    registry.remove("c1", busy)  # twice: harmless
    assert events == [("c1", True), ("c1", False)]
    assert registry.clusters() == frozenset()


def test_backoff_full_jitter_grows_caps_and_resets_after_stable_session() -> None:
    backoff = Backoff(base=1.0, cap=8.0, stable_after=30.0, rand=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    backoff.connected(100.0)
    backoff.disconnected(110.0)  # short-lived: keep growing
    assert backoff.next_delay() == 8.0
    backoff.connected(200.0)
    backoff.disconnected(240.0)  # stable: start over
    assert backoff.next_delay() == 1.0
    jittered = Backoff(base=1.0, cap=8.0, rand=lambda: 0.25)
    assert jittered.next_delay() == 0.25


def test_service_rule_parse() -> None:
    assert ServiceRule.parse("monitoring/prometheus:9090") == ServiceRule(
        "monitoring", "prometheus", 9090)
    for bad in ("prometheus:9090", "ns/name", "ns/name:http", "ns/Name:80", "ns/n:0", "a/b:70000"):
        with pytest.raises(ValueError):
            ServiceRule.parse(bad)


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "::1", "169.254.169.254", "fd00:ec2::254", "0.0.0.0", "224.0.0.1",
     "::ffff:127.0.0.1", "fe80::1"],
)
def test_forbidden_addresses(address: str) -> None:
    assert forbidden_address(address)


async def test_rule4_policy_default_deny_and_typed_refusals() -> None:
    policy = TargetPolicy(
        kube_api=("10.0.0.1", 443),
        allow_services=[ServiceRule.parse("monitoring/prometheus:9090")],
        service_address_overrides={("monitoring", "prometheus", 9090): ("127.0.0.1", 19090)},
    )
    resolved = await policy.resolve(KubeAPITarget())
    assert (resolved.host_ip, resolved.port, resolved.tls) == ("10.0.0.1", 443, True)
    for target in (ServiceTarget("monitoring", "prometheus", 9091),
                   ServiceTarget("kube-system", "prometheus", 9090),
                   TCPTarget("10.0.0.5", 22)):
        with pytest.raises(OpenRefused) as refused:
            await policy.resolve(target)
        assert refused.value.code is OpenErrorCode.DENIED
    # Allow-listed, but it resolves to loopback: refused unless loopback is allowed.
    with pytest.raises(OpenRefused) as refused:
        await policy.resolve(ServiceTarget("monitoring", "prometheus", 9090))
    assert refused.value.code is OpenErrorCode.DENIED
    policy.allow_loopback = True
    resolved = await policy.resolve(ServiceTarget("monitoring", "prometheus", 9090, "https"))
    assert (resolved.host_ip, resolved.port, resolved.tls, resolved.server_hostname) == (
        "127.0.0.1", 19090, True, "prometheus.monitoring.svc")


async def test_resolve_now_answers_only_what_needs_no_lookup() -> None:
    policy = TargetPolicy(kube_api=("10.0.0.1", 443),
                          allow_services=[ServiceRule.parse("monitoring/prometheus:9090")],
                          allow_tcp=[("10.0.0.5", 22)])
    assert policy.resolve_now(KubeAPITarget()) == await policy.resolve(KubeAPITarget())
    for target in (ServiceTarget("monitoring", "prometheus", 9090), TCPTarget("10.0.0.5", 22)):
        assert policy.resolve_now(target) is None
    assert TargetPolicy(kube_api=None).resolve_now(KubeAPITarget()) is None


async def test_policy_resolves_once_to_the_dialled_address() -> None:
    policy = TargetPolicy(kube_api=None, allow_tcp=[("localhost", 5000)], allow_loopback=True)
    resolved = await policy.resolve(TCPTarget("localhost", 5000))
    assert resolved.host_ip in ("127.0.0.1", "::1")
    with pytest.raises(OpenRefused) as refused:
        await policy.resolve(KubeAPITarget())
    assert refused.value.code is OpenErrorCode.DENIED
    unresolvable = TargetPolicy(kube_api=None, allow_tcp=[("no-such-host.invalid", 1)])
    with pytest.raises(OpenRefused) as refused:
        await unresolvable.resolve(TCPTarget("no-such-host.invalid", 1))
    assert refused.value.code in (OpenErrorCode.UNREACHABLE, OpenErrorCode.TIMEOUT)
