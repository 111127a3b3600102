"""Flag values both programs parse the same way: addresses, counts and durations.

Each function is an argparse ``type=``: it returns the value or raises with a message that
repeats what was given, so ``--help``-style errors name the problem.
"""

from __future__ import annotations

import argparse


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
