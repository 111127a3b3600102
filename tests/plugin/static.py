"""The static plugin for the tests: built by deploy/plugin/build.sh, run in isolated roots.

`built()` runs the build once per set of inputs (build.sh skips a build whose inputs are
unchanged) in a buildah store of its own under ~/.cache/hubproxy-plugin, holding a file lock so
that parallel test workers wait for one build instead of making two. It needs root, buildah and
mmdebstrap, which .ci/run installs: with CI=true their absence fails the test instead of
skipping it.

`run_isolated()` runs a command the way a container runtime would, with nothing from this
machine: a root directory that holds only what the test put there, remounted read-only, `/proc`,
and the volumes given (a host directory, or a tmpfs as an emptyDir), as uid 65532 with only the
environment given. It uses a private mount namespace (`unshare`) and `chroot`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import in_ci

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "plugin" / "build.sh"
TAG = "localhost/hubproxy-plugin:test"
HOME_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
IMAGE_CACHE = Path(os.environ.get("HUBPROXY_IMAGE_CACHE") or HOME_CACHE / "hubproxy-image")
PLUGIN_CACHE = Path(os.environ.get("HUBPROXY_PLUGIN_CACHE") or HOME_CACHE / "hubproxy-plugin")
STORE = PLUGIN_CACHE / "store"
EXECUTABLE_IN_IMAGE = "bin/hubproxy-plugin"
NOBODY = 65532
V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
EXEC_EXTENSION = "client.authentication.k8s.io/exec"

# vfs: no overlay mounts needed (as STORAGE_DRIVER, like build.sh).
os.environ["STORAGE_DRIVER"] = os.environ.get("STORAGE_DRIVER", "vfs")




def require_build_tools() -> None:
    """Skip (fail under CI=true) where the plugin cannot be built or run in isolation."""
    missing = [tool for tool in ("buildah", "mmdebstrap", "unshare", "chroot")
               if shutil.which(tool) is None]
    why = ""
    if missing:
        why = f"needs {', '.join(missing)} (.ci/run installs buildah and mmdebstrap)"
    elif os.geteuid() != 0:
        why = "needs root (buildah, mount namespaces and chroot)"
    if why:
        if in_ci():
            pytest.fail(f"static plugin: {why}; CI=true: it must run", pytrace=False)
        pytest.skip(f"static plugin: {why}")


def buildah(*args: str) -> list[str]:
    return ["buildah", "--root", str(STORE / "root"), "--runroot", str(STORE / "run"), *args]


def run(*args: str, timeout: float = 120, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          **kwargs)  # type: ignore[call-overload]


@dataclass(frozen=True)
class StaticPlugin:
    tag: str
    executable: Path  # the copy build.sh leaves in the plugin cache
    build_seconds: float


@contextmanager
def _build_lock() -> Iterator[None]:
    PLUGIN_CACHE.mkdir(parents=True, exist_ok=True)
    with open(PLUGIN_CACHE / "test-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def built() -> StaticPlugin:
    """The plugin image and its executable, built from this tree (or unchanged inputs)."""
    require_build_tools()
    env = {**os.environ, "HUBPROXY_IMAGE_CACHE": str(IMAGE_CACHE),
           "HUBPROXY_IMAGE_STORE": str(STORE), "HUBPROXY_PLUGIN_CACHE": str(PLUGIN_CACHE),
           "HUBPROXY_IMAGE_PRUNE": "1"}
    with _build_lock():
        started = time.monotonic()
        done = subprocess.run([str(BUILD), TAG], capture_output=True, text=True, timeout=1200,
                              env=env)
        seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == TAG
    print(f"deploy/plugin/build.sh: {seconds:.0f} s; {done.stderr.strip().splitlines()[-1]}")
    return StaticPlugin(TAG, PLUGIN_CACHE / "hubproxy-plugin", seconds)


@contextmanager
def image_root(tag: str) -> Iterator[Path]:
    """The image's root filesystem (a working container, mounted), removed afterwards."""
    made = run(*buildah("from", "--pull-never", "--quiet", tag))
    assert made.returncode == 0, made.stderr
    container = made.stdout.strip()
    try:
        mounted = run(*buildah("mount", container))
        assert mounted.returncode == 0, mounted.stderr
        yield Path(mounted.stdout.strip())
    finally:
        run(*buildah("umount", container))
        run(*buildah("rm", container))


def files_under(root: Path) -> list[str]:
    """Every file and symlink under root, relative (directories are not listed)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


@dataclass(frozen=True)
class Volume:
    """What a container runtime mounts at `target`: a host directory, or (None) an emptyDir."""

    target: str
    source: Path | None = None
    read_only: bool = False


def run_isolated(root: Path, argv: Sequence[str], env: Mapping[str, str],
                 volumes: Sequence[Volume] = (), *, uid: int = NOBODY,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run argv in `root` as a container runtime would (see the module docstring).

    Mount points are made in `root` first, as a runtime makes them; the root is then remounted
    read-only, so nothing else can appear in it."""
    for target in ("proc", *(v.target.lstrip("/") for v in volumes)):
        (root / target).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    q = shlex.quote
    steps = [f"mount --bind {q(str(root))} {q(str(root))}",
             f"mount -o remount,bind,ro {q(str(root))}"]
    for volume in volumes:
        where = q(str(root / volume.target.lstrip("/")))
        if volume.source is None:
            steps.append(f"mount -t tmpfs -o mode=1777,size=128m emptydir {where}")
        else:
            steps.append(f"mount --bind {q(str(volume.source))} {where}")
            if volume.read_only:
                steps.append(f"mount -o remount,bind,ro {where}")
    steps.append(f"mount -t proc proc {q(str(root / 'proc'))}")
    assignments = " ".join(q(f"{k}={v}") for k, v in env.items())
    steps.append(f"exec /usr/bin/env -i {assignments} /usr/sbin/chroot --userspec={uid}:{uid} "
                 f"{q(str(root))} {' '.join(q(a) for a in argv)}")
    return run("unshare", "--mount", "--pid", "--fork", "/bin/sh", "-ec", "\n".join(steps),
               timeout=timeout)


def exec_info(api_version: str, cluster_name: str | None = "cluster1",
              server: str = "https://hubproxy.example:9092/cluster1") -> str:
    """KUBERNETES_EXEC_INFO as client-go writes it with provideClusterInfo: true and the
    cluster's exec extension (None: a client that sends no cluster information)."""
    spec: dict[str, object] = {"interactive": False}
    if cluster_name is not None:
        spec["cluster"] = {"server": server, "certificate-authority-data": "LS0tLS1CRUdJTg==",
                           "config": {"clusterName": cluster_name}}
    return json.dumps({"kind": "ExecCredential", "apiVersion": api_version, "spec": spec})
