"""Run a local demo: a hub, two managed clusters, the gateway and one agent per cluster.

    hubproxy demo [--dir DIR] [--listen 127.0.0.1:9092]

Everything runs on this machine, bound to 127.0.0.1 by default: three kubesim processes (the
hub and the managed clusters ``cluster1`` and ``cluster2``; kubesim is a kube-apiserver
stand-in, not a production component), ``hubproxy gateway`` and two ``hubproxy agent``s. The
demo creates certificates, a service account ``demo/demo`` on the hub allowed to use the proxy,
the gateway's own hub credential (TokenReview + SubjectAccessReview), an agent credential on
each managed cluster that may impersonate, RBAC there for
``cluster:hub:system:serviceaccount:demo:demo``, and a sample pod ``demo``. It writes
``DIR/kubeconfig`` (contexts ``cluster1``/``cluster2`` through the gateway), ``DIR/token`` and
``DIR/ca.crt``, prints commands to paste and the gateway's health URL (``/metrics``,
``/clusters``), then ``hubproxy demo ready``. The sample pod's port 8080 answers HTTP through
``kubectl port-forward`` (a small server in this process stands in for the pod's web server).

When an agent exits (``kill`` it to see), the demo says ``<cluster> disconnected``, shows the
503 Status a caller now gets, and starts the agent again after ``--agent-restart-delay``. Any
other process exiting ends the demo. Ctrl-C or SIGTERM stops exactly the processes it started;
their logs are in ``DIR/logs/``. A directory the demo created (the default temporary one, or a
``--dir`` that did not exist) is removed when it stops, unless ``--keep`` or it failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.fixtures import (
    AGENT_USER,
    DEMO_NAMESPACE,
    DEMO_SA,
    GATEWAY_USER,
    LOOPBACK,
    POD_HTTP_PORT,
    agent_args,
    agent_kubeconfig,
    api,
    gateway_args,
    hub_rbac,
    hubproxy_command,
    managed_rbac,
    request,
    sample_pod,
    token_csv,
    write_private,
)

CLUSTERS = ("cluster1", "cluster2")
# The upstream ClusterProfile CRD: where KUBESIM_CLUSTERPROFILE_CRD says, else shared/crds next
# to the checkout (as the tests find it). Without it the demo leaves ClusterProfiles out.
CLUSTERPROFILE_CRD_ENV = "KUBESIM_CLUSTERPROFILE_CRD"
CLUSTERPROFILE_CRD_NAME = "multicluster.x-k8s.io_clusterprofiles.yaml"
ADMIN_USER = "demo-admin"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="DIR",
                        help="where certificates, kubeconfig, token and logs go "
                             "(default: a new temporary folder)")
    parser.add_argument("--listen", default=f"{LOOPBACK}:9092", metavar="HOST:PORT",
                        help="the gateway's front door")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="give up if the system is not ready within this time")
    parser.add_argument("--keep", action="store_true",
                        help="keep the demo's directory (keys, token, logs) on exit; by default "
                        "a directory the demo created is removed when it stops")
    parser.add_argument("--agent-restart-delay", type=float, default=5.0, metavar="SECONDS",
                        help="when an agent exits, show what callers see, then start it again "
                        "after this long (default: %(default)s)")


def static_plugin(environ: Mapping[str, str]) -> Path | None:
    """The static hubproxy-creds that deploy/plugin/build.sh leaves in its cache
    ($HUBPROXY_PLUGIN_CACHE, default ~/.cache/hubproxy-plugin), if it was built."""
    cache = environ.get("HUBPROXY_PLUGIN_CACHE") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hubproxy-plugin")
    path = Path(cache) / "hubproxy-plugin"
    return path if os.access(path, os.X_OK) else None


def creds_command(plugin: Path | None, token_file: Path) -> dict[str, Any]:
    """The exec plugin of the demo's providers file: the static build when there is one,
    else this Python's hubproxy-creds."""
    prefix = [str(plugin)] if plugin else [sys.executable, "-m", "gateway.access.creds"]
    return {"command": prefix[0], "args": [*prefix[1:], "--token-file", str(token_file)]}


