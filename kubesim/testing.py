"""Run kubesim inside a test: a real TLS apiserver stand-in on a free 127.0.0.1 port.

    from kubesim.testing import run_kubesim

    async def test_something(tmp_path):
        async with run_kubesim(tmp_path, users=[("t0k3n", "alice", "uid-1", ["devs"])],
                               crds=[CLUSTERPROFILE_CRD]) as sim:
            kubeconfig = sim.write_kubeconfig(tmp_path / "kc", token=sim.admin_token)
            sa_token = sim.mint_token("default", "builder", audiences=["hubproxy"])
            sim.grant("User:alice", verbs=["get", "list"], resources=["pods"], namespace="default")
            rc, out, err = await sim.kubectl("get", "pods", token="t0k3n")
            assert all(r.header("Authorization") != [f"Bearer {sa_token}"] for r in sim.received)

`run_kubesim_in_thread(...)` is the same thing for synchronous tests: the server runs on its
own event loop in a daemon thread and the handle's methods are safe to call from the test.

The handle (`RunningKubeSim`) gives: `url`, `host`, `port`, `ca_file`, `admin_token`
(user `kubesim-admin` in `system:masters`), `sim` (the KubeSim), `store`, `received` (every
request as received: method, raw path, headers, authenticated user, impersonated user,
status), `write_kubeconfig()`, `mint_token()`, `apply()`, `add_user()`, `grant()`,
`kubectl()` and `api_client()` (kubernetes-asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web

from kubesim.auth import StaticUser
from kubesim.server import Config, KubeSim, ReceivedRequest, start
from kubesim.tls import ensure_serving_cert, server_context

T = TypeVar("T")
ADMIN_USER = "kubesim-admin"
# The upstream ClusterProfile CRD, shipped next to the repository (../shared/crds/).
CLUSTERPROFILE_CRD = Path(
    os.environ.get(
        "KUBESIM_CLUSTERPROFILE_CRD",
        Path(__file__).resolve().parents[2]
        / "shared"
        / "crds"
        / "multicluster.x-k8s.io_clusterprofiles.yaml",
    )
)
KUBECTL = os.environ.get("KUBECTL", "kubectl")

UserSpec = StaticUser | tuple[Any, ...]


def load_yaml_objects(
    source: str | os.PathLike[str] | dict[str, Any] | Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Objects from a dict, a list of dicts, a YAML file path, or YAML text (multi-document ok)."""
    if isinstance(source, dict):
        return [source]
    if isinstance(source, list | tuple):
        out: list[dict[str, Any]] = []
        for item in source:
            out.extend(load_yaml_objects(item))
        return out
    text = str(source)
    if isinstance(source, os.PathLike) or ("\n" not in text and Path(text).exists()):
        text = Path(text).read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    flat: list[dict[str, Any]] = []
    for doc in docs:
        if doc.get("kind", "").endswith("List") and "items" in doc:
            flat.extend(doc["items"])
        else:
            flat.append(doc)
    return flat


def _users(users: Iterable[UserSpec] | Mapping[str, str]) -> list[StaticUser]:
    if isinstance(users, Mapping):
        return [StaticUser(token, name) for token, name in users.items()]
    out = []
    for u in users:
        if isinstance(u, StaticUser):
            out.append(u)
        else:
            token, name, *rest = u
            uid = rest[0] if rest else ""
            groups = rest[1] if len(rest) > 1 else ()
            if isinstance(groups, str):
                groups = [g for g in groups.split(",") if g]
            out.append(StaticUser(token, name, uid, tuple(groups)))
    return out


