"""The agent's dialer sleeps until something happens (issue 22): no per-dialer poll, so one
process can hold thousands of agents' sessions. Its session ending, the hub's instances
changing and certificate rotation (tests/tunnel/test_listener_dialer.py) still wake it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support import eventually
from tests.tunnel.pki import PKI, make_pki
from tests.tunnel.test_listener_dialer import dialer, hub
from tunnel import dialer as dialer_module
from tunnel.dialer import HubFanout


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    return make_pki(tmp_path)


async def test_an_idle_dialer_looks_at_its_session_only_when_woken(pki: PKI) -> None:
    async with hub(pki) as listener, dialer(listener.port, lambda: pki.agent_context("c1")) as a:
        await eventually(lambda: a.connected)
        looks = 0
        replaced_because = a._replaced_because

        def counted(*args: Any) -> str | None:
            nonlocal looks
            looks += 1
            return replaced_because(*args)

        a._replaced_because = counted  # type: ignore[method-assign]
        await asyncio.sleep(1.5)  # three periods of the 0.5 s poll this replaced
        assert looks == 0
        session = listener.registry.pick("c1")
        assert session is not None
        first = a.session
        session.close("hub closing")  # the session ends: the dialer is woken and redials
        await eventually(lambda: a.connected and a.session is not first)
        assert looks >= 1


class FakeSession:
    def __init__(self, instance: int, peers: tuple[int, ...]) -> None:
        self.hub_instance = instance
        self.hub_peers = peers
        self.hub_instances = len(peers)
        self.draining = False
        self.closed = False
        self.on_settings: list[Any] = []


class FakeDialer:
    def __init__(self, session: FakeSession) -> None:
        self.session = session
        self.woken = 0

    def _wake(self) -> None:
        self.woken += 1


async def test_an_instance_the_others_stop_listing_is_gone_after_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dialer_module, "GONE_AFTER", 0.3)
    fanout = HubFanout(lambda f: pytest.fail("no dialer is added"))  # type: ignore[arg-type]
    first = FakeDialer(FakeSession(101, (101, 202)))
    second = FakeDialer(FakeSession(202, (101, 202)))
    fanout.dialers = [first, second]  # type: ignore[list-item]
    fanout.instances = 2
    fanout._peers_changed()
    assert not fanout.gone(second, second.session)  # type: ignore[arg-type]
    first.session.hub_peers = (101,)  # 101's Lease listing no longer has 202
    fanout._peers_changed()
    assert not fanout.gone(second, second.session)  # type: ignore[arg-type]
    await asyncio.sleep(0.45)  # no poll: the fan-out's one timer wakes the holders
    assert second.woken >= 1
    assert fanout.gone(second, second.session)  # type: ignore[arg-type]
    assert not fanout.gone(first, first.session)  # type: ignore[arg-type]
    first.session.hub_peers = (101, 202)  # listed again: not gone any more
    fanout._peers_changed()
    assert not fanout.gone(second, second.session)  # type: ignore[arg-type]
    assert fanout._gone_check is None
