"""gateway.ops.settings: a config field declared once becomes a flag, its variable and its help,
and the config is built back from what argparse parsed."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cli import apply_environment
from gateway.ops import flags
from gateway.ops.settings import (
    ADDRESS_OR_OFF,
    COUNT,
    DURATION,
    SIZE,
    SWITCH,
    add_flags,
    changed,
    flags_of,
    from_args,
    section,
    setting,
)


@dataclass(frozen=True)
class Inner:
    body_limit: int = setting(3 * 1024 * 1024, kind=SIZE, group="inner", help="body limit")
    fast: bool = setting(True, kind=SWITCH, option="--no-fast", negated=True, group="inner",
                         help="be slow")


@dataclass(frozen=True)
class Example:
    listen: tuple[str, int] | None = setting(("0.0.0.0", 80), kind=ADDRESS_OR_OFF, group="net",
                                             help="where to listen; 'off' for nowhere")
    wait: float = setting(10.0, kind=DURATION, group="net",
                          help="wait this long ({default}; 0: 100% patient)")
    names: tuple[str, ...] = setting((), option="--name", repeatable=True, group="net",
                                     help="a name (repeatable)")
    workers: int = setting(1, kind=COUNT, group="net", help="workers")
    verbose: bool = setting(False, kind=SWITCH, group="net", help="say more")
    recheck: bool = setting(True, kind=SWITCH, group="net", help="check again")
    mode: str = setting("a", choices=("a", "b"), group="net", help="mode")
    inner: Inner = section(Inner)
    internal: int = 7  # not a flag


def parser_for(config: type) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="example")
    add_flags(parser, config)
    return parser


def test_no_flags_given_builds_the_config_defaults() -> None:
    assert from_args(Example, parser_for(Example).parse_args([])) == Example()


def test_each_kind_of_flag_reaches_its_field() -> None:
    args = parser_for(Example).parse_args([
        "--listen", "off", "--wait", "500ms", "--name", "x", "--name", "y", "--workers", "3",
        "--verbose", "--no-recheck", "--mode", "b", "--body-limit", "64Ki", "--no-fast"])
    assert from_args(Example, args) == Example(
        listen=None, wait=0.5, names=("x", "y"), workers=3, verbose=True, recheck=False,
        mode="b", inner=Inner(body_limit=64 * 1024, fast=False))


def test_environment_sets_every_kind_of_flag() -> None:
    parser = parser_for(Example)
    apply_environment(parser, {
        "HUBPROXY_LISTEN": "127.0.0.1:9", "HUBPROXY_NAME": "x,y", "HUBPROXY_RECHECK": "false",
        "HUBPROXY_NO_FAST": "true", "HUBPROXY_BODY_LIMIT": "1Mi"})
    config = from_args(Example, parser.parse_args([]))
    assert (config.listen, config.names, config.recheck, config.inner) == (
        ("127.0.0.1", 9), ("x", "y"), False, Inner(body_limit=1024 * 1024, fast=False))


def test_help_writes_the_default_as_an_operator_types_it() -> None:
    text = parser_for(Example).format_help()
    flat = " ".join(text.split())
    assert "wait this long (10s; 0: 100% patient)" in flat
    assert "body limit (default: 3Mi)" in flat
    assert "where to listen; 'off' for nowhere (default: 0.0.0.0:80)" in flat
    assert "check again (default: on)" in flat
    # No default to show: a switch that is off, a repeatable flag with none.
    assert "say more\n" in text and "(repeatable)\n" in text
    assert "--internal" not in text


def test_changed_lists_what_differs_from_the_defaults_as_flags() -> None:
    assert changed(Example()) == []
    args = parser_for(Example).parse_args(["--listen", "off", "--name", "a", "--name", "b",
                                           "--wait", "2m", "--no-fast", "--no-recheck"])
    assert changed(from_args(Example, args)) == [
        "--listen=off", "--wait=2m", "--name=a,b", "--recheck=off", "--no-fast=on"]


def test_a_flag_declared_twice_is_refused() -> None:
    @dataclass(frozen=True)
    class Nested:
        workers: int = setting(2, group="g", help="h")

    @dataclass(frozen=True)
    class Twice:
        workers: int = setting(1, group="g", help="h")
        inner: Nested = section(Nested)

    with pytest.raises(ValueError, match="--workers is declared twice"):
        parser_for(Twice)


def test_flags_of_lists_sections_with_their_path() -> None:
    paths = [d.path for d in flags_of(Example)]
    assert ("inner", "body_limit") in paths and ("internal",) not in paths
    assert [d.option for d in flags_of(Example)][-2:] == ["--body-limit", "--no-fast"]


@given(st.integers(min_value=1, max_value=1 << 40))
def test_a_shown_size_reads_back(value: int) -> None:
    assert flags.parse_size(flags.show_size(value)) == value


@given(st.integers(min_value=0, max_value=10**7).map(lambda ms: ms / 1000))
def test_a_shown_duration_reads_back(seconds: float) -> None:
    assert flags.parse_duration(flags.show_duration(seconds)) == pytest.approx(seconds)


def test_durations_are_shown_in_their_natural_unit() -> None:
    shown = [flags.show_duration(s) for s in (0.0, 0.5, 8.0, 60.0, 300.0, 7 * 86400.0)]
    assert shown == ["0s", "500ms", "8s", "60s", "5m", "168h"]
