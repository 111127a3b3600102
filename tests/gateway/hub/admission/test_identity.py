from __future__ import annotations

import json
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.hub.admission.identity import map_identity
from gateway.wire.identity import (
    MAX_EXTRA_KEYS,
    MAX_EXTRA_VALUES,
    MAX_GROUPS,
    MAX_VALUE,
    Identity,
    IdentityError,
    escape_extra_key,
    impersonation_headers,
)

SA_USER = {
    "username": "system:serviceaccount:team-a:deployer",
    "uid": "8f0e7c1a-0000-4000-8000-000000000001",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"],
    "extra": {
        "authentication.kubernetes.io/pod-name": ["deployer-7d9f"],
        "authentication.kubernetes.io/pod-uid": ["p-1"],
        "authentication.kubernetes.io/credential-id": ["JTI=abc"],
        "scopes.example.com/secret": ["dropped"],
    },
}


def test_rule3_service_account_is_prefixed() -> None:
    identity = map_identity(SA_USER, request_id="r-1")
    assert identity.user == "cluster:hub:system:serviceaccount:team-a:deployer"
    assert identity.groups == (
        "cluster:hub:system:serviceaccounts",
        "cluster:hub:system:serviceaccounts:team-a",
    )
    assert identity.uid == SA_USER["uid"]
    assert identity.request_id == "r-1"


def test_rule3_system_masters_cannot_land_on_reserved_names() -> None:
    identity = map_identity({"username": "system:admin", "groups": ["system:masters"]})
    assert identity.user == "cluster:hub:system:admin"
    assert identity.groups == ("cluster:hub:system:masters",)
    for header, value in impersonation_headers(identity):
        if header in (b"Impersonate-User", b"Impersonate-Group"):
            assert value.startswith(b"cluster:hub:")


def test_rule3_authenticated_and_unauthenticated_groups_dropped() -> None:
    identity = map_identity(
        {"username": "alice", "groups": ["system:authenticated", "system:unauthenticated", "dev"]}
    )
    assert identity.groups == ("cluster:hub:dev",)


def test_duplicate_groups_collapse() -> None:
    assert map_identity({"username": "a", "groups": ["g", "g"]}).groups == ("cluster:hub:g",)


def test_custom_prefix() -> None:
    assert map_identity({"username": "alice"}, prefix="hub1:").user == "hub1:alice"


@pytest.mark.parametrize("prefix", ["", "nocolon", "system:", "system:x:", "a\n:"])
def test_rule3_unsafe_prefix_refused(prefix: str) -> None:
    with pytest.raises(IdentityError):
        map_identity({"username": "alice"}, prefix=prefix)


def test_extras_allow_listed_and_rekeyed() -> None:
    identity = map_identity(SA_USER)
    assert identity.extra == {
        "hubproxy.dev/hub-pod-name": ("deployer-7d9f",),
        "hubproxy.dev/hub-pod-uid": ("p-1",),
        "hubproxy.dev/hub-credential-id": ("JTI=abc",),
    }


def test_custom_extra_allow() -> None:
    identity = map_identity(
        {"username": "a", "extra": {"example.com/team": ["x", "y"]}},
        extra_allow={"example.com/team": "hubproxy.dev/hub-team"},
    )
    assert identity.extra == {"hubproxy.dev/hub-team": ("x", "y")}


@pytest.mark.parametrize(
    "user_info",
    [
        {"username": ""},
        {},
        {"username": "a\nb"},
        {"username": "a\x00"},
        {"username": "a\x7f"},
        {"username": "a\u0085"},
        {"username": "x" * (MAX_VALUE + 1)},
        {"username": "a", "groups": ["g\r"]},
        {"username": "a", "groups": [f"g{i}" for i in range(MAX_GROUPS + 1)]},
        {"username": "a", "groups": "not-a-list"},
        {"username": "a", "uid": "u\n"},
        {"username": "a", "extra": {"authentication.kubernetes.io/pod-name": ["v\n"]}},
        {
            "username": "a",
            "extra": {"authentication.kubernetes.io/pod-name": ["v"] * (MAX_EXTRA_VALUES + 1)},
        },
        {"username": "a", "extra": {"authentication.kubernetes.io/pod-name": "v"}},
    ],
)
def test_invalid_values_refused(user_info: dict[str, object]) -> None:
    with pytest.raises(IdentityError):
        map_identity(user_info)


def test_too_many_extra_keys_refused() -> None:
    allow = {f"k{i}": f"hubproxy.dev/k{i}" for i in range(MAX_EXTRA_KEYS + 1)}
    extra = {f"k{i}": ["v"] for i in range(MAX_EXTRA_KEYS + 1)}
    with pytest.raises(IdentityError):
        map_identity({"username": "a", "extra": extra}, extra_allow=allow)


