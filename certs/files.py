"""Write and read certificate/key files in the Kubernetes TLS Secret layout.

Guarantees: private keys are created with mode 0600 (never briefly wider: the file is created
with that mode), certificates 0644; an existing file is never replaced unless ``force`` is set;
every file is written to a temporary name and renamed into place, so a process that reloads
certificates never reads half a file.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certs.issue import Issued, PrivateKey

KEY_MODE = 0o600
CERT_MODE = 0o644
DIR_MODE = 0o755


class FileExistsRefused(FileExistsError):
    """A target file exists and ``--force`` was not given."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        listed = ", ".join(str(p) for p in paths[:5]) + (" ..." if len(paths) > 5 else "")
        super().__init__(f"refusing to overwrite existing file(s) {listed} (use --force)")


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey) -> bytes:
    # PKCS#8 unencrypted: read by Python's ssl, OpenSSL, Go and Kubernetes alike.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def check_writable(paths: list[Path], *, force: bool) -> None:
    """Raise FileExistsRefused listing every existing path, unless ``force``.

    Called before anything is written, so a refused run leaves the directory untouched.
    """
    if force:
        return
    existing = [p for p in paths if p.exists() or p.is_symlink()]
    if existing:
        raise FileExistsRefused(existing)


def write_file(path: Path, data: bytes, mode: int, *, force: bool) -> None:
    """Atomically create ``path`` with ``mode``; refuse to replace it unless ``force``."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    check_writable([path], force=force)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it; make it exactly what we promise
        if not force and path.exists():
            raise FileExistsRefused([path])
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_pair(directory: Path, issued: Issued, ca: x509.Certificate | None, *, force: bool,
               cert_name: str = "tls.crt", key_name: str = "tls.key") -> None:
    """Write ``tls.key`` (0600), ``tls.crt`` and, if given, ``ca.crt`` (0644) into ``directory``.

    The key is written first: a reloader that sees the new certificate finds its key already there.
    """
    targets = [directory / key_name, directory / cert_name]
    if ca is not None:
        targets.append(directory / "ca.crt")
    check_writable(targets, force=force)
    write_file(directory / key_name, key_pem(issued.key), KEY_MODE, force=force)
    write_file(directory / cert_name, cert_pem(issued.cert), CERT_MODE, force=force)
    if ca is not None:
        write_file(directory / "ca.crt", cert_pem(ca), CERT_MODE, force=force)


def load_issued(cert_file: Path, key_file: Path) -> Issued:
    """Read a certificate and its key (e.g. a CA to issue more agents from)."""
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise ValueError(f"{key_file} does not belong to the certificate in {cert_file}")
    return Issued(cert, key)  # type: ignore[arg-type]
