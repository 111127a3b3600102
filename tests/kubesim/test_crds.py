"""CustomResourceDefinitions: registration, discovery, status subresource, validation, deletion."""

from __future__ import annotations

import json
import shutil
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubesim.testing import RunningKubeSim, run_kubesim

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1}
              color: {type: string, enum: [red, blue]}
              tags: {type: array, items: {type: string}}
          status:
            type: object
            properties:
              ready: {type: boolean}
              notes: {type: string, nullable: true}
"""
BASE = "/apis/example.com/v1/namespaces/default/widgets"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[RunningKubeSim]:
    async with run_kubesim(tmp_path, crds=[WIDGET_CRD]) as running:
        yield running


@pytest.fixture
async def call(sim: RunningKubeSim):
    ctx = ssl.create_default_context(cafile=sim.ca_file)
    headers = {"Authorization": f"Bearer {sim.admin_token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx), headers=headers) as s:

        async def do(
            method: str, path: str, body: Any = None, content_type: str = "application/json"
        ) -> tuple[int, Any]:
            data = None if body is None else json.dumps(body)
            async with s.request(
                method, sim.url + path, data=data, headers={"Content-Type": content_type}
            ) as resp:
                if resp.content_type == "text/plain":  # Go's "404 page not found"
                    return resp.status, await resp.text()
                return resp.status, await resp.json(content_type=None)

        yield do


def widget(size: Any = 3, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": size},
        **extra,
    }


async def test_status_subresource_and_generation(call) -> None:
    code, created = await call("POST", BASE, widget(status={"ready": True}))
    assert code == 201 and "status" not in created  # status is dropped on create
    assert created["metadata"]["generation"] == 1
    code, obj = await call(
        "PUT", f"{BASE}/w/status", {**created, "status": {"ready": True}, "spec": {"size": 99}}
    )
    assert code == 200 and obj["status"] == {"ready": True} and obj["spec"]["size"] == 3
    assert obj["metadata"]["generation"] == 1
    code, obj = await call(
        "PUT", f"{BASE}/w", {**obj, "spec": {"size": 4}, "status": {"ready": False}}
    )
    assert obj["status"] == {"ready": True} and obj["metadata"]["generation"] == 2
    code, obj = await call(
        "PATCH",
        f"{BASE}/w/status",
        {"status": {"notes": None, "ready": False}},
        "application/merge-patch+json",
    )
    assert code == 200 and obj["status"] == {"ready": False}
    code, body = await call(
        "PATCH", f"{BASE}/w", {"spec": {"size": 5}}, "application/strategic-merge-patch+json"
    )
    assert code == 415 and body["reason"] == "UnsupportedMediaType"
    code, gone = await call("DELETE", f"{BASE}/w")
    assert code == 200 and gone["kind"] == "Widget"


async def test_schema_validation_and_strict_fields(call) -> None:
    code, body = await call("POST", BASE, widget(size="big"))
    assert code == 422 and body["message"] == (
        'Widget.example.com "w" is invalid: spec.size: Invalid value: "string": spec.size in body '
        'must be of type integer: "string"'
    )
    code, body = await call("POST", BASE, {**widget(), "spec": {"color": "green"}})
    assert code == 422
    assert [c["field"] for c in body["details"]["causes"]] == ["spec.size", "spec.color"]
    assert body["details"]["causes"][1]["reason"] == "FieldValueNotSupported"
    code, body = await call("POST", BASE, widget(size=0))
    assert code == 422 and "should be greater than or equal to 1" in body["message"]
    code, body = await call(
        "POST",
        BASE + "?fieldValidation=Strict",
        {**widget(), "spec": {"size": 1, "shape": "round"}},
    )
    assert code == 400 and body["message"] == (
        'Widget in version "v1" cannot be handled as a Widget: strict decoding error: '
        'unknown field "spec.shape"'
    )
    code, obj = await call("POST", BASE, {**widget(), "spec": {"size": 1, "shape": "round"}})
    assert code == 201 and obj["spec"] == {"size": 1}  # pruned without Strict


async def test_crd_lifecycle_changes_discovery(call, sim: RunningKubeSim) -> None:
    code, groups = await call("GET", "/apis")
    assert "example.com" in {g["name"] for g in groups["groups"]}
    code, resources = await call("GET", "/apis/example.com/v1")
    names = {r["name"] for r in resources["resources"]}
    assert names == {"widgets", "widgets/status"}
    await call("POST", BASE, widget())
    code, _ = await call(
        "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com"
    )
    assert code == 200
    code, body = await call("GET", BASE)
    # The group is gone with its only CRD: no handler owns the path (as on a real apiserver).
    assert (code, body) == (404, "404 page not found\n")
    assert sim.store.list(("example.com", "widgets")) == []


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
async def test_kubectl_registers_crd_and_prints_columns(tmp_path: Path) -> None:
    async with run_kubesim(tmp_path) as sim:
        (tmp_path / "crd.yaml").write_text(WIDGET_CRD)
        rc, out, err = await sim.kubectl("apply", "-f", str(tmp_path / "crd.yaml"))
        assert rc == 0, err
        (tmp_path / "w.yaml").write_text(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 7}\n"
        )
        rc, out, err = await sim.kubectl("apply", "-f", str(tmp_path / "w.yaml"))
        assert rc == 0, err
        rc, out, err = await sim.kubectl("get", "wd")
        assert out.splitlines()[0].split() == ["NAME", "SIZE", "AGE"]
        assert out.splitlines()[1].split()[:2] == ["w1", "7"]
        rc, out, err = await sim.kubectl("patch", "widget", "w1", "-p", '{"spec":{"size":8}}')
        assert (
            rc == 1 and "is not supported by example.com/v1, Kind=Widget" in err
        )  # as for real CRs
        rc, out, err = await sim.kubectl(
            "patch", "widget", "w1", "--type=merge", "-p", '{"spec":{"size":8}}'
        )
        assert rc == 0, err
