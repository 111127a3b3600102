"""Issue 14, security hardening: each test attacks the gateway through its real TLS front door
(the in-process harness) or a real gateway process, and asserts on what a managed cluster would
have received (nothing, for a refusal) and on the exact answer."""

from __future__ import annotations

import json

import pytest

from tests.gateway.hub.test_frontdoor_harness import (
    Harness,
    get,
    parse_raw,
    tls,  # noqa: F401
)
from tests.gateway.hub.test_frontdoor_harness import gw as gw

pytestmark = pytest.mark.timeout(60)


def status_of(data: bytes) -> tuple[int, dict]:
    status, _, body = parse_raw(data)
    obj = json.loads(body)
    assert obj["kind"] == "Status" and obj["code"] == status
    return status, obj


# --- encoded path separators (issue 14 item 2) --------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/c1/api/v1/namespaces/demo%2Fconfigmaps",
        "/c1/api/v1/namespaces/demo%2fconfigmaps",
        "/c1/api/v1/namespaces/demo%5Cconfigmaps",
        "/c1/api/v1/namespaces/demo/configmaps/x%2E",
        "/c1/api/v1/namespaces/%2E%2E/secrets",
        "/c1/api/v1//secrets",
        "/c1//api/v1/secrets",
    ],
)
async def test_rule6_encoded_separators_and_empty_segments_refused(gw: Harness, path: str
                                                                   ) -> None:
    status, obj = status_of(await gw.exchange(get(path, close=True)))
    assert status == 400 and obj["reason"] == "BadRequest"
    assert gw.streams() == []  # nothing reached the managed cluster


async def test_service_form_remainder_forwarded_untouched(gw: Harness) -> None:
    path = "/c1/api/v1/namespaces/ns/services/web:80/proxy-service/files/a%2Fb//c%2E?q=%2F"
    status, _, body = parse_raw(await gw.exchange(get(path, close=True)))
    assert status == 200
    assert json.loads(body)["target"] == "/files/a%2Fb//c%2E?q=%2F"


async def test_query_may_encode_slashes(gw: Harness) -> None:
    path = "/c1/api/v1/pods?labelSelector=app%3Dweb%2Cteam%2Fx"
    status, _, body = parse_raw(await gw.exchange(get(path, close=True)))
    assert status == 200
    assert json.loads(body)["target"] == "/api/v1/pods?labelSelector=app%3Dweb%2Cteam%2Fx"