def test_identity_error_never_echoes_the_value() -> None:
    with pytest.raises(IdentityError) as info:
        map_identity({"username": "secret-value\n"})
    assert "secret-value" not in str(info.value)


# --- metadata ------------------------------------------------------------------------------------


def test_metadata_round_trip() -> None:
    identity = map_identity(SA_USER, request_id="r-1")
    data = identity.to_metadata()
    assert b" " not in data.replace(b"deployer-7d9f", b"")  # compact
    obj = json.loads(data)
    assert obj["v"] == 1
    assert "passthrough" not in obj
    assert Identity.from_metadata(data) == identity


def test_passthrough_metadata() -> None:
    identity = Identity(user="", groups=(), uid="", extra={}, request_id="r", passthrough=True)
    back = Identity.from_metadata(identity.to_metadata())
    assert back.passthrough and back.user == ""
    assert impersonation_headers(back) == []


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{}",
        b"not json",
        b'{"user": ""}',
        b'{"v":2,"user":"cluster:hub:a"}',
        b'{"v":1,"user":""}',
        b'{"v":1,"user":"cluster:hub:a","groups":"g"}',
        b'{"v":1,"user":"cluster:hub:a","groups":[1]}',
        b'{"v":1,"user":"cluster:hub:a","extra":{"k":"v"}}',
        b'{"v":1,"user":"cluster:hub:a","extra":{"K":["v"]}}',
        b'{"v":1,"user":"cluster:hub:a","rid":5}',
        b'{"v":1,"user":"cluster:hub:a","more":1}',
        b'{"v":1,"user":"cluster:hub:a\\n"}',
        b'{"v":1,"user":"system:admin"}',
        b'{"v":1,"user":"cluster:hub:a","groups":["system:masters"]}',
        b'{"v":1,"user":"cluster:hub:a","passthrough":false}',
        b'{"v":1,"user":"cluster:hub:a","passthrough":true}',
        b'{"v":1,"user":"cluster:hub:a","extra":{"hubproxy.dev/request-id":["x"]}}',
        b"[1]",
        b"\xff\xfe",
        b'{"v":1,"user":"' + b"a" * 40000 + b'"}',
    ],
)
def test_rule1_agent_refuses_invalid_metadata(data: bytes) -> None:
    with pytest.raises(ValueError):
        Identity.from_metadata(data)


# --- impersonation headers -----------------------------------------------------------------------


def test_impersonation_headers_order_and_values() -> None:
    identity = map_identity(SA_USER, request_id="r-1")
    assert impersonation_headers(identity) == [
        (b"Impersonate-User", b"cluster:hub:system:serviceaccount:team-a:deployer"),
        (b"Impersonate-Group", b"cluster:hub:system:serviceaccounts"),
        (b"Impersonate-Group", b"cluster:hub:system:serviceaccounts:team-a"),
        (b"Impersonate-Uid", b"8f0e7c1a-0000-4000-8000-000000000001"),
        (b"Impersonate-Extra-hubproxy.dev%2Fhub-pod-name", b"deployer-7d9f"),
        (b"Impersonate-Extra-hubproxy.dev%2Fhub-pod-uid", b"p-1"),
        (b"Impersonate-Extra-hubproxy.dev%2Fhub-credential-id", b"JTI=abc"),
        (b"Impersonate-Extra-hubproxy.dev%2Frequest-id", b"r-1"),
    ]


def test_no_uid_no_request_id() -> None:
    assert impersonation_headers(map_identity({"username": "a"})) == [
        (b"Impersonate-User", b"cluster:hub:a")
    ]


@pytest.mark.parametrize(
    ("key", "escaped"),
    [
        ("example.com/key", b"example.com%2Fkey"),
        ("a%b", b"a%25b"),
        ("a b", b"a%20b"),
        ("a:b", b"a%3Ab"),
        ("caf\u00e9", b"caf%C3%A9"),
        ("ok-_.~!#$&'*+^`|", b"ok-_.~!#$&'*+^`|"),
    ],
)
def test_extra_key_escaping_matches_client_go(key: str, escaped: bytes) -> None:
    assert escape_extra_key(key) == escaped


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40).map(str.lower))
def test_extra_key_escape_decodes_like_kube_apiserver(key: str) -> None:
    # kube-apiserver: url.PathUnescape(strings.ToLower(headerSuffix)).
    escaped = escape_extra_key(key)
    assert all(0x21 <= b < 0x7F and b not in b"()<>@,;:\\\"/[]?={}" for b in escaped)
    assert unquote(escaped.decode("ascii").lower(), errors="strict") == key


def test_values_are_raw_utf8() -> None:
    identity = map_identity({"username": "jos\u00e9", "groups": ["\u00e9quipe"]})
    headers = dict(impersonation_headers(identity))
    assert headers[b"Impersonate-User"] == "cluster:hub:jos\u00e9".encode()
