"""The `hubproxy` command: one binary, one subcommand per process or tool.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Every long flag can also come from the environment as
``HUBPROXY_<FLAG>`` (``--tunnel-listen`` -> ``HUBPROXY_TUNNEL_LISTEN``), so the same
binary runs from a shell, a systemd unit or a Kubernetes manifest. A flag given on the
command line wins over the environment.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.ops.settings import env_name
from gateway.ops.version import version

__all__ = ["apply_environment", "build_parser", "env_name", "main"]

# name -> (module, one-line help). Modules are imported only when the parser is built.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "gateway": ("gateway.hub.serve", "run the hub-side gateway (front door :9092, tunnel :8091)"),
    "agent": ("gateway.agent.command", "run the managed-cluster agent that dials out to the hub"),
    "cluster": ("gateway.hub.join.command",
                "add (print a one-command join), list or remove managed clusters"),
    "certs": ("certs.cli", "create CAs and issue gateway, tunnel and agent certificates"),
    "kubeconfig": ("gateway.access.kubeconfig",
                   "print a kubeconfig for clusters behind the gateway"),
    "clusters": ("gateway.access.clusters",
                 "list the clusters a gateway serves (its health port's /clusters)"),
    "demo": ("gateway.demo", "run hub, two managed clusters, gateway and agents locally"),
    "kubesim": ("kubesim.cli", "run kubesim, a kube-apiserver stand-in for tests (not production)"),
}

# Subcommands that need kubesim, which only a source checkout has: the container image installs
# the production packages alone. Without it they stay listed and say why they cannot run.
NEEDS_KUBESIM = frozenset({"kubesim", "demo"})


def _kubesim_installed() -> bool:
    return importlib.util.find_spec("kubesim") is not None


def _unavailable(name: str) -> int:
    """What a kubesim command says where kubesim is missing, instead of a traceback."""
    print(f"hubproxy {name}: not available in this installation: it needs kubesim, the "
          "kube-apiserver stand-in for tests and demos, which is not installed here (the "
          "container image ships only the gateway, the agent and their tools). Run it from "
          "a source checkout: pip install -e .", file=sys.stderr)
    return 2


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _converted(action: argparse.Action, raw: str) -> Any:
    """``raw`` as the flag's ``type=`` reads it (argparse also allows a registered type's name,
    a string, which our flags never use)."""
    return action.type(raw) if callable(action.type) else raw


def apply_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Turn ``HUBPROXY_*`` variables into defaults of the flags they name, recursively.

    Repeatable flags take a comma-separated list. Boolean switches take 1/0, true/false,
    yes/no, on/off; anything else is a usage error rather than a silent guess.
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply_environment(sub, environ)
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "version"):
            continue
        name = env_name(longs[0])
        if action.help is not argparse.SUPPRESS:
            action.help = f"{action.help or ''} [env {name}]".strip()
        if name not in environ:
            continue
        raw = environ[name]
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction
                      | argparse.BooleanOptionalAction):
            lowered = raw.strip().lower()
            if lowered not in _TRUE | _FALSE:
                parser.error(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")
            on = lowered in _TRUE
            # --flag/--no-flag (BooleanOptionalAction) reads as the flag's positive name.
            action.default = not on if isinstance(action, argparse._StoreFalseAction) else on
        elif isinstance(action, argparse._AppendAction):
            items = [item.strip() for item in raw.split(",") if item.strip()]
            action.default = [_converted(action, i) for i in items]
        else:
            action.default = _converted(action, raw)
        action.required = False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hubproxy",
        description=(
            "Reach the API servers and Services of managed Kubernetes clusters from a hub "
            "through a reverse tunnel. Callers authenticate with hub tokens (TokenReview); "
            "managed clusters see only an impersonated, prefixed hub identity."
        ),
        epilog="Every --flag can also be set as HUBPROXY_<FLAG> in the environment.",
    )
    parser.add_argument("--version", action="version", version=f"hubproxy {version()}",
                        help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    kubesim = _kubesim_installed()
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name in NEEDS_KUBESIM and not kubesim:
            # Listed, so --help tells the whole story; main() answers before parsing.
            subparsers.add_parser(name, help=f"{help_text} [not installed here]")
            continue
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in NEEDS_KUBESIM and not _kubesim_installed():
        return _unavailable(argv[0])
    parser = build_parser()
    apply_environment(parser, os.environ)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
