"""Settings, each declared once: on the field of the program's config that holds it.

A program's configuration (``GatewayConfig``, ``AgentConfig``) is a frozen dataclass. A field
declared with :func:`setting` is a command-line flag, and everything about the flag comes from
that one declaration: its name (the field's, with dashes, unless given), its type, its default
(the field's), its environment variable (``HUBPROXY_<FLAG>``, :func:`env_name`), its help (with
the default written in) and its group in ``--help``. A field declared with :func:`section`
holds a nested config (the front door's limits, the ClusterProfile writer's part) whose
settings are flags of the same program. Fields declared neither way are not flags.

From the class:

* :func:`add_flags` builds the argparse arguments;
* :func:`from_args` builds the config back from what argparse parsed (validation stays with the
  config: its ``validate()``);
* :func:`flags_of` lists every setting, for the generated reference (``docs/flags.md``) and the
  test that no parser default differs from its field;
* :func:`changed` says which settings differ from their defaults, as flags (the programs log
  it at start).

Adding a flag is adding one field.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from gateway.ops import flags

T = TypeVar("T")

ENV_PREFIX = "HUBPROXY_"

# dataclasses field metadata keys
_FLAG = "hubproxy.flag"
_SECTION = "hubproxy.section"

# The attribute a generated argparse action carries, for the flag reference: its default as an
# operator types it, and its help without that default appended.
REFERENCE = "hubproxy_reference"


def env_name(option: str) -> str:
    """``--tunnel-listen`` -> ``HUBPROXY_TUNNEL_LISTEN``."""
    return ENV_PREFIX + option.lstrip("-").upper().replace("-", "_")


@dataclass(frozen=True)
class Kind:
    """How a setting's text becomes its value (argparse ``type``) and is written back."""

    parse: Callable[[str], Any] | None  # None: the text itself
    show: Callable[[Any], str] = str
    metavar: str | None = None
    # For text that can only be judged whole (CIDRs, several to a flag): what argparse parsed,
    # and the flag's name, to the field's value; a ValueError names the flag (the programs
    # report it as they report the config's own validation).
    convert: Callable[[Any, str], Any] | None = None


TEXT = Kind(None)
COUNT = Kind(flags.positive_int, str, "N")
COUNT_OR_ZERO = Kind(flags.non_negative_int, str, "N")
DURATION = Kind(flags.duration, flags.show_duration, "DURATION")
SECONDS = Kind(float, flags.show_number, "SECONDS")  # a plain number of seconds
SIZE = Kind(flags.size, flags.show_size, "SIZE")
RATE = Kind(flags.rate, flags.show_number, "PER_SECOND")
ADDRESS = Kind(flags.address, flags.show_address, "HOST:PORT")
ADDRESS_OR_OFF = Kind(flags.address_or_off, flags.show_address, "HOST:PORT")
# Repeatable, each flag one CIDR or address or several comma-separated: a tuple of networks.
NETWORKS = Kind(None, str, "CIDR", convert=flags.parse_networks)
NAME_OR_NONE = Kind(flags.text_or_none)
SWITCH = Kind(None, lambda on: "on" if on else "off")


@dataclass(frozen=True)
class Flag:
    """What a setting's field declares beyond its name and default."""

    help: str  # "{default}" is replaced by the default; without it "(default: ...)" is added
    group: str  # the --help section it is listed under
    kind: Kind = TEXT
    option: str = ""  # "--flag"; empty: the field's name with dashes
    metavar: str | None = None  # empty: the kind's
    choices: tuple[str, ...] = ()
    required: bool = False
    repeatable: bool = False  # --flag A --flag B (HUBPROXY_FLAG=A,B) -> a tuple
    negated: bool = False  # a switch spelled --no-<thing>: the field holds <thing>
    # A default that depends on where the program runs (its pod's namespace): called with the
    # field's default when the parser is built; default_text says what it is, for --help and
    # the reference, which must not depend on the machine that generates them.
    default_here: Callable[[Any], Any] | None = None
    default_text: str = ""


def setting(default: T, *, help: str, group: str, kind: Kind = TEXT, option: str = "",
            metavar: str | None = None, choices: tuple[str, ...] = (), required: bool = False,
            repeatable: bool = False, negated: bool = False,
            default_here: Callable[[Any], Any] | None = None, default_text: str = "") -> T:
    """A config field that is a flag (see the module docstring). ``default`` is the one default."""
    flag = Flag(help=help, group=group, kind=kind, option=option, metavar=metavar,
                choices=choices, required=required, repeatable=repeatable, negated=negated,
                default_here=default_here, default_text=default_text)
    return field(default=default, metadata={_FLAG: flag})


def section(config: type[T]) -> T:
    """A config field holding a nested config class whose settings are flags too."""
    return field(default_factory=config, metadata={_SECTION: config})


