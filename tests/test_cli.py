"""The `hubproxy` dispatcher: subcommands, --help, and HUBPROXY_* environment defaults."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from gateway.cli import apply_environment, build_parser, env_name


def test_env_name_follows_flag() -> None:
    assert env_name("--tunnel-listen") == "HUBPROXY_TUNNEL_LISTEN"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="0.0.0.0:9092")
    parser.add_argument("--audience", action="append", default=[])
    parser.add_argument("--token-passthrough", action="store_true")
    parser.add_argument("--port", type=int, default=1)
    parser.add_argument("--cluster", required=True)
    return parser


def test_environment_sets_defaults_and_command_line_wins() -> None:
    parser = _parser()
    apply_environment(
        parser,
        {
            "HUBPROXY_LISTEN": "127.0.0.1:1",
            "HUBPROXY_AUDIENCE": "a, b",
            "HUBPROXY_TOKEN_PASSTHROUGH": "true",
            "HUBPROXY_PORT": "7",
            "HUBPROXY_CLUSTER": "c1",
        },
    )
    args = parser.parse_args([])
    assert (args.listen, args.audience, args.token_passthrough, args.port, args.cluster) == (
        "127.0.0.1:1",
        ["a", "b"],
        True,
        7,
        "c1",
    )
    assert parser.parse_args(["--listen", "x:2"]).listen == "x:2"


def test_environment_refuses_unclear_boolean() -> None:
    parser = _parser()
    with pytest.raises(SystemExit):
        apply_environment(parser, {"HUBPROXY_TOKEN_PASSTHROUGH": "maybe"})


def test_every_subcommand_has_help() -> None:
    parser = build_parser()
    for name in ("gateway", "agent", "certs", "kubeconfig", "demo", "kubesim"):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([name, "--help"])
        assert exit_info.value.code == 0


def test_console_help_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "HUBPROXY_<FLAG>" in out.stdout


@pytest.mark.parametrize("name", ["kubesim", "demo"])
def test_kubesim_commands_explain_themselves_where_kubesim_is_not_installed(
    name: str, tmp_path
) -> None:
    """The container image ships no kubesim: these commands say so instead of a traceback."""
    # A copy of the production packages alone, as the image installs them.
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for package in ("gateway", "tunnel", "certs"):
        shutil.copytree(root / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for runtime in root.glob("*__mypyc.*"):  # the compiled modules' shared library (setup.py)
        shutil.copy(runtime, tmp_path)
    # The editable install of this checkout maps kubesim through a meta-path finder: drop that
    # finder (it is what makes kubesim importable) and import our packages from the copy.
    probe = (
        "import sys, importlib.util\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in repr(f)]\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "assert importlib.util.find_spec('kubesim') is None, 'kubesim still importable'\n"
        "from gateway.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = subprocess.run([sys.executable, "-I", "-c", probe, name, "--listen", "x"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"hubproxy {name}: not available in this installation" in result.stderr
    assert "Traceback" not in result.stderr
    listed = subprocess.run([sys.executable, "-I", "-c", probe, "--help"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert listed.returncode == 0 and "not installed here" in listed.stdout
