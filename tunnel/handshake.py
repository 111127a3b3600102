"""Why an agent's TLS handshake failed, in words an operator acts on (pure, no I/O).

Two sides of the same event:

* the hub sees the handshake fail (or the certificate name no cluster) and classifies it with
  :func:`classify_hub_failure` into a short, bounded ``reason`` (a metric label) and a sentence;
* with TLS 1.3 the agent's own handshake has already succeeded when the hub checks its
  certificate, so the agent learns of the refusal from the TLS alert the hub sends, or from the
  GOAWAY the hub sends when the certificate names no cluster: :func:`describe_hub_refusal`.

Nothing here reads key material; the sentences come from OpenSSL's verification result and
alert names, never from the certificate's contents.

:class:`LogThrottle` keeps a misconfigured agent that redials every few seconds from flooding
the log: the first failure per key is logged, then at most one line per interval, saying how
many were left out.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

# How long an agent gives the hub's TLS handshake (its dial); the hub's listener refuses a
# connection that has waited most of it in the listen queue (tunnel.listener.STALE_AFTER).
AGENT_HANDSHAKE_TIMEOUT = 10.0

# Reasons (the ``reason`` label of hubproxy_tunnel_handshake_failures_total). Certificate
# problems are logged at WARNING; the rest (port scanners, load balancer TCP checks, plain-text
# clients, slow peers) only count, and are logged at DEBUG.
EXPIRED = "expired"
NOT_YET_VALID = "not_yet_valid"
UNKNOWN_CA = "unknown_ca"
REVOKED = "revoked"
WRONG_NAME = "wrong_name"
NO_CERTIFICATE = "no_certificate"
BAD_CERTIFICATE = "bad_certificate"
PROTOCOL = "protocol"
TIMEOUT = "timeout"
ABORTED = "aborted"
REASONS = (EXPIRED, NOT_YET_VALID, UNKNOWN_CA, REVOKED, WRONG_NAME, NO_CERTIFICATE,
           BAD_CERTIFICATE, PROTOCOL, TIMEOUT, ABORTED)
CERTIFICATE_REASONS = frozenset(
    {EXPIRED, NOT_YET_VALID, UNKNOWN_CA, REVOKED, WRONG_NAME, NO_CERTIFICATE, BAD_CERTIFICATE}
)

# OpenSSL X509_V_ERR_* codes (x509_vfy.h): stable numbers.
_VERIFY_CODES: dict[int, tuple[str, str]] = {
    9: (NOT_YET_VALID, "the agent certificate is not valid yet (check the agent's clock)"),
    10: (EXPIRED, "the agent certificate has expired"),
    2: (UNKNOWN_CA, "the agent certificate is not signed by the tunnel CA (unknown CA)"),
    7: (UNKNOWN_CA, "the agent certificate's signature does not verify against the tunnel CA"),
    18: (UNKNOWN_CA, "the agent certificate is self-signed (unknown CA)"),
    19: (UNKNOWN_CA, "the agent certificate chains to a CA the hub does not trust (unknown CA)"),
    20: (UNKNOWN_CA, "the agent certificate is not signed by the tunnel CA (unknown CA)"),
    21: (UNKNOWN_CA, "the agent certificate is not signed by the tunnel CA (unknown CA)"),
    23: (REVOKED, "the agent certificate has been revoked"),
    26: (BAD_CERTIFICATE, "the agent certificate is not for client authentication"),
}


@dataclass(frozen=True)
class HandshakeFailure:
    reason: str  # one of REASONS
    message: str  # one sentence for the log; no key material, no certificate contents

    @property
    def about_certificate(self) -> bool:
        return self.reason in CERTIFICATE_REASONS


def classify_hub_failure(exc: BaseException) -> HandshakeFailure:
    """What the hub's failed server-side handshake (``loop.start_tls``) means."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = getattr(exc, "verify_code", None)
        if code in _VERIFY_CODES:
            return HandshakeFailure(*_VERIFY_CODES[code])
        detail = getattr(exc, "verify_message", "") or "verification failed"
        return HandshakeFailure(BAD_CERTIFICATE, f"the agent certificate was refused: {detail}")
    if isinstance(exc, ssl.SSLError):
        reason = (getattr(exc, "reason", None) or "").upper()
        if reason in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_REQUIRED"):
            return HandshakeFailure(NO_CERTIFICATE, "the peer sent no client certificate")
        if "CERTIFICATE" in reason or "CERT" in reason:
            return HandshakeFailure(BAD_CERTIFICATE, f"the agent certificate was refused: "
                                    f"{reason.lower()}")
        return HandshakeFailure(PROTOCOL, f"TLS handshake failed: {reason.lower() or exc}")
    if isinstance(exc, TimeoutError) or "handshake is taking longer" in str(exc):
        return HandshakeFailure(TIMEOUT, "the peer did not complete the TLS handshake in time")
    return HandshakeFailure(ABORTED, f"the connection ended during the TLS handshake "
                            f"({type(exc).__name__})")