# Written to DIR/consumer.py: what a ClusterProfile consumer does, in Python.
CONSUMER_EXAMPLE = '''"""A ClusterProfile consumer, as MultiKueue or Argo CD are: read the
profile on the hub, take the endpoint the gateway published, get a credential from the exec
plugin, list pods."""
import asyncio
import sys

from kubernetes_asyncio import client, config

from gateway.access.clusterprofile import build_configuration, load_providers


async def main(cluster: str) -> None:
    hub = client.Configuration()
    await config.load_kube_config(config_file="{hub_kubeconfig}",
                                  client_configuration=hub)
    async with client.ApiClient(hub) as api:
        profile = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "multicluster.x-k8s.io", "v1alpha1", "{namespace}", "clusterprofiles", cluster)
    configuration = await build_configuration(profile, load_providers("{providers}"))
    async with client.ApiClient(configuration) as api:
        pods = await client.CoreV1Api(api).list_namespaced_pod("default")
    print(cluster, configuration.host, [pod.metadata.name for pod in pods.items])


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "cluster1"))
'''


def clusterprofile_crd() -> Path | None:
    """The ClusterProfile CRD file to install in the demo hub, or None when there is none."""
    configured = os.environ.get(CLUSTERPROFILE_CRD_ENV)
    candidate = (Path(configured) if configured else
                 Path(__file__).resolve().parents[2] / "shared" / "crds" / CLUSTERPROFILE_CRD_NAME)
    return candidate if candidate.is_file() else None


def cluster_profile(cluster: str, namespace: str = DEMO_NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
            "metadata": {"name": cluster, "namespace": namespace},
            "spec": {"displayName": cluster, "clusterManager": {"name": "hubproxy-demo"}}}


async def start_pod_http_server(cluster: str) -> tuple[Any, int]:
    """A tiny HTTP server standing in for the sample pod's web server in ``cluster``."""
    from aiohttp import web

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello from pod demo in {cluster} (path {request.path})\n")

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    return runner, port


def free_port(host: str = LOOPBACK) -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def wait_for_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:g}s") from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


# ----------------------------------------------------------------------- processes ---------
@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    log: Path
    args: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return self.process.returncode is None


