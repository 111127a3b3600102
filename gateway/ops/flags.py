"""Flag values both programs parse and write the same way: addresses, counts, sizes, durations.

Each ``parse_*`` function raises ValueError with a message that repeats what was given; the
argparse types (:func:`address`, :func:`duration`, ...) raise ``ArgumentTypeError`` with it, so
usage errors name the problem. Each ``show_*`` function writes a value back the way an operator
would type it (``3Mi``, ``30s``, ``0.0.0.0:9092``), for ``--help`` and the flag reference.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

OFF = "off"  # the word that turns an optional listener off
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_address(value: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``[v6]:PORT`` -> (host, port). Raises ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep:
        raise ValueError(f"{value!r}: expected HOST:PORT")
    host = host.strip("[]") or default_host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: port must be a number from 0 to 65535")
    return host, int(port)


def positive_int(value: str) -> int:
    """argparse type for counts and limits."""
    if not value.strip().isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a positive integer")
    return int(value)


def non_negative_int(value: str) -> int:
    """argparse type for counts where 0 turns something off."""
    if not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return int(value)


_SIZE_SUFFIXES = (("ki", 1024), ("mi", 1024**2), ("gi", 1024**3), ("k", 1000), ("m", 1000**2),
                  ("g", 1000**3))


def parse_size(value: str) -> int:
    """``3145728``, ``512Ki``, ``3Mi``, ``1Gi`` (or decimal ``k``/``M``/``G``) -> a positive
    number of bytes, as Kubernetes quantities write them. Raises ValueError."""
    text = value.strip().lower()
    number, factor = text, 1
    for suffix, scale in _SIZE_SUFFIXES:
        if text.endswith(suffix):
            number, factor = text[: -len(suffix)], scale
            break
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"{value!r}: expected a positive size such as 3Mi, 512Ki or 1048576")
    return int(number) * factor


def parse_duration(value: str) -> float:
    """``10``, ``10s``, ``500ms``, ``2m`` -> seconds. Raises ValueError."""
    text = value.strip().lower()
    number, factor = text, 1.0
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            number, factor = text[: -len(suffix)], scale
            break
    try:
        seconds = float(number) * factor
    except ValueError:
        raise ValueError(f"{value!r}: expected a duration such as 10s, 500ms or 2m") from None
    if seconds < 0:
        raise ValueError(f"{value!r}: a duration cannot be negative")
    return seconds


def parse_rate(value: str) -> float:
    """A positive, finite number (events per second). Raises ValueError."""
    try:
        rate = float(value)
    except ValueError:
        rate = 0.0
    if not rate > 0 or rate == float("inf"):
        raise ValueError(f"{value!r}: expected a positive number")
    return rate


def parse_networks(values: Iterable[str], flag: str) -> tuple[Network, ...]:
    """CIDRs (or single addresses) as networks; ValueError naming ``flag`` otherwise."""
    networks: list[Network] = []
    for value in values:
        for item in value.split(","):
            text = item.strip()
            if not text:
                continue
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise ValueError(f"{flag} {text!r}: not an address or CIDR") from None
    return tuple(networks)



def _argparse_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` raising what argparse reports as a usage error."""

    def convert(value: str) -> T:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__.removeprefix("parse_")
    return convert


address = _argparse_type(parse_address)
duration = _argparse_type(parse_duration)
size = _argparse_type(parse_size)
rate = _argparse_type(parse_rate)


def address_or_off(value: str) -> tuple[str, int] | None:
    """argparse type for an optional listener: ``HOST:PORT``, or ``off`` (or empty): None."""
    if value.strip() in ("", OFF):
        return None
    return address(value)


def text_or_none(value: str) -> str | None:
    """argparse type for an optional name: empty (as an unset variable reads) is None."""
    return value.strip() or None


def show_address(value: tuple[str, int] | None) -> str:
    if value is None:
        return OFF
    host, port = value
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def show_number(value: float) -> str:
    """``10.0`` -> ``10``, ``0.25`` -> ``0.25``: no trailing zeros, no precision lost."""
    return f"{value:.15g}"


def show_duration(seconds: float) -> str:
    """Seconds as the shortest exact duration :func:`parse_duration` reads back."""
    if 0 < seconds < 1:
        return f"{show_number(seconds * 1000)}ms"
    for unit, suffix in ((3600.0, "h"), (60.0, "m")):
        if seconds >= 2 * unit and seconds % unit == 0:
            return f"{show_number(seconds / unit)}{suffix}"
    return f"{show_number(seconds)}s"


def show_size(value: int) -> str:
    """Bytes as the largest binary unit that divides them (``3Mi``), else the number."""
    for factor, suffix in ((1024**3, "Gi"), (1024**2, "Mi"), (1024, "Ki")):
        if value >= factor and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def check_tunnel_liveness(keepalive: float, timeout: float) -> None:
    """ValueError naming ``--tunnel-keepalive`` and ``--tunnel-timeout`` if they cannot work."""
    if keepalive <= 0 or timeout <= 0:
        raise ValueError("--tunnel-keepalive and --tunnel-timeout must be positive")
    if timeout <= keepalive:
        raise ValueError(f"--tunnel-timeout {timeout:g}s must be longer than "
                         f"--tunnel-keepalive {keepalive:g}s (else a healthy idle session "
                         "is declared dead before its PING is answered)")
