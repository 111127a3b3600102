"""Where the real kube-apiserver and etcd binaries come from (envtest conventions).

1. ``KUBEBUILDER_ASSETS``: a directory holding ``kube-apiserver`` and ``etcd`` (what
   ``setup-envtest use 1.36 -p path`` prints), so users with their own binaries run the same tier.
2. Otherwise ``../shared/kube/kube-apiserver.xz`` next to the checkout (as CI lays it out),
   unpacked once into ``~/.cache/hubproxy/kube/<sha256>/`` and checked against
   ``kube-apiserver.sha256``, with ``etcd`` from ``PATH`` (Debian's ``etcd-server``).

Anything missing raises `MissingBinaries` with one sentence that says what and where.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_KUBE = REPO.parent / "shared" / "kube"


class MissingBinaries(Exception):
    """The tier cannot run here; the message is the reason shown for the skip (or CI failure)."""


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    origin: str  # where they were found, for the report line


def find_binaries() -> Binaries:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        root = Path(assets)
        found = {name: root / name for name in ("kube-apiserver", "etcd")}
        missing = [n for n, p in found.items() if not os.access(p, os.X_OK)]
        if missing:
            raise MissingBinaries(
                f"KUBEBUILDER_ASSETS={assets} has no executable {' or '.join(missing)}")
        return Binaries(found["kube-apiserver"], found["etcd"], f"KUBEBUILDER_ASSETS={assets}")
    etcd = shutil.which("etcd")
    if etcd is None:
        raise MissingBinaries(
            "no etcd on PATH (apt-get install etcd-server) and KUBEBUILDER_ASSETS is unset")
    return Binaries(unpacked_apiserver(SHARED_KUBE), Path(etcd), f"{SHARED_KUBE} + {etcd}")


def unpacked_apiserver(shared: Path, cache: Path | None = None) -> Path:
    """The verified kube-apiserver from ``shared``, unpacked at most once per content hash."""
    packed, digest_file = shared / "kube-apiserver.xz", shared / "kube-apiserver.sha256"
    if not packed.is_file() or not digest_file.is_file():
        raise MissingBinaries(
            f"no {packed.name} + {digest_file.name} in {shared} and KUBEBUILDER_ASSETS is unset")
    expected = digest_file.read_text().split()[0].lower()
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    target = cache / "hubproxy" / "kube" / expected / "kube-apiserver"
    if target.is_file() and os.access(target, os.X_OK):
        return target  # verified when it was written (below): 112 MB, not re-hashed every run
    target.parent.mkdir(parents=True, exist_ok=True)
    # Unpack to a temporary name and rename, so a concurrent or interrupted run never leaves
    # (or uses) a half-written binary under the final name.
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
        partial = Path(out.name)
        digest = hashlib.sha256()
        with lzma.open(packed) as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    if digest.hexdigest() != expected:
        partial.unlink()
        raise MissingBinaries(
            f"{packed} unpacks to sha256 {digest.hexdigest()}, expected {expected}")
    partial.chmod(0o755)
    partial.replace(target)
    return target
