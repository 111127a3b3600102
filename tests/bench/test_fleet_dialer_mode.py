"""``bench.fleetagents.slow_session_watch``: the fleet benchmark says which dialer its simulated
agents run, and slows only a dialer that polls its sessions (issue 22's before figures)."""

from __future__ import annotations

import pytest

import tunnel.dialer as dialer
from bench.fleetagents import SLOWED_WATCH_INTERVAL, slow_session_watch


def test_the_event_driven_dialer_runs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(dialer, "WATCH_INTERVAL", raising=False)
    assert slow_session_watch() == "dialer: event-driven (no session watch poll), run unchanged"
    assert not hasattr(dialer, "WATCH_INTERVAL")


def test_a_polling_dialer_is_slowed_and_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dialer, "WATCH_INTERVAL", 0.5, raising=False)
    note = slow_session_watch()
    assert dialer.WATCH_INTERVAL == SLOWED_WATCH_INTERVAL  # type: ignore[attr-defined]
    assert note.startswith("dialer: polling") and "from 0.5 s to 2 s" in note


def test_a_slow_enough_poll_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dialer, "WATCH_INTERVAL", 5.0, raising=False)
    assert slow_session_watch() == "dialer: polling every 5 s, run unchanged"
    assert dialer.WATCH_INTERVAL == 5.0  # type: ignore[attr-defined]
