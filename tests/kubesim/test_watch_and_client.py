"""Watch semantics over raw HTTP, and kubernetes-asyncio (list, create, watch) against kubesim."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubesim.testing import RunningKubeSim, run_kubesim

CM_PATH = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[RunningKubeSim]:
    async with run_kubesim(tmp_path, bookmark_interval=0.2) as running:
        yield running


@pytest.fixture
async def session(sim: RunningKubeSim) -> AsyncIterator[aiohttp.ClientSession]:
    ctx = ssl.create_default_context(cafile=sim.ca_file)
    headers = {"Authorization": f"Bearer {sim.admin_token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx), headers=headers) as s:
        yield s


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
    }


async def read_events(
    resp: aiohttp.ClientResponse, count: int, timeout: float = 5.0
) -> list[dict[str, Any]]:
    events = []
    async with asyncio.timeout(timeout):
        while len(events) < count:
            line = await resp.content.readline()
            if not line:
                break
            events.append(json.loads(line))
    return events


async def test_watch_from_resource_version_with_selector(
    sim: RunningKubeSim, session: aiohttp.ClientSession
) -> None:
    first = sim.apply(cm("before", app="web"))[0]
    rv = first["metadata"]["resourceVersion"]
    url = (
        f"{sim.url}{CM_PATH}?watch=1&resourceVersion={rv}&labelSelector=app%3Dweb&timeoutSeconds=5"
    )
    async with session.get(url) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
        assert resp.headers.get("Transfer-Encoding") == "chunked"
        sim.apply(cm("other", app="db"))
        sim.apply(cm("after", app="web"))
        sim.apply({**cm("after", app="web"), "data": {"k": "v"}})
        await session.delete(f"{sim.url}{CM_PATH}/after")
        events = await read_events(resp, 3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "after"),
        ("MODIFIED", "after"),
        ("DELETED", "after"),
    ]
    assert events[0]["object"]["kind"] == "ConfigMap"
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


async def test_watch_without_resource_version_starts_with_current_state(
    sim: RunningKubeSim, session: aiohttp.ClientSession
) -> None:
    sim.apply(cm("existing"))
    async with session.get(f"{sim.url}{CM_PATH}?watch=true&timeoutSeconds=1") as resp:
        events = await read_events(resp, 10, timeout=5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "existing")]


async def test_watch_bookmarks_and_timeout(
    sim: RunningKubeSim, session: aiohttp.ClientSession
) -> None:
    rv = str(sim.store.resource_version)
    url = (
        f"{sim.url}{CM_PATH}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=1"
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with session.get(url) as resp:
        events = await read_events(resp, 100, timeout=5)
    assert 0.9 <= loop.time() - started < 4
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert events[0]["object"] == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": rv},
    }


async def test_watch_too_old_resource_version_is_410_expired(tmp_path: Path) -> None:
    async with run_kubesim(tmp_path) as small:
        small.sim.store._history = type(small.sim.store._history)(maxlen=5)  # a tiny window
        for i in range(10):
            small.apply(cm(f"c{i}"))
        ctx = ssl.create_default_context(cafile=small.ca_file)
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s,
            s.get(
                f"{small.url}{CM_PATH}?watch=1&resourceVersion=2",
                headers={"Authorization": f"Bearer {small.admin_token}"},
            ) as resp,
        ):
            events = await read_events(resp, 2)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    err = events[0]["object"]
    assert err["code"] == 410 and err["reason"] == "Expired"
    assert err["message"].startswith("too old resource version: 2 (")


async def test_list_limit_and_continue(sim: RunningKubeSim, session: aiohttp.ClientSession) -> None:
    for i in range(5):
        sim.apply(cm(f"page-{i}"))
    names: list[str] = []
    url = f"{sim.url}{CM_PATH}?limit=2"
    for _ in range(5):
        async with session.get(url) as resp:
            page = await resp.json()
        assert page["kind"] == "ConfigMapList"
        names.extend(i["metadata"]["name"] for i in page["items"])
        token = page["metadata"].get("continue")
        if not token:
            break
        url = f"{sim.url}{CM_PATH}?limit=2&continue={token}"
    assert names == [f"page-{i}" for i in range(5)]


async def test_table_for_kubectl_get(sim: RunningKubeSim, session: aiohttp.ClientSession) -> None:
    sim.apply(cm("tabled"))
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    async with session.get(f"{sim.url}{CM_PATH}", headers={"Accept": accept}) as resp:
        table = await resp.json()
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Data", "Age"]
    assert table["rows"][0]["cells"][:2] == ["tabled", 0]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


async def test_kubernetes_asyncio_list_create_watch(sim: RunningKubeSim) -> None:
    from kubernetes_asyncio import client, watch

    async with sim.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="apps")))
        created = await core.create_namespaced_config_map(
            "apps",
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="one", labels={"x": "1"}), data={"k": "v"}
            ),
        )
        assert created.metadata.uid and created.metadata.resource_version
        listed = await core.list_namespaced_config_map("apps", label_selector="x=1")
        assert [i.metadata.name for i in listed.items] == ["one"]
        pods = await core.list_pod_for_all_namespaces()
        assert pods.items == []

        seen: list[tuple[str, str]] = []
        w = watch.Watch()

        async def consume() -> None:
            async for event in w.stream(
                core.list_namespaced_config_map,
                "apps",
                resource_version=listed.metadata.resource_version,
                timeout_seconds=5,
            ):
                seen.append((event["type"], event["object"].metadata.name))
                if len(seen) == 2:
                    w.stop()

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        await core.create_namespaced_config_map(
            "apps", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="two"))
        )
        await core.delete_namespaced_config_map("two", "apps")
        await asyncio.wait_for(task, 5)
        assert seen == [("ADDED", "two"), ("DELETED", "two")]

        with pytest.raises(client.ApiException) as err:
            await core.read_namespaced_config_map("missing", "apps")
        assert err.value.status == 404
        assert json.loads(err.value.body)["reason"] == "NotFound"


async def test_kubernetes_asyncio_forbidden_for_plain_user(sim: RunningKubeSim) -> None:
    from kubernetes_asyncio import client

    token = sim.mint_token("default", "nobody")
    async with sim.api_client(token) as api_client:
        with pytest.raises(client.ApiException) as err:
            await client.CoreV1Api(api_client).list_namespaced_secret("default")
    assert err.value.status == 403
    assert json.loads(err.value.body)["message"] == (
        'secrets is forbidden: User "system:serviceaccount:default:nobody" cannot list resource '
        '"secrets" in API group "" in the namespace "default"'
    )


async def test_watch_label_selector_transitions(
    sim: RunningKubeSim, session: aiohttp.ClientSession
) -> None:
    sim.apply(cm("mover", app="web"))
    rv = str(sim.store.resource_version)
    url = (
        f"{sim.url}{CM_PATH}?watch=1&resourceVersion={rv}&labelSelector=app%3Dweb&timeoutSeconds=5"
    )
    async with session.get(url) as resp:
        sim.apply(cm("mover", app="db"))  # leaves the selection
        sim.apply(cm("mover", app="web"))  # enters it again
        sim.apply({**cm("mover", app="web"), "data": {"k": "v"}})
        events = await read_events(resp, 3)
    assert [e["type"] for e in events] == ["DELETED", "ADDED", "MODIFIED"]


async def test_watch_ends_when_the_client_goes_away(
    sim: RunningKubeSim, session: aiohttp.ClientSession
) -> None:
    async with session.get(f"{sim.url}{CM_PATH}?watch=1&timeoutSeconds=60") as resp:
        assert resp.status == 200
        assert sim.store.watcher_count == 1
    async with asyncio.timeout(5):
        while sim.store.watcher_count:
            await asyncio.sleep(0.05)


async def test_aggregated_discovery(sim: RunningKubeSim, session: aiohttp.ClientSession) -> None:
    accept = (
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
    )
    async with session.get(f"{sim.url}/api", headers={"Accept": accept}) as resp:
        assert resp.headers["Content-Type"] == (
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        )
        core = await resp.json(content_type=None)
    assert core["kind"] == "APIGroupDiscoveryList" and core["items"][0]["metadata"]["name"] == ""
    pods = next(r for r in core["items"][0]["versions"][0]["resources"] if r["resource"] == "pods")
    assert pods["scope"] == "Namespaced" and pods["responseKind"]["kind"] == "Pod"
    assert {s["subresource"] for s in pods["subresources"]} >= {
        "log",
        "exec",
        "portforward",
        "status",
    }
    async with session.get(f"{sim.url}/apis", headers={"Accept": "application/json"}) as resp:
        legacy = await resp.json()
    assert legacy["kind"] == "APIGroupList"
    assert "rbac.authorization.k8s.io" in {g["name"] for g in legacy["groups"]}


async def test_interceptors_can_delay_or_answer(
    sim: RunningKubeSim, session: aiohttp.ClientSession
) -> None:
    from aiohttp import web

    async def unavailable(request: web.Request) -> web.StreamResponse | None:
        if request.path == "/version":
            return web.Response(status=503, text="hub down")
        return None

    undo = sim.intercept(unavailable)
    async with session.get(f"{sim.url}/version") as resp:
        assert resp.status == 503 and await resp.text() == "hub down"
    assert sim.received[-1].status == 503
    undo()
    async with session.get(f"{sim.url}/version") as resp:
        assert resp.status == 200


async def test_metadata_only_responses(sim: RunningKubeSim, session: aiohttp.ClientSession) -> None:
    sim.apply({**cm("meta-only"), "data": {"secret-ish": "value"}})
    accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
    async with session.get(f"{sim.url}{CM_PATH}", headers={"Accept": accept}) as resp:
        listed = await resp.json()
    assert listed["kind"] == "PartialObjectMetadataList"
    assert (
        listed["items"][0]["kind"] == "PartialObjectMetadata" and "data" not in listed["items"][0]
    )
    accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    async with session.get(f"{sim.url}{CM_PATH}/meta-only", headers={"Accept": accept}) as resp:
        one = await resp.json()
    assert one["kind"] == "PartialObjectMetadata" and one["metadata"]["name"] == "meta-only"


async def test_watch_from_the_future_is_a_timeout_error(
    sim: RunningKubeSim, session: aiohttp.ClientSession
) -> None:
    future = sim.store.resource_version + 1000
    async with session.get(f"{sim.url}{CM_PATH}?watch=1&resourceVersion={future}") as resp:
        events = await read_events(resp, 2)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 504 and events[0]["object"]["reason"] == "Timeout"
    assert events[0]["object"]["details"]["retryAfterSeconds"] == 1
    assert sim.watcher_count == 0
