"""bench.profiling: what ``bench gateway --profile`` makes of py-spy's collapsed stacks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench import nativeprof, profiling

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


def test_every_sample_counts_in_the_layer_of_its_innermost_frame(tmp_path: Path) -> None:
    path = tmp_path / "raw.txt"
    path.write_text(COLLAPSED + """\
process 1:"python";run (asyncio/runners.py:118) 5
process 1:"python";run (asyncio/runners.py:118);read (/usr/lib/python3.11/ssl.py:919) 3
process 1:"python";run (asyncio/runners.py:118);check (/x/gateway/hub/admission/auth.py:9) 1
process 1:"python";run (asyncio/runners.py:118);start (/x/gateway/hub/request.py:3) 1
""")
    top = profiling.top_functions(path)
    assert top["samples"] == 20
    assert top["layer_pct"] == [
        ("agent request handling", 40.0),
        ("event loop (uvloop: epoll, socket reads, callbacks)", 25.0),
        ("TLS (OpenSSL)", 15.0),
        ("tunnel (framing, flow control, streams)", 10.0),
        ("admission (routing, auth, identity, seats)", 5.0),
        ("gateway request handling", 5.0),
    ]
    assert profiling.layer_of("dumps (json/__init__.py:231)") == profiling.OTHER_LAYER


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
    monkeypatch.setattr(nativeprof, "PERF", None)  # tests/bench/test_nativeprof.py runs it
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
    layer_us = dict(result["top"]["agent"]["layer_us"])
    assert abs(layer_us["agent request handling"] - 0.8 * per_op) < 0.02
    assert "perf not installed" in result["native"]["agent"]["skipped"]


def test_summary_names_the_cost_per_operation_and_leaves_out_the_event_loop(
        tmp_path: Path) -> None:
    path = tmp_path / "raw.txt"
    path.write_text(COLLAPSED)
    top = profiling.top_functions(path)
    top["self_fn_us"] = [(f, round(pct * 2.0 / 100, 2)) for f, pct in top["self_fn_pct"]]
    top["layer_us"] = [(f, round(pct * 2.0 / 100, 2)) for f, pct in top["layer_pct"]]
    text = profiling.summary({"watch": {"workload": {"ops": 10, "unit": "watch event"},
                                        "us_per_op": {"agent": 2.0}, "top": {"agent": top}}})
    assert "agent: 2.0 CPU us per watch event, 10 samples" in text
    assert "data_received (gateway/agent/h2pool.py) 80.0% 1.6 us" in text
    assert ("by layer: agent request handling 80.0% 1.6 us; "
            "tunnel (framing, flow control, streams) 20.0% 0.4 us") in text
    inclusive = text.split("inclusive: ")[1]
    assert "run (runners.py)" not in inclusive and "write (tunnel/connection.py) 20.0%" in inclusive
