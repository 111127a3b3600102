"""``bench gateway``'s report: a baseline checkout's column and issue 26's goals (pure)."""

from __future__ import annotations

from typing import Any

from bench.gateway_report import BASE, FLOOR, HUB, goals, ratios, summarize, table


def raw(rps: float, cpu_per_request: float, events_per_s: float) -> dict[str, Any]:
    """One configuration's raw runs: 10,000 small GETs at c=16 that cost ``cpu_per_request``
    seconds each to the proxy, one body, one watch."""
    requests = 10_000
    small = {"rps": rps, "p50_ms": 1.0, "p99_ms": 2.0, "errors": 0, "client_cpu_util": 0.1,
             "requests": requests, "cpu_s": {"proxy": cpu_per_request * requests}}
    return {
        "note": "", "roles": {"proxy": [1]},
        "small_get_runs": {"c1": [dict(small, p50_ms=0.5)], "c16": [small]},
        "body_runs": [{"speed": 100e6, "client_cpu_util": 0.2, "size": 10**8,
                       "cpu_s": {"proxy": 0.5}}],
        "watch_runs": [{"events_per_s": events_per_s}],
        "ttfb_runs": [{"ttfb": 0.002, "appconnect": 0.001, "connect": 0.0005}],
        "peak_rss_mib": {"proxy": 50.0},
    }


def summarized(**configs: dict[str, Any]) -> dict[str, Any]:
    return {name: summarize(r, 10**8) for name, r in configs.items()}


def test_the_baseline_gets_a_column_and_after_over_before_ratios():
    cfgs = summarized(**{"direct": raw(40_000, 20e-6, 100_000),
                         "kubectl-proxy": raw(8_000, 150e-6, 200_000),
                         HUB: raw(4_000, 300e-6, 170_000),
                         BASE: raw(2_000, 600e-6, 85_000)})
    r = ratios(cfgs)
    assert r["small_get_c16_vs_base"] == 2.0
    assert r["cpu_per_10k_vs_base"] == 0.5
    assert r["watch_vs_base"] == 2.0
    assert r["cpu_per_10k_vs_kubectl_proxy"] == 2.0
    text = table({"configs": cfgs, "ratios": r, "goals": {}})
    header = text.splitlines()[0].split()
    assert BASE in header and header[-1] == "hub/base"
    assert f"{BASE} processes:" in text


def test_what_was_measured_on_hubproxy_alone_stands_under_its_heading_not_the_bases():
    cfgs = summarized(**{HUB: raw(4_000, 300e-6, 170_000), BASE: raw(2_000, 600e-6, 85_000)})
    idle = {"requested": 10, "open": 10, "outcomes": {"200": 10},
            "rss_before_mib": {"gateway": 100.0, "agent": 50.0},
            "rss_with_watches_mib": {"gateway": 101.0, "agent": 50.5},
            "gateway_bytes_per_watch": 3000.0, "agent_bytes_per_watch": 2000.0,
            "gateway_rss_at_10k_mib": 130.0}
    lines = table({"configs": cfgs, "ratios": ratios(cfgs), "goals": {},
                   "idle_watches_h2": idle}).splitlines()
    idle_at = next(i for i, line in enumerate(lines) if "idle watches, HTTP/2" in line)
    assert lines.index(f"{HUB} processes:") < idle_at < lines.index(f"{BASE} processes:")


def test_without_a_baseline_there_is_no_column():
    cfgs = summarized(direct=raw(40_000, 20e-6, 100_000), **{HUB: raw(4_000, 300e-6, 1)})
    r = ratios(cfgs)
    assert r["small_get_c16_vs_base"] is None
    assert "hub/base" not in table({"configs": cfgs, "ratios": r, "goals": {}})


def test_the_floor_gets_a_column_and_hubproxy_is_measured_against_it():
    cfgs = summarized(**{"direct": raw(40_000, 20e-6, 100_000),
                         "kubectl-proxy": raw(8_000, 150e-6, 200_000),
                         HUB: raw(4_000, 300e-6, 170_000),
                         FLOOR: raw(8_000, 100e-6, 1)})
    r = ratios(cfgs)
    assert r["floor_cpu_per_10k_vs_kubectl_proxy"] == 0.667
    assert r["cpu_per_10k_vs_floor"] == 3.0
    assert r["floor_small_get_c16_vs_kubectl_proxy"] == 1.0
    text = table({"configs": cfgs, "ratios": r, "goals": {}})
    assert FLOOR in text.splitlines()[0].split()
    assert "CPU per 10k 0.67 x kubectl proxy, c=16 1.00 x; hubproxy's CPU per 10k 3.00 x " \
        "the floor" in text


def test_issue_26_goals_read_the_same_ratios_with_their_own_limits():
    cfgs = summarized(**{"direct": raw(40_000, 20e-6, 100_000),
                         "kubectl-proxy": raw(8_000, 150e-6, 200_000),
                         HUB: raw(4_000, 300e-6, 170_000)})
    result = {"configs": cfgs, "ratios": ratios(cfgs)}
    g = goals(result)
    # c=16 at 0.5 x kubectl proxy: issue 5's goal (1.0 x) and issue 26's (0.6 x) both miss.
    assert g["small_get_c16_vs_kubectl_proxy"]["pass"] is False
    assert g["hotpath_small_get_c16_vs_kubectl_proxy"]["value"] == 0.5
    assert g["hotpath_small_get_c16_vs_kubectl_proxy"]["pass"] is False
    assert g["hotpath_cpu_per_10k_vs_kubectl_proxy"] == {
        "goal": "(issue 26) proxy CPU per 10k small GETs <= 2 x kubectl proxy's",
        "value": 2.0, "limit": 2.0, "pass": True}
    assert g["hotpath_watch_vs_kubectl_proxy"]["value"] == 0.85
    assert g["hotpath_watch_vs_kubectl_proxy"]["pass"] is True
    assert g["hotpath_p50_added_ms_c1"]["value"] == 0.0


def test_the_a_b_pair_swaps_places_every_other_repetition():
    from bench.configs import Config
    from bench.gateway import in_turn
    from bench.loadgen import Target

    cfgs = [Config(n, Target("https://127.0.0.1:1", ""), "", {}, [])
            for n in ("direct", HUB, "kubectl-proxy", BASE)]
    assert [c.name for c in in_turn(cfgs, 0)] == ["direct", HUB, "kubectl-proxy", BASE]
    assert [c.name for c in in_turn(cfgs, 1)] == ["direct", BASE, "kubectl-proxy", HUB]
    alone = cfgs[:3]  # no baseline: one order
    assert in_turn(alone, 1) == alone
