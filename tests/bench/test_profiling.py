"""bench.profiling: what ``bench gateway --profile`` makes of py-spy's collapsed stacks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench import profiling

# py-spy's ``raw`` format: frames root first, separated by ';', then the sample count.
COLLAPSED = """\
process 1:"python";run (asyncio/runners.py:118);data_received (/x/gateway/agent/h2pool.py:10) 6
process 1:"python";run (asyncio/runners.py:118);data_received (/x/gateway/agent/h2pool.py:12) 2
process 1:"python";run (asyncio/runners.py:118);write (/x/tunnel/connection.py:105) 2
"""


def test_top_functions_gives_lines_functions_and_inclusive_shares(tmp_path: Path) -> None:
    path = tmp_path / "raw.txt"
    path.write_text(COLLAPSED)
    top = profiling.top_functions(path)
    assert top["samples"] == 10
    assert top["self_pct"] == [("data_received (gateway/agent/h2pool.py:10)", 60.0),
                               ("data_received (gateway/agent/h2pool.py:12)", 20.0),
                               ("write (tunnel/connection.py:105)", 20.0)]
    assert top["self_fn_pct"] == [("data_received (gateway/agent/h2pool.py)", 80.0),
                                  ("write (tunnel/connection.py)", 20.0)]
    assert dict(top["inclusive_pct"])["run (runners.py)"] == 100.0


def test_record_turns_shares_into_microseconds_per_operation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No py-spy needed: a fake sampler writes the collapsed file; CPU is what the workload
    # burns in this process.
    class FakeSampler:
        def __init__(self, args: list[str], **_: object) -> None:
            out = Path(args[args.index("--output") + 1])
            if out.suffix == ".txt":
                out.write_text(COLLAPSED)
            else:
                out.write_text("<svg/>")

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(profiling, "PY_SPY", "py-spy")
    monkeypatch.setattr(subprocess, "Popen", FakeSampler)

    def workload() -> dict[str, object]:
        total = 0
        for i in range(2_000_000):
            total += i
        return {"ops": 1000, "unit": "request"}

    result = profiling.record({"agent": os.getpid()}, 1, tmp_path, "small-get", workload)
    per_op = result["us_per_op"]["agent"]
    assert per_op > 0 and result["cpu_s"]["agent"] > 0
    self_us = dict(result["top"]["agent"]["self_us"])
    assert abs(self_us["data_received (gateway/agent/h2pool.py:10)"] - 0.6 * per_op) < 0.02


def test_summary_names_the_cost_per_operation_and_leaves_out_the_event_loop(
        tmp_path: Path) -> None:
    path = tmp_path / "raw.txt"
    path.write_text(COLLAPSED)
    top = profiling.top_functions(path)
    top["self_fn_us"] = [(f, round(pct * 2.0 / 100, 2)) for f, pct in top["self_fn_pct"]]
    text = profiling.summary({"watch": {"workload": {"ops": 10, "unit": "watch event"},
                                        "us_per_op": {"agent": 2.0}, "top": {"agent": top}}})
    assert "agent: 2.0 CPU us per watch event, 10 samples" in text
    assert "data_received (gateway/agent/h2pool.py) 80.0% 1.6 us" in text
    inclusive = text.split("inclusive: ")[1]
    assert "run (runners.py)" not in inclusive and "write (tunnel/connection.py) 20.0%" in inclusive
