"""The diagnostics log (stderr) of both programs: level, format, and no credential at any level.

DESIGN §6 rule 5 says tokens never appear in logs -- including at ``--log-level debug`` and
including what libraries log. Two layers, because neither alone is enough:

1. **Noisy library loggers are pinned to INFO** even when the process runs at debug
   (:data:`PINNED_LOGGERS`). kubernetes-asyncio logs every response body at debug, and the hub's
   TokenReview answer echoes the reviewed token in ``spec.token`` and the full user (uid,
   groups, extra) in ``status``; its SubjectAccessReview answers carry the full identity too.
   Nothing those loggers say at debug is worth that.
2. **A redacting filter on every root handler** (:class:`RedactingFilter`), for whatever still
   gets through -- a library we did not pin, an exception text, a message of ours written
   carelessly. It works on the formatted message, the exception text and the stack text, and
   replaces: ``Bearer <token>`` (any case), the WebSocket ``base64url.bearer.authorization.k8s.io.``
   subprotocol, anything shaped like a JWT (``eyJ...``), values of ``token``/``password``-like
   fields in JSON, Python reprs, headers and query strings, and -- whole -- any message that
   carries a TokenReview/SubjectAccessReview/TokenRequest body.

HPACK (HTTP/2 header compression, the ``hpack`` library, which ``h2`` uses) logs every header
field it encodes or decodes at DEBUG, the bearer token and the agent's own credential included, some
thirty calls per request. Pinning its loggers is not enough there: even refused, those calls
were a quarter of the HPACK time of each HTTP/2 request, so their ``debug`` does nothing at all
(:data:`MUTED_DEBUG_LOGGERS`).

Opaque tokens that appear in none of those shapes cannot be recognised by a filter; that is
what layer 1 and the rule "never log a credential" in our own code are for (the test in
``tests/gateway/test_security_hardening.py`` greps a debug run for every token kind).
"""

from __future__ import annotations

import logging
import re
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Loggers kept at INFO or above whatever --log-level says (see the module docstring).
PINNED_LOGGERS = (
    "kubernetes_asyncio",  # client.rest logs response bodies; config logs kubeconfig steps
    "client",  # kubernetes_asyncio.client.Configuration's "package_logger"
    "urllib3",  # its "urllib3_logger"
    "aiohttp",
    "asyncio",
    "websockets",
    "hpack",
    "h2",
)
# Loggers whose debug() is a no-op, not only refused (see the module docstring).
MUTED_DEBUG_LOGGERS = ("hpack.hpack", "hpack.table")

REDACTED = "<redacted>"

_REPLACEMENTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)(bearer\s+)[^\s\"',;]+"), r"\1" + REDACTED),
    (re.compile(r"(base64url\.bearer\.authorization\.k8s\.io\.)[A-Za-z0-9_=-]*"),
     r"\1" + REDACTED),
    (re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"), REDACTED),
    (re.compile(
        r"(?i)([\"']?(?<![A-Za-z0-9_-])(?:token|access_token|id_token|refresh_token|password|"
        r"client-key-data|client_key_data)[\"']?\s*[:=]\s*b?[\"']?)[^\"'\s,}&]+"),
     r"\1" + REDACTED),
)
_REVIEW_BODY = re.compile(r"(TokenReview|SubjectAccessReview|TokenRequest)\W.*\bspec\b",
                          re.DOTALL)


def redact(text: str) -> str:
    """``text`` without anything that looks like a credential (see the module docstring)."""
    match = _REVIEW_BODY.search(text)
    if match:
        return f"<a {match.group(1)} body, redacted>"
    for pattern, replacement in _REPLACEMENTS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites each record's message (and exception/stack text) through :func:`redact`.

    Installed on handlers, not loggers: a logger's filters do not see records that propagate
    from its children, a handler's filters see every record it would write.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep only what is safe to show
            message = f"<unformattable message from {record.name}>"
        record.msg = redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def configure(level_name: str) -> None:
    """Diagnostics at ``level_name`` on stderr, redacted, with the library loggers pinned."""
    level = getattr(logging, level_name.upper())
    logging.basicConfig(level=level, format=FORMAT, stream=sys.stderr)
    redacting = RedactingFilter()
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(redacting)
    for name in PINNED_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.INFO))
    for name in MUTED_DEBUG_LOGGERS:
        # An instance attribute over Logger.debug: the module-level ``log`` of hpack is this
        # same object (getLogger returns one logger per name), whenever hpack is imported.
        logging.getLogger(name).debug = _discard  # type: ignore[method-assign]


def _discard(*args: object, **kwargs: object) -> None:
    return None
