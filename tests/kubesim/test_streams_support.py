"""A minimal TLS API server around `kubesim.streams`, for testing the streams on their own.

Just enough of kube-apiserver for kubectl to reach a pod's subresources: legacy discovery, GET
of fixed pods, and the subresource routes. No auth: kubesim's real server does that. Also
async helpers to run the real kubectl against any base URL. (No tests in this module.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme
from aiohttp import web

from kubesim.streams import serve_pod_subresource

KUBECTL = "/usr/bin/kubectl"


def make_pod(
    name: str, containers: Sequence[str] = ("main",), annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": annotations or {},
        },
        "spec": {
            "containers": [
                {
                    "name": c,
                    "image": "kubesim/builtin",
                    "env": [{"name": "GREETING", "value": "hello"}],
                }
                for c in containers
            ]
        },
        "status": {"phase": "Running"},
    }


PODS = {
    "web": make_pod("web"),
    "two": make_pod("two", ("a", "b")),
    "fast": make_pod(
        "fast",
        annotations={
            "kubesim.hubproxy.dev/log-interval-ms": "20",
            "kubesim.hubproxy.dev/log-lines": "3",
        },
    ),
}


@dataclass(frozen=True)
class SeenRequest:
    """How a client reached a subresource, so tests can assert which wire protocol ran."""

    subresource: str
    method: str
    upgrade: str
    ws_protocols: str
    stream_protocols: str


def _discovery_app(seen: list[SeenRequest]) -> web.Application:
    async def api(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
                ],
            }
        )

    async def apis(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    async def api_v1(_: web.Request) -> web.Response:
        resources = [
            {
                "name": "pods",
                "singularName": "pod",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get", "list"],
                "shortNames": ["po"],
            },
            {
                "name": "pods/log",
                "singularName": "",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get"],
            },
            {
                "name": "pods/exec",
                "singularName": "",
                "namespaced": True,
                "kind": "PodExecOptions",
                "verbs": ["create", "get"],
            },
            {
                "name": "pods/attach",
                "singularName": "",
                "namespaced": True,
                "kind": "PodAttachOptions",
                "verbs": ["create", "get"],
            },
            {
                "name": "pods/portforward",
                "singularName": "",
                "namespaced": True,
                "kind": "PodPortForwardOptions",
                "verbs": ["create", "get"],
            },
        ]
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "v1",
                "resources": resources,
            }
        )

    async def version(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "major": "1",
                "minor": "32",
                "gitVersion": "v1.32.0-kubesim",
                "platform": "linux/amd64",
            }
        )

    def lookup(request: web.Request) -> dict[str, Any]:
        pod = PODS.get(request.match_info["name"])
        if pod is None or request.match_info["ns"] != "default":
            name = request.match_info["name"]
            raise web.HTTPNotFound(
                content_type="application/json",
                text=json.dumps(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "NotFound",
                        "code": 404,
                        "message": f'pods "{name}" not found',
                    }
                ),
            )
        return pod

    async def get_pod(request: web.Request) -> web.Response:
        return web.json_response(lookup(request))

    async def subresource(request: web.Request) -> web.StreamResponse:
        seen.append(
            SeenRequest(
                request.match_info["sub"],
                request.method,
                request.headers.get("Upgrade", ""),
                request.headers.get("Sec-WebSocket-Protocol", ""),
                request.headers.get("X-Stream-Protocol-Version", ""),
            )
        )
        return await serve_pod_subresource(request, request.match_info["sub"], lookup(request))

    app = web.Application()
    app.router.add_get("/api", api)
    app.router.add_get("/apis", apis)
    app.router.add_get("/api/v1", api_v1)
    app.router.add_get("/version", version)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", get_pod)
    app.router.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}/{sub}", subresource)
    return app


@dataclass
class StreamsServer:
    url: str
    port: int
    ca_file: Path
    client_ssl: ssl.SSLContext
    kubeconfig: Path
    seen: list[SeenRequest]


@contextlib.asynccontextmanager
async def streams_server(tmp_path: Path) -> AsyncIterator[StreamsServer]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ssl)
    client_ssl = ssl.create_default_context()
    ca.configure_trust(client_ssl)
    ca_file = tmp_path / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))

    seen: list[SeenRequest] = []
    runner = web.AppRunner(
        _discovery_app(seen), handle_signals=False, access_log=None, shutdown_timeout=0.5
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"https://127.0.0.1:{port}"
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, url, ca_file)
    try:
        yield StreamsServer(url, port, ca_file, client_ssl, kubeconfig, seen)
    finally:
        await runner.cleanup()


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str = "t") -> None:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server}", certificate-authority: "{ca_file}"}}
users:
- name: u
  user: {{token: "{token}"}}
contexts:
- name: c
  context: {{cluster: c, user: u, namespace: default}}
current-context: c
""")


@dataclass
class KubectlResult:
    code: int
    stdout: bytes
    stderr: bytes


async def kubectl(
    kubeconfig: Path,
    *args: str,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 20.0,
) -> KubectlResult:
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={kubeconfig}",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(kubeconfig.parent), **(env or {})},
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return KubectlResult(proc.returncode, out, err)
