"""``python -m bench.fleethub``: the hub side of a fleet at 10,000 clusters, without agents.

What issue 22 asks of the gateway's own O(N) work, measured in one process with stand-in tunnel
sessions registered in a real :class:`tunnel.registry.SessionRegistry` (as the tests do), so
the figures are the gateway's, not the agents':

* ``scrape``: ``/metrics`` and ``/clusters`` of a gateway whose N clusters all had traffic (short
  requests with several codes and a watch each): size, time to answer, and the event loop's
  longest stall while answering (a 1 ms ticker on the gateway's loop), plus the series one
  cluster adds to ``/metrics``. ``/clusters`` is read as the gateway answers it by default and
  whole (following ``continue`` when it paginates).
* ``link``: what one ``--workers`` worker spends each second to send worker 0 its snapshot
  (``gateway.ops.metricslink``) with N clusters, idle and with traffic on 1% of them, and
  whether it fits the datagram.
* ``storm``: the hub writers (ClusterProfile access provider and OCM ``TunnelConnected``) against
  kubesim in its own process with N ClusterProfiles and N ManagedClusterAddOns: writes sent and
  the time until every object is right, first as the fleet forms, then after a restart of the
  gateway (new writers and registry; the clusters come back over ``--spread`` seconds).

Prints one table and, with ``--json FILE``, writes the figures. Bounded: every phase has a
deadline (``--deadline``), after which it reports what it saw.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO.parent / "shared" / "crds"
PROFILE_CRD = CRDS / "multicluster.x-k8s.io_clusterprofiles.yaml"
ADDON_CRD = CRDS / "ocm" / "0000_01_addon.open-cluster-management.io_managedclusteraddons.crd.yaml"


def cluster_name(i: int) -> str:
    return f"cluster-{i:05d}"


def _certificate_der() -> bytes:
    import trustme
    from cryptography import x509

    ca = trustme.CA()
    cert = ca.issue_cert("agent.example")
    pem = cert.cert_chain_pems[0].bytes()
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


class _SslObject:
    def __init__(self, der: bytes) -> None:
        self.der = der

    def getpeercert(self, binary_form: bool = False) -> bytes:
        return self.der


class StandInSession:
    """What the gateway reads of a tunnel session (``tunnel.connection.TunnelSession``)."""

    def __init__(self, index: int, der: bytes) -> None:
        self.closed = False
        self.draining = False
        self.close_reason = ""
        self.rtt: float | None = 0.0008 + (index % 97) * 1e-5
        self.active_streams = index % 3
        self.streams_opened = 10 + index % 50
        self.bytes_received = 100_000 + index
        self.bytes_sent = 50_000 + index
        self.agent_version = (0 << 24) | (1 << 16) | 0
        self.agent_instance = secrets.randbits(32) or 1
        self._ssl = _SslObject(der)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._ssl if name == "ssl_object" else default

    def open_stream(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a stand-in session carries no streams")


class StallMeter:
    """The event loop's longest gap between two 1 ms ticks, per window."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._tick())

    def reset(self) -> None:
        self.longest = 0.0

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# --- scrape ---------------------------------------------------------------------------------


def _traffic(metrics: Any, clusters: list[str]) -> None:
    """Every cluster: three 200s, a 404, a 503 (short) and a watch, as random GETs leave it."""
    for i, name in enumerate(clusters):
        for code, duration in ((200, 0.004), (200, 0.012), (200, 0.03), (404, 0.002),
                               (503, 0.001)):
            metrics.request(name, code, 120, 900 + i % 100, duration, "short")
        metrics.request(name, 200, 0, 4000, 95.0, "watch")


