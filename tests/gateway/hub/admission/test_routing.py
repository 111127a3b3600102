from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.hub.admission.routing import (
    ClusterRoute,
    RouteError,
    ServiceRef,
    is_cluster_name,
    route,
)


def refused(target: bytes) -> RouteError:
    with pytest.raises(RouteError) as info:
        route(target)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("target", "cluster", "upstream"),
    [
        (b"/c1/api/v1/pods", "c1", b"/api/v1/pods"),
        (b"/c1/api/v1/pods?watch=1&rv=10", "c1", b"/api/v1/pods?watch=1&rv=10"),
        (b"/c1", "c1", b"/"),
        (b"/c1/", "c1", b"/"),
        (b"/c1?timeout=32s", "c1", b"/?timeout=32s"),
        (b"/my-cluster.example.com/version", "my-cluster.example.com", b"/version"),
        (b"/c1/api/v1/pods?labelSelector=a%2Fb%3Dc", "c1", b"/api/v1/pods?labelSelector=a%2Fb%3Dc"),
        (b"/c1/apis/", "c1", b"/apis/"),
        (b"/c1/api/v1/namespaces/a%252Fb", "c1", b"/api/v1/namespaces/a%252Fb"),
        (b"/c1/api/x?q=..&r=%2e%2e", "c1", b"/api/x?q=..&r=%2e%2e"),
        (b"/c1/api/v1/pods/a.b..c", "c1", b"/api/v1/pods/a.b..c"),
        (b"/c1/apis/x/v1/...", "c1", b"/apis/x/v1/..."),
        (b"/c1/api/%41%42", "c1", b"/api/%41%42"),
        (
            b"/c1/api/v1/namespaces/default/services/https:web:443/proxy/x",
            "c1",
            b"/api/v1/namespaces/default/services/https:web:443/proxy/x",
        ),
    ],
)
def test_routes_byte_for_byte(target: bytes, cluster: str, upstream: bytes) -> None:
    assert route(target) == ClusterRoute(cluster, upstream, None)


@pytest.mark.parametrize(
    ("target", "service", "upstream"),
    [
        (
            b"/c1/api/v1/namespaces/monitoring/services/prometheus:9090/proxy-service/api/v1/query"
            b"?query=up",
            ServiceRef("monitoring", "prometheus", 9090, "http"),
            b"/api/v1/query?query=up",
        ),
        (
            b"/c1/api/v1/namespaces/ns/services/https:web:8443/proxy-service/",
            ServiceRef("ns", "web", 8443, "https"),
            b"/",
        ),
        (
            b"/c1/api/v1/namespaces/ns/services/http:web:80/proxy-service",
            ServiceRef("ns", "web", 80, "http"),
            b"/",
        ),
        (
            b"/c1/api/v1/namespaces/ns/services/web:65535/proxy-service?x=1",
            ServiceRef("ns", "web", 65535, "http"),
            b"/?x=1",
        ),
        (
            b"/c1/api/v1/namespaces/ns/services/web:1/proxy-service/a%2Fb//c",
            ServiceRef("ns", "web", 1, "http"),
            b"/a%2Fb//c",
        ),
    ],
)
def test_service_form(target: bytes, service: ServiceRef, upstream: bytes) -> None:
    result = route(target)
    assert result.cluster == "c1"
    assert result.service == service
    assert result.upstream_target == upstream


@pytest.mark.parametrize(
    "spec",
    [
        b"web",
        b"web:",
        b"web:0",
        b"web:65536",
        b"web:080",
        b"web:8o",
        b"web:+80",
        b"web:-1",
        b"web:1:2:3",
        b"ftp:web:21",
        b"HTTP:web:80",
        b"Web:80",
        b"-web:80",
        b"web-:80",
        b"w.eb:80",
        b"%77eb:80",
        b":80",
        b"a" * 64 + b":80",
    ],
)
def test_bad_service_spec_refused(spec: bytes) -> None:
    refused(b"/c1/api/v1/namespaces/ns/services/" + spec + b"/proxy-service/x")