@dataclass(frozen=True)
class Declared:
    """One setting as found on a config class: where it is, and its flag."""

    path: tuple[str, ...]  # field names from the config's root: ("limits", "max_headers")
    default: Any  # the field's
    flag: Flag

    @property
    def option(self) -> str:
        return self.flag.option or "--" + self.path[-1].replace("_", "-")

    @property
    def dest(self) -> str:
        """The argparse attribute: the flag's name, as argparse would derive it."""
        return self.option[2:].replace("-", "_")

    @property
    def env(self) -> str:
        return env_name(self.option)

    @property
    def parser_default(self) -> Any:
        """The argparse default that stands for the field's default."""
        if self.flag.default_here is not None:
            return self.flag.default_here(self.default)
        if self.flag.negated:
            return not self.default
        if self.flag.repeatable:
            return list(self.default)
        return self.default

    def value(self, parsed: Any) -> Any:
        """The field's value for what argparse parsed."""
        if self.flag.negated:
            return not parsed
        if self.flag.kind.convert is not None:
            return self.flag.kind.convert(parsed, self.option)
        if self.flag.repeatable:
            return tuple(parsed)
        return parsed

    @property
    def shown_default(self) -> str:
        """The default as an operator would type it; empty when there is none to show."""
        if self.flag.default_text:
            return self.flag.default_text.replace("{default}", self.flag.kind.show(self.default))
        if self.flag.required or self.default is None or self.default == ():
            return ""
        if self.flag.kind is SWITCH:
            return "" if self.default is False else self.flag.kind.show(self.default)
        return self.flag.kind.show(self.default)

    @property
    def description(self) -> str:
        """The help as declared, with a "{default}" in it written out."""
        return self.flag.help.replace("{default}", self.shown_default)

    @property
    def help(self) -> str:
        """The description, and the default if the description does not say it."""
        shown = self.shown_default
        if "{default}" in self.flag.help or not shown:
            return self.description
        return f"{self.description} (default: {shown})"


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"setting {f.name} has no default")


def flags_of(config: type[Any], path: tuple[str, ...] = ()) -> Iterator[Declared]:
    """Every setting of ``config`` and its sections, in declaration order."""
    for f in dataclasses.fields(config):
        if _SECTION in f.metadata:
            yield from flags_of(f.metadata[_SECTION], (*path, f.name))
        elif _FLAG in f.metadata:
            yield Declared((*path, f.name), _field_default(f), f.metadata[_FLAG])


def add_flags(parser: argparse.ArgumentParser, config: type[Any]) -> None:
    """One argparse argument per setting of ``config``, in groups as declared."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    seen: dict[str, tuple[str, ...]] = {}
    for declared in flags_of(config):
        flag = declared.flag
        if declared.dest in seen:
            raise ValueError(f"{declared.option} is declared twice: {seen[declared.dest]} "
                             f"and {declared.path}")
        seen[declared.dest] = declared.path
        group = groups.get(flag.group) or groups.setdefault(
            flag.group, parser.add_argument_group(flag.group))
        kwargs: dict[str, Any] = {
            "default": declared.parser_default,
            "help": declared.help.replace("%", "%%"),  # argparse formats help with %
        }
        if flag.kind is SWITCH:
            on_by_default = declared.default and not flag.negated
            kwargs["action"] = (argparse.BooleanOptionalAction if on_by_default
                                else "store_true")
        else:
            if flag.kind.parse is not None:
                kwargs["type"] = flag.kind.parse
            if flag.choices:
                kwargs["choices"] = flag.choices
            else:
                kwargs["metavar"] = flag.metavar or flag.kind.metavar
            if flag.repeatable:
                kwargs["action"] = "append"
            if flag.required:
                kwargs["required"] = True
        action = group.add_argument(declared.option, **kwargs)
        setattr(action, REFERENCE, (declared.shown_default, declared.description))


def from_args(config: type[T], args: argparse.Namespace) -> T:
    """``config`` with every setting (its sections' too) taken from ``args``; the rest default."""
    return cast(T, _build(config, vars(args)))


def _build(config: type[Any], parsed: Mapping[str, Any]) -> Any:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if _SECTION in f.metadata:
            values[f.name] = _build(f.metadata[_SECTION], parsed)
        elif _FLAG in f.metadata:
            declared = Declared((f.name,), _field_default(f), f.metadata[_FLAG])
            values[f.name] = declared.value(parsed[declared.dest])
    return config(**values)


def changed(config: object) -> list[str]:
    """``--flag=value`` for every setting of ``config`` that is not at its default, in
    declaration order, each value as an operator would type it. Settings hold paths, names
    and numbers, never credentials (those are read from the files named here)."""
    out = []
    for declared in flags_of(type(config)):
        value: Any = functools.reduce(getattr, declared.path, config)
        if value == declared.default:
            continue
        show = declared.flag.kind.show
        if declared.flag.repeatable:
            shown = ",".join(show(item) for item in value)
        elif declared.flag.kind is SWITCH:
            shown = show(not value if declared.flag.negated else value)
        elif value is None:  # only "off" turns a setting with a default to None
            shown = flags.OFF
        else:
            shown = show(value)
        out.append(f"{declared.option}={shown}")
    return out
