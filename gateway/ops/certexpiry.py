"""When do this process's own certificates expire? Read from their PEM files, cached by mtime.

For the ``hubproxy_certificate_expiry_timestamp_seconds`` gauge: certificates are reloaded from
disk when they change (certs/tls.py), so the gauge follows the file, re-parsed only when its
modification time changes (a scrape normally costs one ``stat``).
"""

from __future__ import annotations

import os


class CertificateFiles:
    """``name -> tls.crt path``; :meth:`expiries` gives ``name -> not_after`` (epoch seconds)
    for the files that exist and parse (others are left out: the gauge disappears, and the
    program's own reload logs say why)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self._cache: dict[str, tuple[float, float]] = {}  # path -> (mtime, not_after)

    def expiries(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, path in self.files.items():
            when = self._not_after(path)
            if when is not None:
                out[name] = when
        return out

    def _not_after(self, path: str) -> float | None:
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return None
        cached = self._cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        from cryptography import x509

        try:
            with open(path, "rb") as fh:
                cert = x509.load_pem_x509_certificate(fh.read())
        except (OSError, ValueError):
            return None
        when = cert.not_valid_after_utc.timestamp()
        self._cache[path] = (mtime, when)
        return when