@dataclass
class Demo:
    """The running demo; ``start()`` brings it up, ``stop()`` stops exactly its children."""

    root: Path
    listen: str = f"{LOOPBACK}:9092"
    start_timeout: float = 60.0
    children: list[Child] = field(default_factory=list)
    sims: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # name -> url, ca, admin
    token: str = ""
    health_url: str = ""  # the gateway's health port: /metrics, /clusters
    pod_servers: list[Any] = field(default_factory=list)  # aiohttp runners of the pods' HTTP
    clusterprofile_crd: Path | None = field(default_factory=clusterprofile_crd)

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def front_url(self) -> str:
        return f"https://{self.listen}"

    async def spawn(self, name: str, args: list[str]) -> Child:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with open(log, "ab") as fh:
            process = await asyncio.create_subprocess_exec(
                *args, stdout=fh, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops them in order
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        child = Child(name, process, log, list(args))
        self.children.append(child)
        # Who we started, so an operator (or a test) can see exactly which PIDs are ours.
        with open(self.root / "pids", "a") as fh:
            fh.write(f"{name} {process.pid}\n")
        return child

    def exited_agents(self) -> list[Child]:
        """Agents that exited: the demo reports them and starts them again."""
        return [c for c in self.children if c.name.startswith("agent-") and not c.alive()]

    async def restart(self, child: Child) -> Child:
        self.children.remove(child)
        return await self.spawn(child.name, child.args)

    def check_children(self, *, agents_may_exit: bool = False) -> None:
        for child in self.children:
            if agents_may_exit and child.name.startswith("agent-"):
                continue
            if not child.alive():
                tail = child.log.read_text(errors="replace")[-2000:] if child.log.exists() else ""
                raise RuntimeError(
                    f"{child.name} exited with code {child.process.returncode}; "
                    f"log {child.log}:\n{tail}"
                )

    async def start(self) -> None:
        from certs import layout

        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "pids").write_text("")
        layout.init(self.pki, layout.InitOptions(clusters=list(CLUSTERS), force=True))
        host = self.listen.rpartition(":")[0].strip("[]") or LOOPBACK
        bind = LOOPBACK if host in ("0.0.0.0", "::") else host

        admin = secrets.token_urlsafe(24)
        gateway_token = secrets.token_urlsafe(24)
        agent_tokens = {c: secrets.token_urlsafe(24) for c in CLUSTERS}

        # The hub and the managed clusters.
        await self._start_sim("hub", admin, [(gateway_token, GATEWAY_USER, "gw-uid", [])],
                              hub_rbac(), crd=self.clusterprofile_crd)
        for cluster in CLUSTERS:
            await self._start_sim(cluster, admin,
                                  [(agent_tokens[cluster], AGENT_USER, "agent-uid", [])],
                                  managed_rbac())
        for name in self.sims:
            url, _, _ = self.sims[name]
            port = int(url.rsplit(":", 1)[1])
            await self._wait_port(name, LOOPBACK, port)

        # Hub: the demo service account and its token; managed: a sample pod.
        hub_url, hub_ca, _ = self.sims["hub"]
        await api(hub_url, hub_ca, admin, "POST", "/api/v1/namespaces",
                  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NAMESPACE}})
        await api(hub_url, hub_ca, admin, "POST",
                  f"/api/v1/namespaces/{DEMO_NAMESPACE}/serviceaccounts",
                  {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": DEMO_SA, "namespace": DEMO_NAMESPACE}})
        review = await api(
            hub_url, hub_ca, admin, "POST",
            f"/api/v1/namespaces/{DEMO_NAMESPACE}/serviceaccounts/{DEMO_SA}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": 86400}},
        )
        self.token = review["status"]["token"]
        if self.clusterprofile_crd is not None:
            for cluster in CLUSTERS:
                await api(hub_url, hub_ca, admin, "POST",
                          f"/apis/multicluster.x-k8s.io/v1alpha1/namespaces/{DEMO_NAMESPACE}"
                          "/clusterprofiles", cluster_profile(cluster))
            write_private(self.root / "hub.kubeconfig", yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "hub",
                "clusters": [{"name": "hub", "cluster": {"server": hub_url,
                                                         "certificate-authority": hub_ca}}],
                "users": [{"name": "admin", "user": {"token": admin}}],
                "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "admin"}}],
            }))
        for cluster in CLUSTERS:
            url, ca, _ = self.sims[cluster]
            runner, http_port = await start_pod_http_server(cluster)
            self.pod_servers.append(runner)
            await api(url, ca, admin, "POST", "/api/v1/namespaces/default/pods",
                      sample_pod(http_server=http_port))

        # Gateway and agents.
        hub_kc = write_private(self.root / "hub-gateway.kubeconfig", yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "hub",
            "clusters": [{"name": "hub", "cluster": {"server": hub_url,
                                                     "certificate-authority": hub_ca}}],
            "users": [{"name": "gateway", "user": {"token": gateway_token}}],
            "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "gateway"}}],
        }))
        tunnel_port, health_port = free_port(bind), free_port(bind)
        self.health_url = f"http://{bind}:{health_port}"
        writer = ([] if self.clusterprofile_crd is None else
                  ["--clusterprofiles", "on", "--public-url", self.front_url,
                   "--clusterprofile-namespace", DEMO_NAMESPACE])
        await self.spawn("gateway", hubproxy_command() + gateway_args(
            self.pki, listen=self.listen, tunnel_listen=f"{bind}:{tunnel_port}",
            health_listen=f"{bind}:{health_port}", hub_kubeconfig=hub_kc) + writer)
        await self._wait_port("gateway", bind, int(self.listen.rpartition(":")[2]))
        await self._wait_port("gateway", bind, tunnel_port)
        for cluster in CLUSTERS:
            url, ca, _ = self.sims[cluster]
            token_file = write_private(self.root / "agents" / cluster / "token",
                                       agent_tokens[cluster])
            kc = write_private(self.root / "agents" / cluster / "kubeconfig",
                               yaml.safe_dump(agent_kubeconfig(url, ca, str(token_file))))
            await self.spawn(f"agent-{cluster}", hubproxy_command() + agent_args(
                self.pki, cluster, hub=f"{bind}:{tunnel_port}", kubeconfig=kc,
                health_listen=f"{bind}:{free_port(bind)}"))

        self.write_client_files()
        for cluster in CLUSTERS:
            await self._wait_cluster(cluster)
        if self.clusterprofile_crd is not None:
            await self._wait_profiles(admin)

    async def _wait_profiles(self, admin: str) -> None:
        """Until the gateway has published its access provider on every ClusterProfile."""
        hub_url, hub_ca, _ = self.sims["hub"]
        deadline = time.monotonic() + self.start_timeout
        for cluster in CLUSTERS:
            path = (f"/apis/multicluster.x-k8s.io/v1alpha1/namespaces/{DEMO_NAMESPACE}"
                    f"/clusterprofiles/{cluster}")
            while True:
                self.check_children()
                profile = await api(hub_url, hub_ca, admin, "GET", path)
                providers = (profile.get("status") or {}).get("accessProviders") or []
                if any(p.get("name") == "hubproxy" for p in providers):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ClusterProfile {cluster} never got our access provider")
                await asyncio.sleep(0.2)

    async def _start_sim(self, name: str, admin: str, users: list[tuple[str, str, str, list[str]]],
                         rbac: list[dict[str, Any]], crd: Path | None = None) -> None:
        directory = self.root / "sims" / name
        tokens = write_private(directory / "tokens.csv", token_csv(
            [(admin, ADMIN_USER, "admin-uid", ["system:masters"]), *users]))
        rbac_file = write_private(directory / "rbac.yaml", yaml.safe_dump_all(rbac))
        port = free_port()
        await self.spawn(f"kubesim-{name}", [
            sys.executable, "-m", "kubesim", "--listen", f"{LOOPBACK}:{port}",
            "--cert-dir", str(directory / "tls"), "--token-auth-file", str(tokens),
            "--rbac-file", str(rbac_file), "--name", name,
            *(["--crd", str(crd)] if crd is not None else []),
        ])
        self.sims[name] = (f"https://{LOOPBACK}:{port}", str(directory / "tls" / "ca.crt"), admin)

    async def _wait_port(self, name: str, host: str, port: int) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            self.check_children()
            try:
                await wait_for_port(host, port, 0.2)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} is not listening on {host}:{port}") from None

    async def _wait_cluster(self, cluster: str) -> None:
        """Until a request through the gateway reaches the managed cluster."""
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            self.check_children()
            try:
                status, body = await request(self.front_url, str(self.root / "ca.crt"),
                                             self.token, "GET", f"/{cluster}/version")
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                last = type(exc).__name__
            else:
                if status == 200:
                    return
                last = f"HTTP {status}: {body[:200]!r}"
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{cluster} not reachable through the gateway: {last}")

    def write_client_files(self) -> None:
        from gateway.access.kubeconfig import build_kubeconfig

        ca_pem = (self.pki / "front-ca" / "ca.crt").read_bytes()
        (self.root / "ca.crt").write_bytes(ca_pem)
        write_private(self.root / "token", self.token)
        config = build_kubeconfig(self.front_url, ca_pem, list(CLUSTERS), token=self.token)
        write_private(self.root / "kubeconfig", yaml.safe_dump(config, sort_keys=False))
        if self.clusterprofile_crd is not None:
            # What MultiKueue or Argo CD configure: the provider name and its exec plugin.
            write_private(self.root / "providers.json", json.dumps({"providers": [{
                "name": "hubproxy", "execConfig": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    **creds_command(static_plugin(os.environ), self.root / "token"),
                    "provideClusterInfo": True, "interactiveMode": "Never"}}]}, indent=2))
            write_private(self.root / "consumer.py", CONSUMER_EXAMPLE.format(
                hub_kubeconfig=self.root / "hub.kubeconfig",
                providers=self.root / "providers.json", namespace=DEMO_NAMESPACE))

    def instructions(self) -> str:
        d = self.root
        kc = d / "kubeconfig"
        return "\n".join([
            f"hub, cluster1 and cluster2 (kubesim), gateway {self.front_url}, 2 agents; "
            f"logs in {d / 'logs'}",
            "",
            f"  export KUBECONFIG={kc}",
            "  kubectl --context cluster1 get pods",
            "  kubectl --context cluster2 auth whoami",
            "  kubectl --context cluster1 auth can-i create pods",
            "  kubectl --context cluster1 logs -f demo",
            "  kubectl --context cluster1 exec demo -- echo hello from cluster1",
            "  kubectl --context cluster2 get configmaps -w",
            f"  kubectl --context cluster1 port-forward pod/demo 18080:{POD_HTTP_PORT} &  "
            "curl http://127.0.0.1:18080/",
            "",
            f"  curl --cacert {d / 'ca.crt'} -H \"Authorization: Bearer $(cat {d / 'token'})\" \\",
            f"    {self.front_url}/cluster1/api/v1/namespaces/default/pods",
            "",
            *self._clusterprofile_instructions(),
            "the gateway's health port (unauthenticated; loopback here):",
            f"  curl {self.health_url}/metrics",
            f"  hubproxy clusters --url {self.health_url}",
            "",
            "see a failure: stop one agent; the demo shows what callers get, then restarts it:",
            f"  kill $(awk '/^agent-cluster2 /{{print $2}}' {d / 'pids'} | tail -1)",
            "",
        ])

    def _clusterprofile_instructions(self) -> list[str]:
        d = self.root
        if self.clusterprofile_crd is None:
            return ["(ClusterProfiles left out: no CRD; set "
                    f"{CLUSTERPROFILE_CRD_ENV} to multicluster.x-k8s.io's CRD file)", ""]
        return [
            "ClusterProfiles on the hub carry the gateway's access provider:",
            f"  kubectl --kubeconfig {d / 'hub.kubeconfig'} -n {DEMO_NAMESPACE} get "
            "clusterprofiles cluster1 -o jsonpath='{.status.accessProviders}'",
            f"a consumer (MultiKueue, Argo CD...) with the exec plugin in {d / 'providers.json'}:",
            *("  " + line for line in (d / "providers.json").read_text().splitlines()),
            f"  python3 {d / 'consumer.py'} cluster2",
            "",
        ]

    async def report_exit(self, child: Child) -> None:
        """Say which cluster went, and show what a caller gets now (a 503 Status)."""
        cluster = child.name.removeprefix("agent-")
        print(f"hubproxy demo: {cluster} disconnected (its agent exited with code "
              f"{child.process.returncode})", flush=True)
        try:
            status, body = await request(self.front_url, str(self.root / "ca.crt"), self.token,
                                         "GET", f"/{cluster}/version")
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            print(f"hubproxy demo: GET /{cluster}/version failed: {type(exc).__name__}",
                  flush=True)
            return
        try:
            message = json.loads(body).get("message", "")
        except ValueError:
            message = body[:200].decode(errors="replace")
        print(f"hubproxy demo: GET /{cluster}/version now answers {status}: {message}",
              flush=True)

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM each child we started (agents first, kubesim last), SIGKILL stragglers."""
        for child in reversed(self.children):
            if child.alive():
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            try:
                await asyncio.wait_for(child.process.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                await child.process.wait()
        for runner in self.pod_servers:
            await runner.cleanup()


# ----------------------------------------------------------------------- command ----------
def check_listen(listen: str) -> None:
    """The demo's fixed port (the front door) is free: checked before anything is built, so a
    second demo fails at once with one line instead of after starting five processes."""
    from gateway.ops import startup
    from gateway.ops.flags import parse_address

    try:
        host, port = parse_address(listen, default_host=LOOPBACK)
    except ValueError as exc:
        raise startup.StartupError(f"--listen {exc}") from None
    startup.check_port_free(host, port, "--listen")  # as the gateway will bind it


async def serve(args: argparse.Namespace) -> int:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hubproxy-demo-"))
    # Only a directory the demo made is removed on exit: never one the user had already.
    created = not args.dir or not root.exists()
    demo = Demo(root.resolve(), listen=args.listen, start_timeout=args.start_timeout)
    rc = 1
    try:
        rc = await _serve(demo, args)
        return rc
    finally:
        # Keys and a token live there: gone with the demo, unless asked to keep them or the
        # demo failed (its logs say why).
        if created and not args.keep and rc in (0, 130):
            shutil.rmtree(demo.root, ignore_errors=True)
            print(f"hubproxy demo: removed {demo.root} (--keep keeps it)", flush=True)
        else:
            print(f"hubproxy demo: kept {demo.root}", flush=True)


async def _serve(demo: Demo, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print(f"hubproxy demo: starting in {demo.root}", flush=True)
    start = loop.create_task(demo.start())
    stopper = loop.create_task(stop.wait())
    try:
        await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():
            start.cancel()
            with contextlib.suppress(BaseException):
                await start
            print("hubproxy demo: interrupted while starting", flush=True)
            return 130
        try:
            start.result()
        except Exception as exc:
            print(f"hubproxy demo: failed to start: {exc}", file=sys.stderr, flush=True)
            return 1
        print(demo.instructions(), flush=True)
        print("hubproxy demo ready", flush=True)
        restart_at: dict[str, float] = {}
        while not stop.is_set():
            try:
                demo.check_children(agents_may_exit=True)
            except RuntimeError as exc:
                print(f"hubproxy demo: {exc}", file=sys.stderr, flush=True)
                return 1
            for child in demo.exited_agents():
                if child.name not in restart_at:
                    await demo.report_exit(child)
                    restart_at[child.name] = time.monotonic() + args.agent_restart_delay
                    print(f"hubproxy demo: starting {child.name} again in "
                          f"{args.agent_restart_delay:g}s", flush=True)
                elif time.monotonic() >= restart_at[child.name]:
                    del restart_at[child.name]
                    cluster = child.name.removeprefix("agent-")
                    await demo.restart(child)
                    try:
                        await demo._wait_cluster(cluster)
                    except (TimeoutError, RuntimeError) as exc:
                        print(f"hubproxy demo: {cluster} did not come back: {exc}",
                              file=sys.stderr, flush=True)
                        return 1
                    print(f"hubproxy demo: {cluster} connected again", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        return 0
    finally:
        stopper.cancel()
        print("hubproxy demo: stopping", flush=True)
        await demo.stop()
        print("hubproxy demo: stopped", flush=True)


def run(args: argparse.Namespace) -> int:
    from gateway.ops import startup

    try:
        check_listen(args.listen)
    except startup.StartupError as exc:
        print(f"hubproxy demo: {exc}", file=sys.stderr, flush=True)
        return startup.EXIT_CODE
    return asyncio.run(serve(args))
