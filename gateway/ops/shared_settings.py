"""Settings both programs have, declared once: tunnel liveness and memory, health, logging, and
where an agent certificate names its cluster.

Each function is a :func:`gateway.ops.settings.setting` for a field of ``GatewayConfig`` and of
``AgentConfig``; the defaults come from where the rule lives (the tunnel's ``SessionConfig``,
``tunnel.identity``).
"""

from __future__ import annotations

from gateway.ops.flags import show_duration, show_size
from gateway.ops.settings import ADDRESS_OR_OFF, DURATION, SIZE, setting
from tunnel.identity import NAMING_SCHEMES, URI_NAMING
from tunnel.liveness import MAX_TICK
from tunnel.session_state import DEFAULT_PROCESS_MEMORY_BUDGET, SessionConfig

TUNNEL = "tunnel"
_TUNNEL_DEFAULTS = SessionConfig()

DEFAULT_HEALTH_LISTEN = ("0.0.0.0", 8000)
LOG_LEVELS = ("debug", "info", "warning", "error")


def tunnel_keepalive(peer: str, default: float) -> float:
    """PING after this much silence from ``peer``. ``default`` is this side's
    (``tunnel.session_state``: the agent pings an idle session, the hub's keepalive is longer
    and it mostly answers)."""
    return setting(default, kind=DURATION, group=TUNNEL,
                   help=f"send a PING after this long without a frame from the {peer} "
                   "(default: {default}; busy sessions never ping)")


def tunnel_timeout(peer: str) -> float:
    """The session is dead after this much silence from ``peer`` (the tunnel's 8 s, either
    side)."""
    return setting(_TUNNEL_DEFAULTS.dead_after, kind=DURATION, group=TUNNEL,
                   help="declare the session dead (its requests end, 503) after this long "
                   f"without a frame from the {peer} (default: {{default}}; a frozen peer is "
                   f"found within it plus {show_duration(MAX_TICK)})")


def tunnel_memory_budget() -> int:
    """Bytes the process's tunnel sessions may grow their receive windows by, together."""
    return setting(DEFAULT_PROCESS_MEMORY_BUDGET, kind=SIZE, group=TUNNEL,
                   help="memory all tunnel sessions of this process together may add to their "
                   "receive windows as they grow them for fast, distant peers (each session "
                   f"also has its own {show_size(_TUNNEL_DEFAULTS.session_memory_budget)} cap); "
                   "beyond it windows stop growing, nothing is refused. Bytes, or with "
                   "Ki/Mi/Gi")


def health_listen(group: str, what: str) -> tuple[str, int] | None:
    return setting(DEFAULT_HEALTH_LISTEN, kind=ADDRESS_OR_OFF, group=group,
                   help=f"plain HTTP {what}, unauthenticated: keep it on a private address; "
                   "'off' to disable")


def log_level(more: str = "") -> str:
    return setting("info", choices=LOG_LEVELS, group="logging",
                   help="level of diagnostics on stderr (default: {default})" + more)


def agent_identity(group: str, help: str) -> str:
    """How an agent certificate names its cluster (``tunnel.identity.AgentNaming``)."""
    return setting(URI_NAMING.scheme, choices=NAMING_SCHEMES, group=group, help=help)


def ocm_addon_name(group: str, help: str) -> str:
    """With ``--agent-identity=ocm``, the add-on whose certificates name clusters."""
    return setting(URI_NAMING.ocm_addon, metavar="NAME", group=group, help=help)
