"""One request's ``audit.k8s.io/v1`` ``Event``, as kube-apiserver writes it (pure formatting).

Field names, order and formats are kube-apiserver's (compared with a real one's log in
tests/realkube/test_kube_audit.py)::

    {"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"<id>",
     "stage":"ResponseComplete","requestURI":"/c1/api/v1/namespaces/team/pods?watch=1",
     "verb":"watch","user":{"username":"...","uid":"...","groups":[...],"extra":{...}},
     "sourceIPs":["203.0.113.7","10.0.0.5"],"userAgent":"kubectl/v1.36.0 ...",
     "objectRef":{"resource":"pods","namespace":"team","apiVersion":"v1"},
     "responseStatus":{"metadata":{},"code":200},
     "requestReceivedTimestamp":"2026-11-27T10:20:25.443978Z",
     "stageTimestamp":"2026-11-27T10:20:26.444814Z",
     "annotations":{"hubproxy.dev/cluster":"c1"}}

* ``stage``: ``ResponseStarted`` when a long-running request's response began (a watch,
  ``logs -f``, an upgrade), ``ResponseComplete`` when any request ended (kube-apiserver's
  stages; ``RequestReceived`` is omitted, as most policies omit it).
* ``user``: the hub user the token stood for (``{}`` when the request was refused before
  one was known, as kube-apiserver writes a failed authentication).
* ``responseStatus``: ``{"metadata":{},"code":N}``; for a request the gateway refused itself,
  also ``status``, ``message`` and ``reason`` of the ``Status`` it answered.
* Never a token: the caller passes the request URI already redacted
  (``gateway.ops.audit.redact_target``), a user agent that does not contain the token, and no
  body (``level`` is never above ``Metadata``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.wire.requestinfo import RequestInfo
from gateway.wire.status import status_object

RESPONSE_STARTED = "ResponseStarted"
RESPONSE_COMPLETE = "ResponseComplete"
CLUSTER_ANNOTATION = "hubproxy.dev/cluster"

_second: tuple[int, str] = (-1, "")


def micro_time(when: float) -> str:
    """RFC 3339 in UTC with microseconds, as Kubernetes' ``MicroTime``."""
    global _second
    whole = int(when)
    if _second[0] != whole:  # one strftime per second, not per event
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{_second[1]}.{min(999999, round((when - whole) * 1e6)):06d}Z"


def object_ref(info: RequestInfo) -> dict[str, str] | None:
    """kube-apiserver's ``objectRef`` for a resource request (empty fields left out)."""
    if not info.is_resource:
        return None
    ref: dict[str, str] = {}
    for key, value in (("resource", info.resource), ("namespace", info.namespace),
                       ("name", info.name), ("apiGroup", info.api_group),
                       ("apiVersion", info.api_version), ("subresource", info.subresource)):
        if value:
            ref[key] = value
    return ref


def user_info(username: str, uid: str = "", groups: Sequence[str] = (),
              extra: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The ``user`` field (``authentication.k8s.io/v1`` ``UserInfo``, empty fields left out)."""
    user: dict[str, Any] = {"username": username}
    if uid:
        user["uid"] = uid
    if groups:
        user["groups"] = list(groups)
    if extra:
        user["extra"] = {key: list(values) for key, values in extra.items()}
    return user


def response_status(code: int, message: str | None = None) -> dict[str, Any]:
    """``responseStatus``: the code; with the gateway's own refusal message, its ``Status``."""
    if message is None:
        return {"metadata": {}, "code": code}
    status = status_object(code, message)
    del status["kind"], status["apiVersion"]
    return status


def event_line(*, audit_id: str, stage: str, request_uri: str, verb: str,
               user: Mapping[str, Any] | None, source_ips: Sequence[str],
               user_agent: str | None, info: RequestInfo, status: Mapping[str, Any],
               received: float, now: float, annotations: Mapping[str, str]) -> str:
    """The event as one compact JSON line (no newline)."""
    event: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": audit_id,
        "stage": stage,
        "requestURI": request_uri,
        "verb": verb,
        "user": user or {},
        "sourceIPs": list(source_ips),
    }
    if user_agent:
        event["userAgent"] = user_agent
    ref = object_ref(info)
    if ref is not None:
        event["objectRef"] = ref
    event["responseStatus"] = status
    event["requestReceivedTimestamp"] = micro_time(received)
    event["stageTimestamp"] = micro_time(now)
    if annotations:
        event["annotations"] = dict(annotations)
    return json.dumps(event, separators=(",", ":"), ensure_ascii=True)
