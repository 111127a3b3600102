"""tests.support: the helpers every test tier uses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import CLIENT_GO_DEMUX_RACE, KUBECTL_RUNS, free_port, run_kubectl


def test_free_port_never_names_one_port_twice() -> None:
    """Ports picked in a row are distinct even when the kernel offers a released one again
    (two LB frontends on one port split the test's connections between them)."""
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


# --- run_kubectl: an exec that hit client-go's demux race is run again, nothing else --------
# A fake kubectl (a real process) stands in for the client: it says which version it is and
# answers each run as its environment says, counting the runs in a file.

RACE = f"E1125 04:27:51.205072 websocket.go:296] {CLIENT_GO_DEMUX_RACE} 1, discarding message\n"

FAKE_KUBECTL = '''
import json, os, sys
args = sys.argv[1:]
if args[:2] == ["version", "--client"]:
    print(json.dumps({"clientVersion": {"major": "1", "minor": os.environ["FAKE_MINOR"]}}))
    sys.exit(0)
runs = os.environ["FAKE_RUNS"]
n = int(open(runs).read()) + 1 if os.path.exists(runs) else 1
open(runs, "w").write(str(n))
if os.environ["FAKE_RACES"] == "always" or n <= int(os.environ["FAKE_RACES"]):
    sys.stderr.write(os.environ["FAKE_STDERR"])  # exits 0 with no output, as kubectl did
else:
    sys.stdout.write(sys.stdin.read() if "-i" in args else "hello\\n")
'''


def fake_kubectl(directory: Path) -> Path:
    directory.mkdir()
    path = directory / "kubectl"
    path.write_text(f"#!{sys.executable}\n{FAKE_KUBECTL}")
    path.chmod(0o755)
    return path


def run(kubectl: Path, *args: str, minor: str = "32+", races: str = "1", stderr: str = RACE,
        input: str | None = None) -> tuple[subprocess.CompletedProcess[str], int]:
    runs = kubectl.parent / f"runs-{len(os.listdir(kubectl.parent))}"
    env = {**os.environ, "FAKE_MINOR": minor, "FAKE_RUNS": str(runs), "FAKE_RACES": races,
           "FAKE_STDERR": stderr}
    got = run_kubectl([str(kubectl), "--context", "c1", *args], env=env, timeout=30,
                      input=input)
    return got, int(runs.read_text()) if runs.exists() else 0


def test_kubectl_exec_that_hit_the_demux_race_is_run_again(tmp_path: Path) -> None:
    kubectl = fake_kubectl(tmp_path / "v1.32")
    got, runs = run(kubectl, "exec", "demo", "--", "echo", "hello")
    assert (got.returncode, got.stdout, runs) == (0, "hello\n", 2)
    got, runs = run(kubectl, "exec", "-i", "demo", "--", "cat", races="2", input="stdin\n")
    assert (got.stdout, runs) == ("stdin\n", 3)  # the input goes to every run


def test_kubectl_other_failures_are_returned_as_they_are(tmp_path: Path) -> None:
    # rc 0 and no output, but kubectl did not say it dropped a frame: the gateway's to answer.
    kubectl = fake_kubectl(tmp_path / "v1.32")
    got, runs = run(kubectl, "exec", "demo", "--", "echo", "hello", stderr="")
    assert (got.returncode, got.stdout, runs) == (0, "", 1)


def test_kubectl_runs_are_bounded(tmp_path: Path) -> None:
    kubectl = fake_kubectl(tmp_path / "v1.32")
    got, runs = run(kubectl, "exec", "demo", "--", "echo", "hello", races="always")
    assert runs == KUBECTL_RUNS and got.stdout == "" and CLIENT_GO_DEMUX_RACE in got.stderr


def test_kubectl_with_the_fix_and_other_commands_run_once(tmp_path: Path) -> None:
    fixed = fake_kubectl(tmp_path / "v1.33")
    got, runs = run(fixed, "exec", "demo", "--", "echo", "hello", minor="33")
    assert (got.stdout, runs) == ("", 1)  # client-go v1.33 has the fix: nothing to excuse
    kubectl = fake_kubectl(tmp_path / "v1.32")
    got, runs = run(kubectl, "get", "pods")
    assert (got.stdout, runs) == ("", 1)
    got, runs = run(kubectl, "logs", "demo", "--", "exec")  # a word after "--" is no command
    assert runs == 1
