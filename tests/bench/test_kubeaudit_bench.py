"""``python -m bench kubeaudit``: the in-process part measures both ways; the end-to-end part
is run by hand (bench/README.md)."""

from __future__ import annotations

from pathlib import Path

from bench.kubeaudit import in_process


def test_in_process_measures_both_ways(tmp_path: Path) -> None:
    figures = in_process(events=300, repeat=1, workdir=tmp_path)
    assert set(figures) == {"json_line", "json_line+k8s_event"}
    assert all(us > 0 for us in figures.values())
    assert not (tmp_path / "inprocess-audit.log").exists()  # removed after each run

