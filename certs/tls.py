"""Build ``ssl.SSLContext``s from certificate files, and rebuild them when the files change.

Contracts:

* :func:`server_context` requires and verifies a client certificate whenever a client CA is
  given (``CERT_REQUIRED``; a peer without one, or with one from another CA, fails the handshake).
  TLS 1.2 is the floor; ``min_version=ssl.TLSVersion.TLSv1_3`` for TLS 1.3 only (the tunnel).
* :func:`client_context` trusts exactly the given CA file, never the system roots, and checks
  the host name.
* :class:`ReloadingContext` returns the newest valid context from :meth:`~ReloadingContext.current`
  and checks the files at most every ``check_interval`` seconds (a few ``stat`` calls). A
  replacement that does not load (half-written pair, key that does not match, garbage) is
  logged with the reason and the previous context stays in use; the first build must succeed
  (fail closed at start-up).
* :func:`reloading_server_context` gives an asyncio server one fixed context whose
  ``sni_callback`` moves each new connection onto ``reloading.current()`` before the server
  certificate is chosen, so replaced certificates and client CAs apply to new connections
  without a restart. Clients simply call ``current()`` per new connection.

Nothing here ever logs key material: only file names and the exception's reason.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

TLS1_2 = ssl.TLSVersion.TLSv1_2
TLS1_3 = ssl.TLSVersion.TLSv1_3


def server_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    client_ca_file: str | os.PathLike[str] | None,
    *,
    min_version: ssl.TLSVersion = TLS1_2,
    alpn_protocols: Sequence[str] | None = None,
    client_cert_optional: bool = False,
) -> ssl.SSLContext:
    """A server context; client certificates are REQUIRED when ``client_ca_file`` is given.

    ``client_cert_optional``: asked for and verified when sent, but a peer may send none
    (CERT_OPTIONAL); the caller must then refuse what needs one (the tunnel's join door).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = min_version
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    if client_ca_file is not None:
        ctx.load_verify_locations(cafile=os.fspath(client_ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL if client_cert_optional else ssl.CERT_REQUIRED
    if alpn_protocols:
        ctx.set_alpn_protocols(list(alpn_protocols))
    return ctx


def client_context(
    ca_file: str | os.PathLike[str],
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
    *,
    min_version: ssl.TLSVersion = TLS1_2,
    alpn_protocols: Sequence[str] | None = None,
) -> ssl.SSLContext:
    """A client context pinned to ``ca_file`` (no system roots), with an optional client cert."""
    # PROTOCOL_TLS_CLIENT starts with CERT_REQUIRED + check_hostname and an empty trust store;
    # we never call load_default_certs(), so only ca_file is trusted.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = min_version
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.load_verify_locations(cafile=os.fspath(ca_file))
    if (cert_file is None) != (key_file is None):
        raise ValueError("client certificate and key must be given together")
    if cert_file is not None and key_file is not None:
        ctx.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    if alpn_protocols:
        ctx.set_alpn_protocols(list(alpn_protocols))
    return ctx


# (device, inode, size, mtime_ns) per file; None for a file that is missing right now.
_Signature = tuple[tuple[int, int, int, int] | None, ...]


def _signature(files: Sequence[str]) -> _Signature:
    out: list[tuple[int, int, int, int] | None] = []
    for name in files:
        try:
            st = os.stat(name)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ReloadingContext:
    """The newest valid context built by ``build`` from ``files``.

    ``build`` is called once now (its exception propagates: no context, no server) and again
    whenever a file's inode, size or mtime changes, checked at most every ``check_interval``
    seconds from :meth:`current`. Thread-safe; cheap enough to call per connection.
    """

    def __init__(
        self,
        build: Callable[[], ssl.SSLContext],
        files: Sequence[str | os.PathLike[str]],
        check_interval: float = 2.0,
    ) -> None:
        self._build = build
        self.files = [os.fspath(f) for f in files]
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._signature = _signature(self.files)
        self._context = build()
        self._checked_at = time.monotonic()
        self.generation = 0  # bumped on every successful rebuild (observability, tests)
        self.last_error: str | None = None

    def build(self) -> ssl.SSLContext:
        """A fresh context from the current files (raises if they do not load)."""
        return self._build()

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked_at < self.check_interval:
            return self._context
        with self._lock:
            if now - self._checked_at >= self.check_interval:
                self._checked_at = now
                self._maybe_reload()
            return self._context

    def check_now(self) -> bool:
        """Check the files immediately; True if a new context was installed."""
        with self._lock:
            self._checked_at = time.monotonic()
            return self._maybe_reload()

    def _maybe_reload(self) -> bool:
        signature = _signature(self.files)
        if signature == self._signature:
            return False
        # Remember what we tried even if it fails: the same broken files are not retried (and
        # logged) on every connection; the next change to any of them triggers a new attempt.
        self._signature = signature
        try:
            context = self._build()
        except Exception as exc:  # any failure: keep serving with what we had
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "certificate reload from %s failed, keeping the previous certificates: %s",
                ", ".join(self.files),
                self.last_error,
            )
            return False
        self._context = context
        self.generation += 1
        self.last_error = None
        log.info("reloaded certificates from %s", ", ".join(self.files))
        return True


def reloading_server_context(reloading: ReloadingContext) -> ssl.SSLContext:
    """One context to hand to ``asyncio.start_server``/``loop.create_server``.

    It is itself built by the same ``build`` (so the handshake settings fixed at connection
    set-up — verify mode, protocol versions — match), and its ``sni_callback`` switches every
    new connection to ``reloading.current()``, whose certificate, key and client CA store are
    then used. The callback runs for clients that send no SNI too (e.g. connecting by IP).
    """
    outer = reloading.build()

    def _switch(ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                _ctx: ssl.SSLContext) -> None:
        ssl_object.context = reloading.current()

    outer.sni_callback = _switch
    return outer