class RunningKubeSim:
    """Handle on a running kubesim; see the module docstring."""

    def __init__(
        self,
        sim: KubeSim,
        host: str,
        port: int,
        ca_file: str,
        admin_token: str,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.sim = sim
        self.host = host
        self.port = port
        self.url = f"https://{host}:{port}"
        self.ca_file = ca_file
        self.admin_token = admin_token
        self.admin_user = ADMIN_USER
        self._loop = loop

    # Everything that touches state runs on the server's loop (matters for the thread variant).
    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return fn(*args, **kwargs)
        future = asyncio.run_coroutine_threadsafe(self._async(fn, *args, **kwargs), self._loop)
        return future.result(timeout=30)

    @staticmethod
    async def _async(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)

    @property
    def store(self) -> Any:
        return self.sim.store

    @property
    def received(self) -> list[ReceivedRequest]:
        """A snapshot of every request received so far (copied on the server's loop)."""
        return self._call(list, self.sim.received)

    def intercept(
        self, hook: Callable[[web.Request], Awaitable[web.StreamResponse | None]]
    ) -> Callable[[], None]:
        """Run `hook` before kubesim handles each request; it may sleep or return a response.

        Returns a function that removes the hook. Example: a hub that fails TokenReviews::

            async def fail(request):
                if request.path.endswith("/tokenreviews"):
                    return web.Response(status=500, text="boom")
            undo = sim.intercept(fail)
        """
        self._call(self.sim.interceptors.append, hook)
        return lambda: self._call(self.sim.interceptors.remove, hook)

    def requests_to(self, path_prefix: str) -> list[ReceivedRequest]:
        return [r for r in self.received if r.path.startswith(path_prefix)]

    @property
    def watcher_count(self) -> int:
        """Open watch requests (to check that a client's cancellation reached the server)."""
        return self.sim.store.watcher_count

    def mint_token(
        self,
        namespace: str,
        name: str,
        audiences: Iterable[str] | None = None,
        expiration_seconds: int = 3600,
    ) -> str:
        """A service-account token (the ServiceAccount is created if missing)."""
        return self._call(
            self.sim.mint_token,
            namespace,
            name,
            list(audiences) if audiences else None,
            expiration_seconds,
        )

    def apply(self, obj: Any) -> list[dict[str, Any]]:
        """Create or replace objects (dict, list, YAML text or file), bypassing RBAC."""
        return [self._call(self.sim.apply, o) for o in load_yaml_objects(obj)]

    def get(
        self, api_version: str, plural: str, name: str, namespace: str = ""
    ) -> dict[str, Any] | None:
        rtype = self.sim.type_for(api_version, plural)
        return self._call(
            self.sim.store.get, rtype.key, namespace if rtype.namespaced else "", name
        )

    def add_user(self, token: str, name: str, groups: Sequence[str] = (), uid: str = "") -> None:
        self.sim.authn.add_static([StaticUser(token, name, uid, tuple(groups))])

    def grant(
        self,
        subject: str,
        verbs: Sequence[str],
        resources: Sequence[str] = (),
        api_groups: Sequence[str] = ("",),
        namespace: str | None = None,
        resource_names: Sequence[str] = (),
        non_resource_urls: Sequence[str] = (),
        name: str | None = None,
    ) -> str:
        """Bind a new (Cluster)Role with one rule to `User:x`, `Group:x`, `ServiceAccount:ns:name`.

        With `namespace`, a Role + RoleBinding in that namespace; otherwise cluster-wide.
        Returns the role's name.
        """
        kind, _, rest = subject.partition(":")
        if kind == "ServiceAccount":
            sa_ns, _, sa_name = rest.partition(":")
            subj = {"kind": "ServiceAccount", "name": sa_name, "namespace": sa_ns}
        else:
            subj = {"kind": kind, "name": rest, "apiGroup": "rbac.authorization.k8s.io"}
        name = name or f"kubesim-grant-{secrets.token_hex(4)}"
        rule: dict[str, Any] = {"verbs": list(verbs)}
        if non_resource_urls:
            rule["nonResourceURLs"] = list(non_resource_urls)
        else:
            rule["apiGroups"] = list(api_groups)
            rule["resources"] = list(resources)
        if resource_names:
            rule["resourceNames"] = list(resource_names)
        rbac = "rbac.authorization.k8s.io/v1"
        meta: dict[str, Any] = {"name": name}
        if namespace:
            meta["namespace"] = namespace
        role_kind = "Role" if namespace else "ClusterRole"
        self.apply(
            [
                {"apiVersion": rbac, "kind": role_kind, "metadata": dict(meta), "rules": [rule]},
                {
                    "apiVersion": rbac,
                    "kind": f"{role_kind}Binding",
                    "metadata": dict(meta),
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": role_kind,
                        "name": name,
                    },
                    "subjects": [subj],
                },
            ]
        )
        return name

    def kubeconfig(
        self,
        token: str | None = None,
        *,
        context: str = "kubesim",
        namespace: str | None = None,
        server: str | None = None,
    ) -> dict[str, Any]:
        ctx: dict[str, Any] = {"cluster": context, "user": context}
        if namespace:
            ctx["namespace"] = namespace
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": context,
            "clusters": [
                {
                    "name": context,
                    "cluster": {
                        "server": server or self.url,
                        "certificate-authority": self.ca_file,
                    },
                }
            ],
            "users": [{"name": context, "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": context, "context": ctx}],
        }

    def write_kubeconfig(
        self,
        path: str | os.PathLike[str],
        token: str | None = None,
        *,
        context: str = "kubesim",
        namespace: str | None = None,
    ) -> Path:
        """Write a kubeconfig for this server (admin token unless `token`); returns the path."""
        p = Path(path)
        p.write_text(yaml.safe_dump(self.kubeconfig(token, context=context, namespace=namespace)))
        os.chmod(p, 0o600)
        return p

    async def kubectl(
        self,
        *args: str,
        token: str | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        stdin: bytes | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, str, str]:
        """Run the real kubectl against this server; returns (exit code, stdout, stderr)."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            kc = kubeconfig or self.write_kubeconfig(Path(tmp) / "kubeconfig", token)
            env = {**os.environ, "KUBECONFIG": str(kc), "HOME": tmp}
            proc = await asyncio.create_subprocess_exec(
                KUBECTL,
                *args,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise
            return proc.returncode or 0, out.decode(), err.decode()

    def api_client(self, token: str | None = None) -> Any:
        """A kubernetes_asyncio ApiClient for this server (close it: `async with` or `.close()`)."""
        from kubernetes_asyncio import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = self.ca_file
        cfg.api_key = {"BearerToken": token or self.admin_token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return client.ApiClient(cfg)


def _config(
    name: str,
    users: Iterable[UserSpec] | Mapping[str, str],
    rbac: Any,
    crds: Any,
    api_audiences: Sequence[str] | None,
    bookmark_interval: float,
    admin_token: str,
) -> Config:
    static = [
        StaticUser(admin_token, ADMIN_USER, "kubesim-admin-uid", ("system:masters",)),
        *_users(users),
    ]
    config = Config(name=name, static_users=static, bookmark_interval=bookmark_interval)
    if rbac is not None:
        config.rbac = load_yaml_objects(rbac)
    config.crds = load_yaml_objects(list(crds)) if crds else []
    if api_audiences:
        config.api_audiences = tuple(api_audiences)
    return config


@contextlib.asynccontextmanager
async def run_kubesim(
    tmp_path: str | os.PathLike[str],
    *,
    name: str = "kubesim",
    users: Iterable[UserSpec] | Mapping[str, str] = (),
    rbac: Any = None,
    crds: Any = (),
    api_audiences: Sequence[str] | None = None,
    bookmark_interval: float = 5.0,
    port: int = 0,
    client_ca_file: str | None = None,
) -> AsyncIterator[RunningKubeSim]:
    """Start kubesim on 127.0.0.1 with TLS from a CA generated under `tmp_path/<name>-tls`.

    users: `(token, user[, uid[, groups]])` tuples, StaticUser, or {token: user}.
    rbac: RBAC objects (dicts, YAML text or a file path), applied at start.
    crds: CustomResourceDefinitions (dicts or YAML file paths), registered at start.
    client_ca_file: accept x509 client certificates from this CA (CN = user, O = groups).
    """
    admin_token = f"kubesim-admin-{secrets.token_urlsafe(16)}"
    sim = KubeSim(_config(name, users, rbac, crds, api_audiences, bookmark_interval, admin_token))
    files = ensure_serving_cert(Path(tmp_path) / f"{name}-tls")
    ctx = server_context(files.cert_file, files.key_file, client_ca_file)
    runner = await start(sim, "127.0.0.1", port, ctx)
    host, bound_port = sim.server_address.rsplit(":", 1)
    try:
        yield RunningKubeSim(
            sim, host, int(bound_port), files.ca_file, admin_token, asyncio.get_running_loop()
        )
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def run_kubesim_in_thread(
    tmp_path: str | os.PathLike[str], **kwargs: Any
) -> Iterator[RunningKubeSim]:
    """`run_kubesim` on its own event loop in a daemon thread, for synchronous tests."""
    loop = asyncio.new_event_loop()
    ready: list[RunningKubeSim] = []
    failed: list[BaseException] = []
    started = threading.Event()
    stop: asyncio.Event | None = None

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        try:
            async with run_kubesim(tmp_path, **kwargs) as sim:
                ready.append(sim)
                started.set()
                await stop.wait()
        except BaseException as exc:
            failed.append(exc)
            started.set()

    thread = threading.Thread(
        target=loop.run_until_complete, args=(main(),), daemon=True, name="kubesim"
    )
    thread.start()
    if not started.wait(30):
        raise TimeoutError("kubesim did not start within 30 s")
    if failed:
        raise failed[0]
    try:
        yield ready[0]
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
