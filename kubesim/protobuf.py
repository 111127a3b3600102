"""Decode the Kubernetes protobuf request bodies kubectl sends for built-in types.

kubectl (1.32) writes typed objects (`kubectl create configmap|secret|serviceaccount|namespace|
role|rolebinding|service|token`, `kubectl auth whoami|can-i`) as
`application/vnd.kubernetes.protobuf`: the magic `k8s\\0`, then a `runtime.Unknown` envelope
(typeMeta, raw) whose raw bytes are the object in the field numbering of k8s.io/api's
generated.proto. kubesim decodes the kinds listed in `KINDS` into the same dict the JSON body
would give; other kinds raise `UnsupportedKind` (answered with 415). Responses stay JSON, which
clients accept.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"


class UnsupportedKind(ValueError):
    pass


# A schema maps field number -> (json name, type, subschema or None, repeated).
Schema = dict[int, tuple[str, str, Any, bool]]


def _f(
    name: str, kind: str = "string", sub: Any = None, repeated: bool = False
) -> tuple[str, str, Any, bool]:
    return (name, kind, sub, repeated)


TIME: Schema = {}  # decoded specially
OWNER_REF: Schema = {
    1: _f("kind"),
    3: _f("name"),
    4: _f("uid"),
    5: _f("apiVersion"),
    6: _f("controller", "bool"),
    7: _f("blockOwnerDeletion", "bool"),
}
OBJECT_META: Schema = {
    1: _f("name"),
    2: _f("generateName"),
    3: _f("namespace"),
    5: _f("uid"),
    6: _f("resourceVersion"),
    7: _f("generation", "int"),
    8: _f("creationTimestamp", "time"),
    11: _f("labels", "map"),
    12: _f("annotations", "map"),
    13: _f("ownerReferences", "msg", OWNER_REF, True),
    14: _f("finalizers", "string", None, True),
}
OBJECT_REF: Schema = {
    1: _f("kind"),
    2: _f("namespace"),
    3: _f("name"),
    4: _f("uid"),
    5: _f("apiVersion"),
}
LOCAL_REF: Schema = {1: _f("name")}
INT_OR_STRING: Schema = {1: _f("type", "int"), 2: _f("intVal", "int"), 3: _f("strVal")}
POLICY_RULE: Schema = {
    1: _f("verbs", "string", None, True),
    2: _f("apiGroups", "string", None, True),
    3: _f("resources", "string", None, True),
    4: _f("resourceNames", "string", None, True),
    5: _f("nonResourceURLs", "string", None, True),
}
SUBJECT: Schema = {1: _f("kind"), 2: _f("apiGroup"), 3: _f("name"), 4: _f("namespace")}
ROLE_REF: Schema = {1: _f("apiGroup"), 2: _f("kind"), 3: _f("name")}
LABEL_SELECTOR_REQ: Schema = {
    1: _f("key"),
    2: _f("operator"),
    3: _f("values", "string", None, True),
}
LABEL_SELECTOR: Schema = {
    1: _f("matchLabels", "map"),
    2: _f("matchExpressions", "msg", LABEL_SELECTOR_REQ, True),
}
AGGREGATION_RULE: Schema = {1: _f("clusterRoleSelectors", "msg", LABEL_SELECTOR, True)}
SERVICE_PORT: Schema = {
    1: _f("name"),
    2: _f("protocol"),
    3: _f("port", "int"),
    4: _f("targetPort", "intstr", INT_OR_STRING),
    5: _f("nodePort", "int"),
    6: _f("appProtocol"),
}
SERVICE_SPEC: Schema = {
    1: _f("ports", "msg", SERVICE_PORT, True),
    2: _f("selector", "map"),
    3: _f("clusterIP"),
    4: _f("type"),
    5: _f("externalIPs", "string", None, True),
    7: _f("sessionAffinity"),
    11: _f("externalName"),
}
RESOURCE_ATTRS: Schema = {
    1: _f("namespace"),
    2: _f("verb"),
    3: _f("group"),
    4: _f("version"),
    5: _f("resource"),
    6: _f("subresource"),
    7: _f("name"),
}
NON_RESOURCE_ATTRS: Schema = {1: _f("path"), 2: _f("verb")}
EXTRA_VALUE: Schema = {1: _f("items", "string", None, True)}
BOUND_REF: Schema = {1: _f("kind"), 2: _f("apiVersion"), 3: _f("name"), 4: _f("uid")}

_META = {1: _f("metadata", "msg", OBJECT_META)}
KINDS: dict[tuple[str, str], Schema] = {
    ("v1", "ConfigMap"): {
        **_META,
        2: _f("data", "map"),
        3: _f("binaryData", "map_bytes"),
        4: _f("immutable", "bool"),
    },
    ("v1", "Secret"): {
        **_META,
        2: _f("data", "map_bytes"),
        3: _f("type"),
        4: _f("stringData", "map"),
        5: _f("immutable", "bool"),
    },
    ("v1", "ServiceAccount"): {
        **_META,
        2: _f("secrets", "msg", OBJECT_REF, True),
        3: _f("imagePullSecrets", "msg", LOCAL_REF, True),
        4: _f("automountServiceAccountToken", "bool"),
    },
    ("v1", "Namespace"): {
        **_META,
        2: _f("spec", "msg", {1: _f("finalizers", "string", None, True)}),
    },
    ("v1", "Service"): {**_META, 2: _f("spec", "msg", SERVICE_SPEC)},
    ("v1", "DeleteOptions"): {
        1: _f("gracePeriodSeconds", "int"),
        2: _f("preconditions", "msg", {1: _f("uid"), 2: _f("resourceVersion")}),
        3: _f("orphanDependents", "bool"),
        4: _f("propagationPolicy"),
        5: _f("dryRun", "string", None, True),
    },
    ("authentication.k8s.io/v1", "TokenRequest"): {
        **_META,
        2: _f(
            "spec",
            "msg",
            {
                1: _f("audiences", "string", None, True),
                4: _f("expirationSeconds", "int"),
                3: _f("boundObjectRef", "msg", BOUND_REF),
            },
        ),
    },
    ("authentication.k8s.io/v1", "TokenReview"): {
        **_META,
        2: _f("spec", "msg", {1: _f("token"), 2: _f("audiences", "string", None, True)}),
    },
    ("authentication.k8s.io/v1", "SelfSubjectReview"): dict(_META),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): {
        **_META,
        2: _f(
            "spec",
            "msg",
            {
                1: _f("resourceAttributes", "msg", RESOURCE_ATTRS),
                2: _f("nonResourceAttributes", "msg", NON_RESOURCE_ATTRS),
            },
        ),
    },
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): {
        **_META,
        2: _f("spec", "msg", {1: _f("namespace")}),
    },
    ("authorization.k8s.io/v1", "SubjectAccessReview"): {
        **_META,
        2: _f(
            "spec",
            "msg",
            {
                1: _f("resourceAttributes", "msg", RESOURCE_ATTRS),
                2: _f("nonResourceAttributes", "msg", NON_RESOURCE_ATTRS),
                3: _f("user"),
                4: _f("groups", "string", None, True),
                5: _f("extra", "map_extra"),
                6: _f("uid"),
            },
        ),
    },
    ("rbac.authorization.k8s.io/v1", "Role"): {**_META, 2: _f("rules", "msg", POLICY_RULE, True)},
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): {
        **_META,
        2: _f("rules", "msg", POLICY_RULE, True),
        3: _f("aggregationRule", "msg", AGGREGATION_RULE),
    },
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): {
        **_META,
        2: _f("subjects", "msg", SUBJECT, True),
        3: _f("roleRef", "msg", ROLE_REF),
    },
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): {
        **_META,
        2: _f("subjects", "msg", SUBJECT, True),
        3: _f("roleRef", "msg", ROLE_REF),
    },
}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) for every field of one message."""
    out = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ValueError("truncated field")
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _map_entry(raw: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, _, v in _fields(raw):
        if number == 1:
            key = v.decode()
        elif number == 2:
            value = v
    return key, value


def decode_message(buf: bytes, schema: Schema) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, _wire, value in _fields(buf):
        if number not in schema:
            continue
        name, kind, sub, repeated = schema[number]
        if kind == "string":
            item: Any = value.decode()
        elif kind == "int":
            item = _signed(value)
        elif kind == "bool":
            item = bool(value)
        elif kind == "msg":
            item = decode_message(value, sub)
        elif kind == "intstr":
            ios = decode_message(value, sub)
            item = ios.get("strVal", "") if ios.get("type") == 1 else ios.get("intVal", 0)
        elif kind == "time":
            t = {n: v for n, _, v in _fields(value)}
            item = (
                datetime.fromtimestamp(_signed(t.get(1, 0)), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                if t.get(1)
                else None
            )
        elif kind in ("map", "map_bytes", "map_extra"):
            k, v = _map_entry(value)
            target = out.setdefault(name, {})
            if kind == "map":
                target[k] = v.decode()
            elif kind == "map_bytes":
                target[k] = base64.b64encode(v).decode()
            else:
                target[k] = decode_message(v, EXTRA_VALUE).get("items", [])
            continue
        else:
            continue
        if repeated:
            out.setdefault(name, []).append(item)
        elif item is not None and item != "" and not (kind == "int" and item == 0):
            out[name] = item
    return out


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded Kubernetes object as the dict its JSON form would give."""
    if not body.startswith(MAGIC):
        raise ValueError("protobuf body without the k8s\\0 prefix")
    api_version = kind = ""
    raw = b""
    for number, _, value in _fields(body[len(MAGIC) :]):
        if number == 1:
            for n, _, v in _fields(value):
                if n == 1:
                    api_version = v.decode()
                elif n == 2:
                    kind = v.decode()
        elif number == 2:
            raw = value
    schema = KINDS.get((api_version, kind))
    if schema is None:
        raise UnsupportedKind(f"{api_version}, Kind={kind}")
    obj = decode_message(raw, schema)
    obj["apiVersion"], obj["kind"] = api_version, kind
    return obj
