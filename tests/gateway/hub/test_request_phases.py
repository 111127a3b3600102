"""The phases of one request (``gateway.hub.request``): every move is in ``TRANSITIONS``, and a
request over either front door walks the same path through them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.hub import request as request_module
from gateway.hub.request import (
    ADMITTING,
    BODY,
    DONE,
    GONE,
    TRANSITIONS,
    WAITING,
    LifecycleError,
    Phase,
    Request,
)
from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    Harness,
    Tls,
    get,
    h2tls,  # noqa: F401 - the session fixture
    parse_raw,
    running,
    tls,  # noqa: F401 - the session fixture
)
from tests.support import needs_pure

pytestmark = pytest.mark.timeout(30)

CONFIGMAPS = "/c1/api/v1/namespaces/d/configmaps"


def test_every_phase_has_its_moves_and_every_request_can_end() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert TRANSITIONS[DONE] == frozenset()
    assert all(DONE in moves for phase, moves in TRANSITIONS.items() if phase is not DONE)


async def test_a_move_the_table_does_not_list_is_a_bug(h2tls: Tls) -> None:  # noqa: F811
    async with running(h2tls) as gw:
        request = Request(gw.gateway, GONE)
        assert request.phase is ADMITTING
        with pytest.raises(LifecycleError, match="admitting -> waiting"):
            request._to(WAITING)
        assert request.phase is ADMITTING


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Phase, Phase]]]:
    """Every move any request makes, as (from, to)."""
    needs_pure(request_module)
    seen: list[tuple[Phase, Phase]] = []
    original = request_module.Request._to

    def recorded(self: Request, phase: Phase) -> None:
        before = self.phase
        original(self, phase)
        seen.append((before, phase))

    monkeypatch.setattr(request_module.Request, "_to", recorded)
    yield seen


@pytest.fixture
async def gw(h2tls: Tls) -> AsyncIterator[Harness]:  # noqa: F811
    async with running(h2tls) as harness:
        harness.connect_cluster("c1")
        yield harness


async def over_h1(gw: Harness, path: str, token: str) -> int:
    return parse_raw(await gw.exchange(get(path, token, close=True)))[0]


async def over_h2(gw: Harness, path: str, token: str) -> int:
    client = await H2Client.connect(gw.port, gw.tls.ca_file)
    try:
        sid = client.start(path, token=token)
        response = await client.wait(sid)
        return response.status
    finally:
        await client.close()


@pytest.mark.parametrize("send", [over_h1, over_h2], ids=["h1", "h2"])
async def test_both_doors_walk_the_same_phases(
        gw: Harness, moves: list[tuple[Phase, Phase]], send: object) -> None:
    assert await send(gw, CONFIGMAPS, HUB_TOKEN) == 200  # type: ignore[operator]
    assert moves == [(ADMITTING, BODY), (BODY, WAITING), (WAITING, DONE)]
    moves.clear()
    assert await send(gw, CONFIGMAPS, "") == 401  # type: ignore[operator]
    assert moves == [(ADMITTING, DONE)]  # refused by admission: straight to the end
    moves.clear()
    gw.connect_cluster("c2").refuse_open = RuntimeError("at its stream limit")
    assert await send(gw, "/c2/api/v1/namespaces", HUB_TOKEN) == 503  # type: ignore[operator]
    assert moves == [(ADMITTING, DONE)]  # its tunnel stream could not open