def _get(url: str, timeout: float = 120.0) -> tuple[bytes, float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
        status = response.status
    return body, time.perf_counter() - started, status


async def _timed_get(stall: StallMeter, url: str) -> tuple[bytes, float, float]:
    stall.reset()
    body, seconds, _ = await asyncio.to_thread(_get, url)
    return body, seconds, stall.longest


async def _all_pages(stall: StallMeter, base: str) -> tuple[int, float, float, int, int]:
    """Every cluster of /clusters, following ``continue`` if the gateway paginates."""
    stall.reset()
    started = time.perf_counter()
    size = pages = 0
    names: list[str] = []
    token = ""
    while True:
        url = f"{base}/clusters?limit=500" + (f"&continue={token}" if token else "")
        body, _, _ = await asyncio.to_thread(_get, url)
        size += len(body)
        pages += 1
        document = json.loads(body)
        names += [c["name"] for c in document.get("clusters", ())]
        token = (document.get("metadata") or {}).get("continue") or ""
        if not token:
            break
    return size, time.perf_counter() - started, stall.longest, pages, len(names)


async def measure_scrape(n: int, repeats: int) -> dict[str, Any]:
    from gateway.hub.app import Gateway
    from gateway.hub.config import GatewayConfig
    from tunnel.registry import SessionRegistry

    class _NoAuth:
        async def authenticate(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("not used")

    class _NoAuthz:
        async def authorize(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("not used")

    import logging

    logging.getLogger("hubproxy").setLevel(logging.WARNING)
    logging.getLogger("hubproxy.tunnel").setLevel(logging.WARNING)
    registry = SessionRegistry()
    config = GatewayConfig(listen=("127.0.0.1", 0), tunnel_listen=("127.0.0.1", 0),
                           health_listen=("127.0.0.1", 0), revalidate_streams=False)
    gateway = Gateway(config, authenticator=_NoAuth(), authorizer=_NoAuthz(),  # type: ignore
                      registry=registry, front_ssl=None)
    der = _certificate_der()
    clusters = [cluster_name(i) for i in range(n)]
    started = time.perf_counter()
    for i, name in enumerate(clusters):
        registry.add(name, StandInSession(i, der))
    register_seconds = time.perf_counter() - started
    _traffic(gateway.metrics, clusters)
    await gateway.start()
    stall = StallMeter()
    stall.start()
    base = f"http://127.0.0.1:{gateway.health_port}"
    out: dict[str, Any] = {"clusters": n, "register_seconds": round(register_seconds, 3)}
    try:
        metrics_runs, clusters_runs, pages_runs = [], [], []
        for _ in range(repeats):
            body, seconds, longest = await _timed_get(stall, f"{base}/metrics")
            metrics_runs.append((len(body), seconds, longest))
            text = body.decode()
            await asyncio.sleep(0.2)
            cbody, cseconds, clongest = await _timed_get(stall, f"{base}/clusters")
            clusters_runs.append((len(cbody), cseconds, clongest))
            await asyncio.sleep(0.2)
            pages_runs.append(await _all_pages(stall, base))
            await asyncio.sleep(0.2)
        probe = cluster_name(n // 2)
        series = [line for line in text.splitlines()
                  if line and not line.startswith("#") and f'"{probe}"' in line]
        families = sorted({line.split("{", 1)[0] for line in series})
        out["series_per_cluster"] = len(series)
        out["families_per_cluster"] = families
        out["metrics_lines"] = sum(1 for line in text.splitlines() if not line.startswith("#"))
        for key, runs in (("metrics", metrics_runs), ("clusters", clusters_runs)):
            out[f"{key}_bytes"] = runs[-1][0]
            out[f"{key}_seconds"] = round(statistics.median(r[1] for r in runs), 3)
            out[f"{key}_stall_seconds"] = round(max(r[2] for r in runs), 3)
        out["clusters_all_bytes"] = pages_runs[-1][0]
        out["clusters_all_seconds"] = round(statistics.median(r[1] for r in pages_runs), 3)
        out["clusters_all_stall_seconds"] = round(max(r[2] for r in pages_runs), 3)
        out["clusters_all_pages"] = pages_runs[-1][3]
        out["clusters_all_names"] = pages_runs[-1][4]
    finally:
        await stall.stop()
        await gateway.close()
    return out


# --- link -----------------------------------------------------------------------------------


async def measure_link(n: int, seconds: float) -> dict[str, Any]:
    """One worker's snapshot sender at N clusters: CPU per second, bytes, datagrams."""
    import logging
    import socket

    from gateway.hub.fleet import FleetView
    from gateway.ops.metrics import GatewayMetrics
    from gateway.ops.metricslink import PeerSnapshots, SnapshotSender
    from tunnel.registry import SessionRegistry

    logging.getLogger("hubproxy").setLevel(logging.ERROR)
    registry = SessionRegistry()
    view = FleetView(registry, worker=1)
    metrics = GatewayMetrics()
    if hasattr(metrics, "part"):  # since issue 22: a worker sends what changed
        from gateway.hub.fleet import tunnel_stats

        metrics.fleet = view.entries
        metrics.fleet_stats = tunnel_stats
        view.on_change = metrics.mark_changed
    else:  # before: the whole snapshot every second
        metrics.fleet = view.snapshot
        metrics.cluster_names = registry.clusters
    der = _certificate_der()
    clusters = [cluster_name(i) for i in range(n)]
    sessions = []
    for i, name in enumerate(clusters):
        session = StandInSession(i, der)
        sessions.append(session)
        registry.add(name, session)
    _traffic(metrics, clusters)
    receive, send = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    peers = PeerSnapshots(receive)
    peers.start()
    sender = SnapshotSender(send, worker_index=1)
    sent: list[int] = []
    original = send.send

    class _CountingSocket:
        def __getattr__(self, name: str) -> Any:
            return getattr(send, name)

        def send(self, data: bytes) -> int:
            sent.append(len(data))
            return original(data)

    sender._sock = _CountingSocket()  # type: ignore[assignment]
    stall = StallMeter()
    stall.start()
    out: dict[str, Any] = {"clusters": n}
    try:
        # What the process spends without the sender (the 1 ms stall ticker, the receiver).
        await asyncio.sleep(1.0)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        out["baseline_cpu_per_second"] = round(
            (time.process_time() - cpu0) / (time.perf_counter() - wall0), 4)
        # The first second: a new sender sends everything (an old one always did).
        cpu0 = time.process_time()
        if hasattr(metrics, "part"):
            sender.start(metrics.part, changed=metrics.take_changed, interval=1.0)
        else:
            sender.start(metrics.snapshot, interval=1.0)
        await asyncio.sleep(2.0)
        out["first_two_seconds_cpu"] = round(time.process_time() - cpu0, 3)
        for phase, busy in (("idle", 0), ("busy_1pct", max(1, n // 100))):
            sent.clear()
            stall.reset()
            cpu0 = time.process_time()
            start_wall = time.perf_counter()
            deadline = time.perf_counter() + seconds
            tick = 0
            while time.perf_counter() < deadline:
                # Idle sessions are pinged after 3 s of silence: a PING and its answer move
                # their byte counts and RTT (a thirtieth of the fleet every 0.1 s).
                tick += 1
                for k in range(tick % 30, n, 30):
                    sessions[k].bytes_received += 17
                    sessions[k].bytes_sent += 17
                    sessions[k].rtt = 0.0008 + (tick % 7) * 1e-5
                for j in range(busy):  # traffic on 1% of the fleet, spread over the second
                    k = (j * 97 + int(time.perf_counter() * 10)) % n
                    metrics.request(clusters[k], 200, 100, 1000, 0.003, "short")
                    sessions[k].bytes_received += 1000
                    sessions[k].streams_opened += 1
                await asyncio.sleep(0.1)
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - start_wall
            part = (peers.snapshots() or [{}])[0]
            out[phase] = {
                "cpu_per_second": round(cpu / wall, 4),
                "sender_cpu_per_second": round(cpu / wall - out["baseline_cpu_per_second"], 4),
                "bytes_per_second": round(sum(sent) / wall),
                "datagrams": len(sent),
                "largest_datagram": max(sent) if sent else 0,
                "stall_seconds": round(stall.longest, 3),
                "received_clusters": len(part.get("fleet") or {}),
            }
        timer = getattr(sender, "_timer", None)
        if timer is not None:
            timer.cancel()
        task = getattr(sender, "_task", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            sender._task = None
    finally:
        await stall.stop()
        peers.stop()
        send.close()
    return out


# --- storm ----------------------------------------------------------------------------------


def _start_kubesim(workdir: Path, admin: str) -> tuple[subprocess.Popen[bytes], str, str]:
    tokens = workdir / "tokens.csv"
    tokens.write_text(f'{admin},admin,admin-uid,"system:masters"\n')
    port = _free_port()
    log = open(workdir / "kubesim.log", "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [sys.executable, "-m", "kubesim", "--listen", f"127.0.0.1:{port}", "--cert-dir",
         str(workdir / "sim"), "--token-auth-file", str(tokens), "--crd", str(PROFILE_CRD),
         "--crd", str(ADDON_CRD), "--name", "hub"],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + 30
    while b"kubesim ready" not in (workdir / "kubesim.log").read_bytes():
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError((workdir / "kubesim.log").read_text())
        time.sleep(0.1)
    return process, f"https://127.0.0.1:{port}", str(workdir / "sim" / "ca.crt")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _api_client(url: str, ca: str, token: str) -> Any:
    from kubernetes_asyncio import client

    cfg = client.Configuration()
    cfg.host = url
    cfg.ssl_ca_cert = ca
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(cfg)


class RequestCounter:
    """Counts the requests an ApiClient sends, by method (wraps its REST client)."""

    def __init__(self, api: Any) -> None:
        self.by_method: dict[str, int] = {}
        self.times: list[tuple[float, str]] = []
        rest = api.rest_client
        original = rest.request

        async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.by_method[method] = self.by_method.get(method, 0) + 1
            self.times.append((time.monotonic(), method))
            return await original(method, url, *args, **kwargs)

        rest.request = request

    def writes(self) -> int:
        return sum(v for k, v in self.by_method.items() if k in ("PATCH", "PUT", "POST"))

    def reads(self) -> int:
        return sum(v for k, v in self.by_method.items() if k == "GET")

    def peak_writes_per_second(self, since: float) -> int:
        buckets: dict[int, int] = {}
        for when, method in self.times:
            if when >= since and method in ("PATCH", "PUT", "POST"):
                buckets[int(when - since)] = buckets.get(int(when - since), 0) + 1
        return max(buckets.values(), default=0)


async def _populate(url: str, ca: str, admin: str, n: int) -> None:
    """N ClusterProfiles in ``fleet`` and N ManagedClusterAddOns ``hubproxy``, one namespace
    per cluster (as OCM keeps them), created concurrently."""
    from kubernetes_asyncio import client

    async with _api_client(url, ca, admin) as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        gate = asyncio.Semaphore(32)

        async def one(coro: Any) -> None:
            async with gate:
                with contextlib.suppress(client.ApiException):
                    await coro

        await one(core.create_namespace({"metadata": {"name": "fleet"}}))
        await asyncio.gather(*(one(core.create_namespace({"metadata": {"name": cluster_name(i)}}))
                               for i in range(n)))
        await asyncio.gather(*(one(custom.create_namespaced_custom_object(
            "multicluster.x-k8s.io", "v1alpha1", "fleet", "clusterprofiles",
            {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
             "metadata": {"name": cluster_name(i), "namespace": "fleet"},
             "spec": {"clusterManager": {"name": "ocm"}, "displayName": cluster_name(i)}}))
            for i in range(n)))
        await asyncio.gather(*(one(custom.create_namespaced_custom_object(
            "addon.open-cluster-management.io", "v1alpha1", cluster_name(i),
            "managedclusteraddons",
            {"apiVersion": "addon.open-cluster-management.io/v1alpha1",
             "kind": "ManagedClusterAddOn",
             "metadata": {"name": "hubproxy", "namespace": cluster_name(i)}, "spec": {}}))
            for i in range(n)))


def _wrong(url: str, ca: str, token: str, connected: list[str]) -> tuple[int, int]:
    """Objects not yet right: profiles without our entry (or with one for a disconnected
    cluster), add-ons whose TunnelConnected is not True for a connected cluster. Runs in a
    process of its own (reading 20,000 objects must not stall the writers' event loop)."""
    import ssl
    import urllib.parse

    context = ssl.create_default_context(cafile=ca)
    wanted = set(connected)

    def pages(path: str) -> Any:
        token_ = ""
        while True:
            query = {"limit": "2000", **({"continue": token_} if token_ else {})}
            request = urllib.request.Request(f"{url}{path}?{urllib.parse.urlencode(query)}",
                                             headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=60, context=context) as response:
                page = json.loads(response.read())
            yield from page["items"]
            token_ = page["metadata"].get("continue") or ""
            if not token_:
                return

    wrong_profiles = wrong_addons = 0
    for item in pages("/apis/multicluster.x-k8s.io/v1alpha1/namespaces/fleet/clusterprofiles"):
        has = any(p.get("name") == "hubproxy"
                  for p in (item.get("status") or {}).get("accessProviders") or [])
        if has != (item["metadata"]["name"] in wanted):
            wrong_profiles += 1
    for item in pages("/apis/addon.open-cluster-management.io/v1alpha1/managedclusteraddons"):
        conditions = (item.get("status") or {}).get("conditions") or []
        up = any(c.get("type") == "TunnelConnected" and c.get("status") == "True"
                 for c in conditions)
        if up != (item["metadata"]["namespace"] in wanted):
            wrong_addons += 1
    return wrong_profiles, wrong_addons


class Writers:
    """One gateway process's hub writers (worker 0), as serve.py runs them."""

    def __init__(self, url: str, ca: str, token: str, workdir: Path,
                 qps: float | None = None, burst: int | None = None) -> None:
        from tunnel.registry import SessionRegistry

        self.writes: Any = None
        try:  # since issue 22: one write rate per process
            from gateway.hub.hubwrites import HubWriteRate, HubWrites

            rate = HubWriteRate(*(v for v in (qps, burst) if v is not None))
            self.writes = HubWrites(rate)
        except ImportError:
            pass

        self.registry = SessionRegistry()
        self.api = _api_client(url, ca, token)
        self.counter = RequestCounter(self.api)
        front_ca = workdir / "front-ca.crt"
        if not front_ca.exists():
            import trustme

            front_ca.write_bytes(trustme.CA().cert_pem.bytes())
        self.args = argparse.Namespace(
            clusterprofiles="on", public_url="https://hubproxy.example:9092",
            access_provider_name="hubproxy", clusterprofile_namespace=["fleet"],
            clusterprofile_ca=str(front_ca), clusterprofile_grace=60.0, tls_dir=str(workdir),
            ocm_addon_conditions=True, ocm_addon_name="hubproxy", ocm_addon_grace=60.0)
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        from gateway.hub.clusterprofile import component as clusterprofile
        from gateway.hub.ocm import component as ocm

        extra = (self.writes,) if self.writes is not None else ()
        self.tasks = [asyncio.ensure_future(clusterprofile.run(self.args, self.api,
                                                               self.registry, *extra)),
                      asyncio.ensure_future(ocm.run(self.args, self.api, self.registry,
                                                    *extra))]

    async def connect(self, sessions: list[tuple[str, Any]], spread: float) -> None:
        """Register the sessions evenly over ``spread`` seconds (agents coming back)."""
        step = max(1, len(sessions) // max(1, int(spread * 20)))
        pause = spread / max(1, len(sessions) / step)
        for i in range(0, len(sessions), step):
            for name, session in sessions[i:i + step]:
                self.registry.add(name, session)
            await asyncio.sleep(pause)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.api.close()


async def _converge(observer: Any, url: str, ca: str, token: str, connected: set[str],
                    n: int, started: float, deadline: float) -> dict[str, Any]:
    seen_wrong: tuple[int, int] = (n, n)
    loop = asyncio.get_running_loop()
    while time.monotonic() - started < deadline:
        await asyncio.sleep(2.0)
        seen_wrong = await loop.run_in_executor(observer, _wrong, url, ca, token,
                                                sorted(connected))
        if seen_wrong == (0, 0):
            return {"converged_seconds": round(time.monotonic() - started, 1),
                    "wrong_at_end": [0, 0]}
    return {"converged_seconds": None, "wrong_at_end": list(seen_wrong)}


async def measure_storm(n: int, spread: float, deadline: float, quiet: float,
                        qps: dict[str, float | None], burst: int | None) -> dict[str, Any]:
    import logging

    logging.getLogger("hubproxy").setLevel(logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="fleethub-"))
    admin = "admin-" + secrets.token_hex(8)
    process, url, ca = _start_kubesim(workdir, admin)
    out: dict[str, Any] = {"clusters": n, "spread_seconds": spread}
    stall = StallMeter()
    stall.start()
    try:
        started = time.monotonic()
        await _populate(url, ca, admin, n)
        out["populate_seconds"] = round(time.monotonic() - started, 1)
        der = _certificate_der()
        names = [cluster_name(i) for i in range(n)]
        connected = set(names)
        import concurrent.futures

        with concurrent.futures.ProcessPoolExecutor(1) as observer:
            for phase in ("formation", "restart"):
                writers = Writers(url, ca, admin, workdir, qps.get(phase), burst)
                if writers.writes is not None:
                    out.setdefault("rate", {})[phase] = [writers.writes.rate.qps,
                                                         writers.writes.rate.burst]
                stall.reset()
                started = time.monotonic()
                writers.start()
                await writers.connect([(name, StandInSession(i, der))
                                       for i, name in enumerate(names)], spread)
                result = await _converge(observer, url, ca, admin, connected, n, started,
                                         deadline)
                result["writes"] = writers.counter.writes()
                result["reads"] = writers.counter.reads()
                # After convergence: what a quiet period costs (resyncs), bounded; the CPU
                # of this process (the writers), the stall ticker paused.
                writes, reads = result["writes"], result["reads"]
                result["stall_seconds"] = round(stall.longest, 3)
                await stall.stop()
                cpu0 = time.process_time()
                await asyncio.sleep(quiet)
                result["quiet_cpu_per_second"] = round((time.process_time() - cpu0) / quiet, 4)
                stall.start()
                result["quiet_seconds"] = quiet
                result["quiet_writes"] = writers.counter.writes() - writes
                result["quiet_reads"] = writers.counter.reads() - reads
                result["peak_writes_per_second"] = writers.counter.peak_writes_per_second(
                    started)
                out[phase] = result
                await writers.stop()
    finally:
        await stall.stop()
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        if process.poll() is None:
            process.kill()
    return out


# --- main -----------------------------------------------------------------------------------


def _print(results: dict[str, Any]) -> None:
    print(json.dumps(results, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleethub", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", default=["scrape", "link", "storm"],
                        choices=["scrape", "link", "storm"], metavar="PART",
                        help="scrape, link, storm (default: all)")
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--link-seconds", type=float, default=5.0)
    parser.add_argument("--spread", type=float, default=20.0,
                        help="seconds over which the clusters (re)connect in the storm")
    parser.add_argument("--deadline", type=float, default=600.0,
                        help="give up on a storm phase after this long")
    parser.add_argument("--quiet", type=float, default=40.0,
                        help="after a storm phase converged, count this long of quiet writes")
    parser.add_argument("--formation-qps", type=float, default=None,
                        help="hub write rate of the first gateway (default: the gateway's)")
    parser.add_argument("--restart-qps", type=float, default=None,
                        help="hub write rate of the restarted gateway (default: the gateway's)")
    parser.add_argument("--burst", type=int, default=None,
                        help="hub write burst (default: the gateway's)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(), "load_average": os.getloadavg()}

    async def run() -> None:
        if "scrape" in args.parts:
            results["scrape"] = await measure_scrape(args.clusters, args.repeats)
            _print({"scrape": results["scrape"]})
        if "link" in args.parts:
            results["link"] = await measure_link(args.clusters, args.link_seconds)
            _print({"link": results["link"]})
        if "storm" in args.parts:
            results["storm"] = await measure_storm(
                args.clusters, args.spread, args.deadline, args.quiet,
                {"formation": args.formation_qps, "restart": args.restart_qps}, args.burst)
            _print({"storm": results["storm"]})

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    threading.stack_size(0)
    sys.exit(main())