@pytest.mark.parametrize("ns", [b"NS", b"a.b", b"-a", b"a_b", b"%6es", b""])
def test_bad_service_namespace_refused(ns: bytes) -> None:
    refused(b"/c1/api/v1/namespaces/" + ns + b"/services/web:80/proxy-service/x")


@pytest.mark.parametrize(
    "target",
    [
        b"/c1/api/../secrets",
        b"/c1/api/./x",
        b"/c1/..",
        b"/c1/.",
        b"/c1/api/..?x",
        b"/c1/api/%2e%2e/x",
        b"/c1/api/%2E%2E/x",
        b"/c1/api/.%2e/x",
        b"/c1/api/%2e./x",
        b"/c1/api/%2E.",
        b"/c1/api/%2e/x",
        b"/c1/api/v1/namespaces/ns/services/web:80/proxy-service/../../x",
        b"/c1/api/v1/namespaces/ns/services/web:80/proxy-service/%2e%2e",
    ],
)
def test_rule6_dot_segments_refused_anywhere(target: bytes) -> None:
    assert "dot-segment" in str(refused(target))


@pytest.mark.parametrize(
    "target",
    [
        b"/c1/api\\x",
        b"/c1/api%5cx",
        b"/c1/api%5Cx",
        b"/c1/api%00",
        b"/c1/api?x=%00",
        b"/c1/api\x00",
        b"/c1%2fapi",
        b"/c1%2Fapi/x",
        b"/%2e%2e/api",
        b"/../api",
        b"//api",
        b"/",
        b"/?x",
        b"/C1/api",
        b"/c_1/api",
        b"/-c1/api",
        b"/c1-/api",
        b"/c1../api",
        b"/c1.%2e/api",
        b"/" + b"a" * 64 + b"/api",
        b"/c1/api#frag",
        b"http://c1/api",
        b"https://gw/c1/api",
        b"c1:443",
        b"*",
        b"",
    ],
)
def test_rule6_bad_targets_refused(target: bytes) -> None:
    refused(target)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        (b"/c1/api/v1/namespaces/demo%2Fconfigmaps", "encoded slash"),
        (b"/c1/api/v1/namespaces/demo%2fconfigmaps", "encoded slash"),
        (b"/c1/api%2Fv1/pods", "encoded slash"),
        (b"/c1/api/v1/pods/a%2e", "encoded dot"),
        (b"/c1/api/v1/pods/a%2Eb", "encoded dot"),
        (b"/c1/apis/apps/v1/namespaces/x/deployments/web%2E", "encoded dot"),
        (b"/c1/api/v1/pods/a%5cb", "backslash"),
        (b"/c1//api", "empty segment"),
        (b"/c1/api//v1/pods", "empty segment"),
        (b"/c1/api/v1/namespaces//pods", "empty segment"),
        (b"/c1/api/v1/pods//", "empty segment"),
        # not the service form (the marker is encoded), so the API-form rules apply
        (b"/c1/api/v1/namespaces/ns/services/web:80/proxy-service%2Fx", "encoded slash"),
        (b"/c1/api/v1/namespaces/ns/services/web:80%2Fproxy-service/x", "encoded slash"),
    ],
)
def test_rule6_encoded_separators_and_empty_segments_refused_in_api_form(
    target: bytes, reason: str
) -> None:
    assert reason in str(refused(target))


@pytest.mark.parametrize(
    ("remainder", "upstream"),
    [
        (b"a%2Fb", b"/a%2Fb"),
        (b"a%2fb/c%2Ed", b"/a%2fb/c%2Ed"),
        (b"x//y", b"/x//y"),
        (b"", b"/"),
    ],
)
def test_service_form_remainder_passes_untouched(remainder: bytes, upstream: bytes) -> None:
    prefix = b"/c1/api/v1/namespaces/ns/services/web:80/proxy-service/"
    result = route(prefix + remainder + b"?q=%2F")
    assert result.service == ServiceRef("ns", "web", 80, "http")
    assert result.upstream_target == upstream + b"?q=%2F"


def test_cluster_name_rules() -> None:
    assert is_cluster_name(b"a")
    assert is_cluster_name(b"a.b-c.d")
    assert is_cluster_name(b".".join([b"a" * 63] * 3) + b"." + b"a" * 61)
    assert not is_cluster_name(b".".join([b"a" * 63] * 4) + b".a")  # 256 > 253
    assert not is_cluster_name(b"a..b")
    assert not is_cluster_name(b"")


