"""The redial rule of :mod:`tunnel.redial`, pure: free redials sized by the chance that a dial
through a uniform balancer reaches a missing instance; a search starts again when it changes."""

from __future__ import annotations

from tunnel.redial import REDIAL_DELAY, REDIAL_DELAY_CAP, RedialBackoff, Search


def low(a: float, b: float) -> float:
    return a


def delays(backoff: RedialBackoff, search: Search, misses: int) -> list[float]:
    return [backoff.missed(search) for _ in range(misses)]


def test_listed_instances_get_the_dials_a_uniform_balancer_needs_at_99_9_percent() -> None:
    # 0.75 ** 25 < 0.001 <= 0.75 ** 24: the last of four, reached 999 times in 1000.
    assert Search(4, 1, True).free_redials == 25
    assert Search(2, 1, True).free_redials == 10
    assert Search(4, 2, True).free_redials == 10
    assert Search(64, 1, True).free_redials == 439


def test_a_listed_search_keeps_the_base_delay_for_its_free_redials_then_doubles_per_expected_search(
) -> None:
    backoff = RedialBackoff(uniform=low)
    base = REDIAL_DELAY[0]
    got = delays(backoff, Search(4, 1, True, frozenset({4})), 25 + 8 + 1)
    assert got[:25] == [base] * 25
    # Then one doubling per 4 further misses (four dials: one expected search for 1 in 4).
    assert got[25:29] == [base * 2] * 4 and got[29:33] == [base * 4] * 4
    assert got[33] == base * 8


def test_a_bare_count_gets_one_expected_search_then_doubles_at_every_miss() -> None:
    # A hub announcing 3 with 2 held: 3 free redials (the rule before listed sets), then 2x, 4x...
    backoff = RedialBackoff(uniform=low)
    base = REDIAL_DELAY[0]
    assert delays(backoff, Search(3, 1, False), 6) == [base, base, base, base * 2, base * 4,
                                                         base * 8]
    assert max(delays(backoff, Search(3, 1, False), 40)) == REDIAL_DELAY_CAP


def test_the_search_starts_again_when_an_instance_is_reached_or_listed() -> None:
    backoff = RedialBackoff(uniform=low)
    base = REDIAL_DELAY[0]
    delays(backoff, Search(4, 2, True, frozenset({3, 4})), 20)
    assert backoff.missed(Search(4, 2, True, frozenset({3, 4}))) > base  # past its free redials
    # A dial reached 3: the search for 4 alone is a new one, with its own free redials.
    assert delays(backoff, Search(4, 1, True, frozenset({4})), 25) == [base] * 25
    # 5 is listed: new again.
    assert backoff.missed(Search(5, 2, True, frozenset({4, 5}))) == base
    assert backoff.misses == 1
