"""Object lifecycle: what the apiserver's registries do between a decoded body and storage.

Metadata defaults (uid, creationTimestamp, generation, generateName), name and namespace rules,
optimistic concurrency on resourceVersion, status-subresource semantics, CRD schema validation,
and the small amount of "controller" behaviour kubesim fakes synchronously: pods are Running at
once, namespaces get a `default` ServiceAccount, registered CRDs are Established and served,
deleting a namespace or CRD deletes what it contained.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import yaml

from kubesim import patch as patching
from kubesim import schema, status
from kubesim.resources import Registry, ResourceType
from kubesim.status import FieldError, StatusError
from kubesim.store import Store

CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")
SERVICEACCOUNTS = ("", "serviceaccounts")

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    "regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)

NAMESPACE_MISMATCH = (
    "the namespace of the provided object does not match the namespace sent on the request"
)
PATCH_TYPES = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
]


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _random_suffix() -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(alphabet[b % len(alphabet)] for b in uuid.uuid4().bytes[:5])


def _strip_meta(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Objects:
    """CRUD with apiserver semantics over a Store; independent of HTTP and of who asks."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self._ips = itertools.count(10)
        # Hooks run after a successful write, e.g. to wake the CRD discovery cache.
        self.after_write: list[Callable[[ResourceType, str, dict[str, Any]], None]] = []

    # --- reads ------------------------------------------------------------------------
    def get(self, rtype: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rtype.key, namespace if rtype.namespaced else "", name)
        if obj is None:
            raise status.not_found(rtype.group, rtype.plural, name)
        return self._as_version(rtype, obj)

    def list(self, rtype: ResourceType, namespace: str | None) -> list[dict[str, Any]]:
        ns = namespace if rtype.namespaced and namespace else None
        return [self._as_version(rtype, o) for o in self.store.list(rtype.key, ns)]

    @staticmethod
    def _as_version(rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        obj["apiVersion"] = rtype.group_version
        obj["kind"] = rtype.kind
        return obj

    # --- create -----------------------------------------------------------------------
    def create(
        self,
        rtype: ResourceType,
        namespace: str,
        obj: Any,
        dry_run: bool = False,
        strict: bool = False,
    ) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise status.bad_request("Object 'Kind' is missing in the body")
        obj = copy.deepcopy(obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if rtype.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise status.bad_request(NAMESPACE_MISMATCH)
            meta["namespace"] = namespace or meta.get("namespace") or ""
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + _random_suffix()
        name = meta.get("name", "")
        self._validate(rtype, obj, name, creating=True, strict=strict)
        if rtype.namespaced and self.store.get(NAMESPACES, "", meta["namespace"]) is None:
            raise status.not_found("", "namespaces", meta["namespace"])
        if self.store.get(rtype.key, meta.get("namespace", ""), name) is not None:
            raise status.already_exists(rtype.group, rtype.plural, name)
        for k in ("resourceVersion", "deletionTimestamp", "managedFields", "selfLink"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        if self._has_generation(rtype):
            meta["generation"] = 1
        if rtype.has_status and rtype.crd_name:
            obj.pop("status", None)  # status is written only through /status
        obj["apiVersion"], obj["kind"] = rtype.group_version, rtype.kind
        self._defaults(rtype, obj)
        if dry_run:
            return obj
        stored = self.store.put(rtype.key, obj, "ADDED")
        self._after(rtype, "ADDED", stored)
        return self._as_version(rtype, stored)

    # --- update -----------------------------------------------------------------------
    def update(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        obj: Any,
        subresource: str = "",
        dry_run: bool = False,
        strict: bool = False,
    ) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise status.bad_request("Object 'Kind' is missing in the body")
        ns = namespace if rtype.namespaced else ""
        current = self.store.get(rtype.key, ns, name)
        if current is None:
            raise status.not_found(rtype.group, rtype.plural, name)
        obj = copy.deepcopy(obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if meta.get("name", name) != name:
            raise status.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        if rtype.namespaced and meta.get("namespace") and meta["namespace"] != ns:
            raise status.bad_request(NAMESPACE_MISMATCH)
        rv = meta.get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise status.conflict(rtype.group, rtype.plural, name, status.RV_CONFLICT)
        if subresource == "status":
            new = copy.deepcopy(current)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = obj
            if rtype.has_status:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
        new_meta = new.setdefault("metadata", {})
        new_meta["name"] = name
        if rtype.namespaced:
            new_meta["namespace"] = ns
        # Server-owned metadata is carried over, whatever the client sent.
        for k in ("uid", "creationTimestamp", "generation"):
            if k in current["metadata"]:
                new_meta[k] = current["metadata"][k]
            else:
                new_meta.pop(k, None)
        new_meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        if self._has_generation(rtype) and _strip_meta(new) != _strip_meta(current):
            new_meta["generation"] = current["metadata"].get("generation", 1) + 1
        new["apiVersion"], new["kind"] = rtype.group_version, rtype.kind
        self._validate(rtype, new, name, creating=False, strict=strict)
        self._defaults(rtype, new, current)
        if new == {**current, "apiVersion": new["apiVersion"], "kind": new["kind"]}:
            return self._as_version(rtype, current)  # no-op writes keep their resourceVersion
        if dry_run:
            return new
        stored = self.store.put(rtype.key, new, "MODIFIED")
        self._after(rtype, "MODIFIED", stored)
        return self._as_version(rtype, stored)

    def patch(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        body: bytes,
        subresource: str = "",
        dry_run: bool = False,
        strict: bool = False,
    ) -> dict[str, Any]:
        ns = namespace if rtype.namespaced else ""
        kind = content_type.split(";")[0].strip().lower()
        accepted = [t for t in PATCH_TYPES if not (rtype.crd_name and "strategic" in t)]
        if kind not in accepted:
            # Custom resources have no patch strategy, so strategic merge is refused (415).
            raise status.unsupported_media_type(kind, accepted)
        try:
            doc = (
                yaml.safe_load(body) if kind == "application/apply-patch+yaml" else json.loads(body)
            )
        except (ValueError, yaml.YAMLError) as exc:
            raise status.bad_request(f"error decoding patch: {exc}") from exc
        current = self.store.get(rtype.key, ns, name)
        if current is None:
            if kind == "application/apply-patch+yaml" and not subresource:
                return self.create(rtype, namespace, doc, dry_run, strict)
            raise status.not_found(rtype.group, rtype.plural, name)
        try:
            if kind == "application/json-patch+json":
                new = patching.json_patch(current, doc)
            elif kind == "application/merge-patch+json":
                new = patching.merge_patch(current, doc)
            else:
                new = patching.strategic_merge_patch(current, doc)
        except patching.PatchError as exc:
            if exc.code == 400:
                raise status.bad_request(str(exc)) from exc
            raise StatusError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: {exc}",
                {},
            ) from exc
        if not isinstance(new, dict):
            raise status.bad_request("the patch did not produce an object")
        meta = new.setdefault("metadata", {})
        if kind == "application/apply-patch+yaml":
            meta.pop("resourceVersion", None)
        elif meta.get("resourceVersion") in (None, ""):
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.update(rtype, namespace, name, new, subresource, dry_run, strict)

    # --- delete -----------------------------------------------------------------------
    def delete(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        options: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        ns = namespace if rtype.namespaced else ""
        current = self.store.get(rtype.key, ns, name)
        if current is None:
            raise status.not_found(rtype.group, rtype.plural, name)
        pre = (options or {}).get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
            raise status.conflict(
                rtype.group,
                rtype.plural,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, "
                f"UID in object meta: {current['metadata']['uid']}",
            )
        if (
            pre.get("resourceVersion")
            and pre["resourceVersion"] != current["metadata"]["resourceVersion"]
        ):
            raise status.conflict(
                rtype.group,
                rtype.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{current['metadata']['resourceVersion']}",
            )
        if dry_run:
            return self._as_version(rtype, current)
        if rtype.key == NAMESPACES:
            if name in ("default", "kube-system", "kube-public"):
                # The apiserver's NamespaceLifecycle admission plugin refuses this.
                raise status.forbidden("", "namespaces", name, "this namespace may not be deleted")
            for t in self.registry.all():
                if t.namespaced and not t.virtual:
                    for obj in self.store.list(t.key, name):
                        self.store.delete(t.key, name, obj["metadata"]["name"])
        if rtype.key == CRD_KEY:
            self._drop_crd(current)
        gone = self.store.delete(rtype.key, ns, name)
        assert gone is not None
        self._after(rtype, "DELETED", gone)
        return self._as_version(rtype, gone)

    # --- rules ------------------------------------------------------------------------
    @staticmethod
    def _has_generation(rtype: ResourceType) -> bool:
        return bool(rtype.crd_name) or rtype.key == CRD_KEY

    def _validate(
        self,
        rtype: ResourceType,
        obj: dict[str, Any],
        name: str,
        creating: bool,
        strict: bool = False,
    ) -> None:
        errors: list[FieldError] = []
        meta = obj.get("metadata") or {}
        if not name:
            errors.append(
                FieldError(
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                )
            )
        elif rtype.key == NAMESPACES:
            if not _LABEL.match(name) or len(name) > 63:
                errors.append(
                    FieldError(
                        "metadata.name",
                        "FieldValueInvalid",
                        f'Invalid value: "{name}": {_LABEL_MSG}',
                    )
                )
        elif rtype.group != "rbac.authorization.k8s.io" and (
            not _SUBDOMAIN.match(name) or len(name) > 253
        ):
            errors.append(
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    f'Invalid value: "{name}": {_SUBDOMAIN_MSG}',
                )
            )
        elif "/" in name or "%" in name or name in (".", ".."):
            errors.append(
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    f"Invalid value: \"{name}\": may not contain '/'",
                )
            )
        for field in ("labels", "annotations"):
            value = meta.get(field)
            if value is not None and (
                not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
            ):
                errors.append(
                    FieldError(
                        f"metadata.{field}",
                        "FieldValueInvalid",
                        f"Invalid value: {field} must be a map of strings",
                    )
                )
        if rtype.key == ("", "pods") and creating:
            containers = (obj.get("spec") or {}).get("containers")
            if not containers:
                errors.append(FieldError("spec.containers", "FieldValueRequired", "Required value"))
            else:
                for i, c in enumerate(containers):
                    if not isinstance(c, dict) or not c.get("name"):
                        errors.append(
                            FieldError(
                                f"spec.containers[{i}].name", "FieldValueRequired", "Required value"
                            )
                        )
                    elif not c.get("image"):
                        errors.append(
                            FieldError(
                                f"spec.containers[{i}].image",
                                "FieldValueRequired",
                                "Required value",
                            )
                        )
        if rtype.key == CRD_KEY:
            errors.extend(self._crd_errors(obj, name))
        if rtype.schema is not None:
            errors.extend(schema.validate(obj, rtype.schema))
        if errors:
            raise status.invalid(rtype.group, rtype.kind, name, errors)
        if rtype.schema is not None:
            removed: list[str] = []
            schema.prune(obj, rtype.schema, removed=removed)
            if strict and removed:
                # fieldValidation=Strict (kubectl's default): unknown fields are an error.
                unknown = ", ".join(f'unknown field "{p}"' for p in removed)
                raise status.bad_request(
                    f'{rtype.kind} in version "{rtype.version}" cannot be handled as a '
                    f"{rtype.kind}: strict decoding error: {unknown}"
                )

    @staticmethod
    def _crd_errors(crd: dict[str, Any], name: str) -> list[FieldError]:
        spec = crd.get("spec")
        if not isinstance(spec, dict):
            return [FieldError("spec", "FieldValueRequired", "Required value")]
        names = spec.get("names") or {}
        errors = []
        for field in ("plural", "kind"):
            if not names.get(field):
                errors.append(
                    FieldError(f"spec.names.{field}", "FieldValueRequired", "Required value")
                )
        if not spec.get("group"):
            errors.append(FieldError("spec.group", "FieldValueRequired", "Required value"))
        if not spec.get("versions"):
            errors.append(
                FieldError(
                    "spec.versions",
                    "FieldValueInvalid",
                    'Invalid value: "null": must have exactly one version marked as storage '
                    "version",
                )
            )
        if (
            names.get("plural")
            and spec.get("group")
            and name != f"{names['plural']}.{spec['group']}"
        ):
            errors.append(
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
                )
            )
        return errors

    def _defaults(
        self, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None = None
    ) -> None:
        # Go's `omitempty`: the real apiserver never returns empty metadata maps and lists.
        meta = obj.get("metadata") or {}
        for field in ("labels", "annotations", "finalizers", "ownerReferences"):
            if field in meta and not meta[field]:
                del meta[field]
        if not rtype.crd_name:
            for field in ("data", "binaryData", "stringData"):
                if field in obj and not obj[field]:
                    del obj[field]
        key = rtype.key
        if key == NAMESPACES:
            obj.setdefault("metadata", {}).setdefault("labels", {})[
                "kubernetes.io/metadata.name"
            ] = obj["metadata"]["name"]
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        elif key == ("", "pods"):
            self._pod_defaults(obj, old)
        elif key == ("", "secrets"):
            obj.setdefault("type", "Opaque")
            string_data = obj.pop("stringData", None) or {}
            data = obj.setdefault("data", {}) if string_data else obj.get("data")
            for k, v in string_data.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        elif key == ("", "services"):
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if old is not None and "clusterIP" in (old.get("spec") or {}):
                spec["clusterIP"] = old["spec"]["clusterIP"]
            if spec.get("clusterIP") != "None":
                n = next(self._ips)
                spec.setdefault("clusterIP", f"10.96.{n // 250}.{n % 250 + 1}")
            spec["clusterIPs"] = [spec["clusterIP"]]
            spec.setdefault("sessionAffinity", "None")
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
                if spec["type"] in ("NodePort", "LoadBalancer") and not port.get("nodePort"):
                    port["nodePort"] = 30000 + next(self._ips) % 2768
            if spec["type"] in ("NodePort", "LoadBalancer"):
                spec.setdefault("externalTrafficPolicy", "Cluster")
            obj["status"] = (old or {}).get("status") or {"loadBalancer": {}}
        elif key == CRD_KEY:
            spec = obj["spec"]
            spec.setdefault("scope", "Namespaced")
            names = spec["names"]
            names.setdefault("singular", names["kind"].lower())
            names.setdefault("listKind", names["kind"] + "List")
            storage = [v["name"] for v in spec["versions"] if v.get("storage")] or [
                spec["versions"][0]["name"]
            ]
            ts = now()
            obj["status"] = {
                "acceptedNames": dict(names),
                "conditions": [
                    {
                        "type": "NamesAccepted",
                        "status": "True",
                        "reason": "NoConflicts",
                        "message": "no conflicts found",
                        "lastTransitionTime": ts,
                    },
                    {
                        "type": "Established",
                        "status": "True",
                        "reason": "InitialNamesAccepted",
                        "message": "the initial names have been accepted",
                        "lastTransitionTime": ts,
                    },
                ],
                "storedVersions": storage,
            }

    def _pod_defaults(self, pod: dict[str, Any], old: dict[str, Any] | None) -> None:
        spec = pod.setdefault("spec", {})
        spec.setdefault("nodeName", "kubesim-node")
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("securityContext", {})
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        spec.setdefault("priority", 0)
        for c in spec.get("containers") or []:
            c.setdefault(
                "imagePullPolicy",
                "Always"
                if str(c.get("image", "")).endswith(":latest") or ":" not in str(c.get("image", ""))
                else "IfNotPresent",
            )
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})
        if old is not None and old.get("status"):
            pod["status"] = old["status"]
            return
        started = now()
        n = next(self._ips)
        ip = f"10.244.{n // 250}.{n % 250 + 1}"
        pod["status"] = {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ],
            "hostIP": "10.0.0.10",
            "hostIPs": [{"ip": "10.0.0.10"}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": started,
            "containerStatuses": [
                {
                    "name": c.get("name"),
                    "state": {"running": {"startedAt": started}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": 0,
                    "image": c.get("image"),
                    "imageID": f"kubesim://{c.get('image')}",
                    "containerID": f"kubesim://{uuid.uuid4().hex}",
                    "started": True,
                }
                for c in spec.get("containers") or []
            ],
            "qosClass": "BestEffort",
        }

    def _after(self, rtype: ResourceType, event: str, obj: dict[str, Any]) -> None:
        if rtype.key == NAMESPACES and event == "ADDED":
            ns = obj["metadata"]["name"]
            if self.store.get(SERVICEACCOUNTS, ns, "default") is None:
                sa_type = self.registry.by_key(*SERVICEACCOUNTS)
                assert sa_type is not None
                self.create(sa_type, ns, {"metadata": {"name": "default"}})
        if rtype.key == CRD_KEY and event != "DELETED":
            self.registry.set_crd(obj)
        for hook in self.after_write:
            hook(rtype, event, obj)

    def _drop_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        key = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
        for obj in self.store.list(key):
            meta = obj["metadata"]
            self.store.delete(key, meta.get("namespace", ""), meta["name"])
        self.registry.remove_crd(crd["metadata"]["name"])