# --- properties ----------------------------------------------------------------------------------

_LABEL = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?\Z")
_CLUSTER = st.lists(_LABEL, min_size=1, max_size=3).map(".".join)
_PATH_BYTE = st.sampled_from([*b"abcAZ09-._~%2eE5cC/!$&'()*+,;=:@\\?#", 0x00, 0x2F, 0x2E])
_REST = st.lists(_PATH_BYTE, max_size=40).map(bytes)


def _has_dot_segment(path: bytes) -> bool:
    return any(
        s.lower().replace(b"%2e", b".") in (b".", b"..") for s in path.split(b"/")
    )


@settings(max_examples=500, deadline=None)
@given(cluster=_CLUSTER, rest=_REST)
def test_property_accepted_round_trips_and_no_dot_segment_passes(cluster: str, rest: bytes) -> None:
    target = b"/" + cluster.encode() + b"/" + rest
    try:
        result = route(target)
    except RouteError:
        return
    path = target.split(b"?", 1)[0]
    assert not _has_dot_segment(path)
    assert b"\\" not in path and b"%5c" not in path.lower()
    assert b"%00" not in target and b"\x00" not in target and b"#" not in target
    assert result.cluster == cluster
    if result.service is None:
        assert b"/" + cluster.encode() + result.upstream_target == target
        api_path = result.upstream_target.split(b"?", 1)[0]
        assert b"%2f" not in api_path.lower() and b"%2e" not in api_path.lower()
        assert b"//" not in api_path
    else:
        tail = target[target.find(b"/proxy-service") + len(b"/proxy-service") :]
        assert result.upstream_target == (tail if tail.startswith(b"/") else b"/" + tail)


@settings(max_examples=300, deadline=None)
@given(
    cluster=_CLUSTER,
    before=st.lists(st.from_regex(r"\A[a-z0-9%]{0,6}\Z"), max_size=3),
    dots=st.sampled_from(
        [b".", b"..", b"%2e", b"%2E", b"%2e%2e", b"%2E%2e", b".%2e", b"%2E.", b"%2e."]
    ),
    after=st.lists(st.from_regex(r"\A[a-z0-9]{0,6}\Z"), max_size=3),
    query=st.sampled_from([b"", b"?a=b", b"?x=.."]),
)
def test_property_dot_segments_never_pass(
    cluster: str, before: list[str], dots: bytes, after: list[str], query: bytes
) -> None:
    segments = [*(s.encode() for s in before), dots, *(s.encode() for s in after)]
    target = b"/" + cluster.encode() + b"/" + b"/".join(segments) + query
    with pytest.raises(RouteError):
        route(target)


@settings(max_examples=300, deadline=None)
@given(
    cluster=_CLUSTER,
    rest=st.from_regex(rb"\A(/[A-Za-z0-9_~%-]{1,8}){0,5}(\?[A-Za-z0-9=&%.]{0,12})?\Z"),
)
def test_property_plain_paths_forward_exactly(cluster: str, rest: bytes) -> None:
    path = rest.split(b"?", 1)[0].lower()
    assume(b"%00" not in rest and b"%5c" not in path)
    assume(b"%2f" not in path and b"%2e" not in path)
    assume(not re.search(rb"/(%2[eE]){1,2}(/|$|\?)", rest))
    target = b"/" + cluster.encode() + rest
    result = route(target)
    expected = rest if rest.startswith(b"/") else b"/" + rest
    if result.service is None:
        assert result.upstream_target == expected


def test_rule7_cluster_names_remembered_are_bounded() -> None:
    """A first segment too long to be a cluster name is refused without being remembered."""
    from gateway.hub.admission import routing

    before = routing._checked_name.cache_info().currsize
    with pytest.raises(RouteError):
        route(b"/" + b"a" * 10_000 + b"/api")
    assert routing._checked_name.cache_info().currsize == before
    assert route(b"/c1.example/api").cluster == "c1.example"
    assert route(b"/c1.example/api").cluster == "c1.example"
