"""Flag values both programs parse the same way: addresses, counts, sizes and durations.

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


def duration(value: str) -> float:
    """argparse type for :func:`parse_duration`."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_tunnel_liveness_arguments(parser: argparse.ArgumentParser, peer: str,
                                  keepalive: float) -> None:
    """``--tunnel-keepalive`` and ``--tunnel-timeout``, the same on gateway and agent.

    ``keepalive`` is this side's default (``tunnel.session_state``: the agent pings an idle
    session, the hub's is longer and it mostly answers); the timeout's is the tunnel's, so a
    frozen ``peer`` is found within about 8 s on either side.
    """
    from tunnel.liveness import MAX_TICK
    from tunnel.session_state import SessionConfig

    defaults = SessionConfig()
    group = parser.add_argument_group("tunnel liveness")
    group.add_argument("--tunnel-keepalive", type=duration, default=keepalive,
                       metavar="DURATION",
                       help=f"send a PING after this long without a frame from the {peer} "
                       f"(default: {keepalive:g}s; busy sessions never ping)")
    group.add_argument("--tunnel-timeout", type=duration, default=defaults.dead_after,
                       metavar="DURATION",
                       help=f"declare the session dead (its requests end, 503) after this long "
                       f"without a frame from the {peer} (default: {defaults.dead_after:g}s; "
                       f"a frozen peer is found within it plus {MAX_TICK:g}s)")


def tunnel_liveness(args: argparse.Namespace) -> tuple[float, float]:
    """(ping_after, dead_after) from the flags; ValueError naming them if they cannot work."""
    keepalive, timeout = args.tunnel_keepalive, args.tunnel_timeout
    if keepalive <= 0 or timeout <= 0:
        raise ValueError("--tunnel-keepalive and --tunnel-timeout must be positive")
    if timeout <= keepalive:
        raise ValueError(f"--tunnel-timeout {timeout:g}s must be longer than "
                         f"--tunnel-keepalive {keepalive:g}s (else a healthy idle session "
                         "is declared dead before its PING is answered)")
    return keepalive, timeout