def wrong_name(detail: str) -> HandshakeFailure:
    """The certificate verified but does not name exactly one valid cluster."""
    return HandshakeFailure(WRONG_NAME, f"the agent certificate names no valid cluster: {detail}")


# The plaintext alert a busy hub answers a ClientHello with (tunnel.admission.BUSY_ALERT).
BUSY_ALERT_REASON = "TLSV1_ALERT_USER_CANCELLED"


# What the agent reads in the hub's TLS alert (OpenSSL reason names of received alerts).
_ALERTS: dict[str, str] = {
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "our certificate has expired (or is not valid yet)",
    "TLSV1_ALERT_UNKNOWN_CA": "our certificate is not signed by a CA the hub trusts "
                              "(unknown CA)",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "our certificate has been revoked",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the hub refused our certificate (bad certificate: "
                                   "not valid yet, or malformed)",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "the hub refused our certificate (not for client "
                                           "authentication)",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the hub wants a client certificate and we sent none",
    "TLSV1_ALERT_DECRYPT_ERROR": "the hub could not verify our certificate's signature",
    BUSY_ALERT_REASON: "the hub is busy (too many agents connecting at once)",
}


def hub_busy(error: BaseException) -> bool:
    """Did a dial fail because the hub is busy (so the agent must back off, not redial at
    once)? The hub's busy alert, a dial that timed out, or a connection the hub dropped before
    the TLS handshake completed. A refused connection (nothing listening) and certificate
    refusals are not: those are handled as any failed dial."""
    if isinstance(error, ssl.SSLError):
        reason = (getattr(error, "reason", None) or "").upper()
        return reason == BUSY_ALERT_REASON or isinstance(
            error, ssl.SSLEOFError | ssl.SSLZeroReturnError) or "EOF" in str(error)
    if isinstance(error, ConnectionRefusedError):
        return False
    return isinstance(error, TimeoutError | ConnectionResetError | ConnectionAbortedError
                      | BrokenPipeError)


def describe_hub_refusal(error: BaseException | None, goaway_message: str | None) -> str | None:
    """Why the hub ended a fresh session before accepting it, or None if it does not say.

    ``error`` is what ended the connection (``connection_lost``'s exception), ``goaway_message``
    the text of a GOAWAY the hub sent before any SETTINGS (a certificate naming no cluster).
    """
    if goaway_message:
        return f"the hub refused our certificate: {goaway_message}"
    reason = getattr(error, "reason", None) if isinstance(error, ssl.SSLError) else None
    if reason and reason.upper() in _ALERTS:
        return _ALERTS[reason.upper()]
    if reason and "ALERT" in reason.upper():
        return f"the hub ended the TLS session: {reason.lower()}"
    return None


class LogThrottle:
    """Allow one log line per key per ``interval`` seconds; count the ones left out.

    Bounded: at most ``max_keys`` keys are remembered (the oldest are forgotten first), so a
    flood from many addresses costs a fixed amount of memory.
    """

    def __init__(self, interval: float = 60.0, max_keys: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self.clock = clock
        self._last: dict[object, float] = {}
        self._suppressed: dict[object, int] = {}

    def allow(self, key: object) -> tuple[bool, int]:
        """(log now?, how many were suppressed for this key since the last line)."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False, 0
        if last is None and len(self._last) >= self.max_keys:
            oldest = next(iter(self._last))
            del self._last[oldest]
            self._suppressed.pop(oldest, None)
        self._last.pop(key, None)
        self._last[key] = now  # re-inserted: dict order is oldest first
        return True, self._suppressed.pop(key, 0)
