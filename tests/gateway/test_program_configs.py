"""`hubproxy gateway` and `hubproxy agent` take every flag from their config class: no flag is
added by hand, no parser default differs from its field, and no flag given is lost on the way
to the config."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any

import pytest

from gateway.agent.config import AgentConfig
from gateway.cli import apply_environment, build_parser
from gateway.hub.config import GatewayConfig
from gateway.hub.serve import config_from_args
from gateway.ops.settings import flags_of, from_args

PROGRAMS = {"gateway": GatewayConfig, "agent": AgentConfig}
# The required flags, and what they hold in the config.
REQUIRED: dict[str, tuple[list[str], dict[str, Any]]] = {
    "gateway": (["--tls-dir", "/t", "--tunnel-tls-dir", "/u", "--agent-ca", "/ca"],
                {"tls_dir": "/t", "tunnel_tls_dir": "/u", "agent_ca": "/ca"}),
    "agent": (["--hub", "hub:8091", "--cluster", "c1", "--tls-dir", "/t"],
              {"hub": ("hub", 8091), "cluster": "c1", "tls_dir": "/t"}),
}


def subparser(command: str, parser: argparse.ArgumentParser | None = None
              ) -> argparse.ArgumentParser:
    actions = (parser or build_parser())._subparsers._group_actions  # type: ignore[union-attr]
    return actions[0].choices[command]  # type: ignore[no-any-return]


def field_value(config: object, path: tuple[str, ...]) -> Any:
    return functools.reduce(getattr, path, config)


@pytest.mark.parametrize("command", PROGRAMS)
def test_every_flag_is_a_config_field_and_defaults_to_it(command: str) -> None:
    """The parser-vs-config check: each default is written once, on the field."""
    config_class = PROGRAMS[command]
    declared = {d.dest: d for d in flags_of(config_class)}
    defaults = config_class()  # every field at its own default
    flags = [a for a in subparser(command)._actions
             if a.option_strings and not isinstance(a, argparse._HelpAction)]
    assert {a.dest for a in flags} == set(declared), "a flag added by hand, or one lost"
    for action in flags:
        setting = declared[action.dest]
        assert action.option_strings[0] == setting.option
        # What argparse holds when the flag is not given becomes exactly the field's default.
        assert setting.value(action.default) == field_value(defaults, setting.path), \
            action.option_strings


@pytest.mark.parametrize("command", PROGRAMS)
def test_only_the_required_flags_give_the_default_config(command: str) -> None:
    argv, required = REQUIRED[command]
    args = build_parser().parse_args([command, *argv])
    assert from_args(PROGRAMS[command], args) == PROGRAMS[command](**required)


@pytest.mark.parametrize("command", PROGRAMS)
def test_every_flag_has_help_and_a_variable(command: str) -> None:
    parser = build_parser()
    apply_environment(parser, {})
    text = " ".join(subparser(command, parser).format_help().split())
    for setting in flags_of(PROGRAMS[command]):
        assert setting.flag.help.strip(), setting.option
        assert f"[env {setting.env}]" in text, setting.env


def test_the_memory_budget_variable_of_old_still_sets_it() -> None:
    """HUBPROXY_TUNNEL_MEMORY_BUDGET was read by the tunnel at import; it is now the flag's
    variable, on both programs, and accepts the plain byte count it took before."""
    for command in PROGRAMS:
        parser = build_parser()
        apply_environment(parser, {"HUBPROXY_TUNNEL_MEMORY_BUDGET": str(256 * 1024 * 1024)})
        args = parser.parse_args([command, *REQUIRED[command][0]])
        assert from_args(PROGRAMS[command], args).tunnel_memory_budget == 256 * 1024 * 1024
    args = build_parser().parse_args(["gateway", *REQUIRED["gateway"][0],
                                      "--tunnel-memory-budget", "2Gi"])
    assert from_args(GatewayConfig, args).tunnel_memory_budget == 2 << 30


def test_gateway_sessions_share_one_budget_of_the_configured_size() -> None:
    from gateway.hub.app import session_settings

    settings = session_settings(GatewayConfig(tunnel_memory_budget=64 << 20))
    assert settings.process_budget.limit == 64 << 20
    from tunnel.session_state import Session

    first, second = Session(settings), Session(settings)
    assert first.process_budget is second.process_budget is settings.process_budget


def test_a_pods_workers_are_announced_as_a_set_and_pods_only_as_a_count() -> None:
    """Workers without Leases name each other (agents then search with free redials); pods
    counted by --replicas cannot be named; with Leases each process starts with itself."""
    from gateway.hub.app import session_settings

    workers = GatewayConfig(workers=2, hub_instance=7, worker_instances=(7, 9))
    assert (session_settings(workers).hub_instances, session_settings(workers).hub_peers) == (
        2, (7, 9))
    pods = dataclasses.replace(workers, replicas=3)
    assert (session_settings(pods).hub_instances, session_settings(pods).hub_peers) == (6, ())
    leased = dataclasses.replace(workers, lease_namespace="hub")
    assert (session_settings(leased).hub_instances, session_settings(leased).hub_peers) == (
        1, (7,))
    single = GatewayConfig(hub_instance=7)
    assert (session_settings(single).hub_instances, session_settings(single).hub_peers) == (
        1, ())


def test_config_validation_names_the_flag() -> None:
    argv = REQUIRED["gateway"][0]
    for extra, message in (
        (["--fair-queues", "4", "--fair-hand-size", "8"], "--fair-hand-size 8 is more than"),
        (["--identity-prefix", "system:"], "--identity-prefix"),
        (["--agent-identity", "ocm", "--ocm-addon-name", "Not_A_Label"], "--ocm-addon-name"),
        (["--clusterprofiles", "on"], "--clusterprofiles=on needs --public-url"),
        (["--replicas", "9", "--workers", "8", "--lease-namespace", "off"],
         "--replicas x --workers = 72: agents hold at most 64"),
        (["--workers", "65", "--lease-namespace", "hub"], "--workers = 65"),
    ):
        with pytest.raises(ValueError, match=message):
            config_from_args(build_parser().parse_args(["gateway", *argv, *extra]))
    parser = build_parser()
    apply_environment(parser, {"HUBPROXY_TLS_DIR": ""})  # a manifest's empty variable
    with pytest.raises(ValueError, match="--tls-dir is required"):
        config_from_args(parser.parse_args(["gateway", *argv[2:]]))
    agent = build_parser().parse_args(["agent", *REQUIRED["agent"][0],
                                       "--allow-service", "a/b:1", "--insecure-service", "a/c:1"])
    with pytest.raises(ValueError, match="--insecure-service names a Service"):
        from_args(AgentConfig, agent).validate()
