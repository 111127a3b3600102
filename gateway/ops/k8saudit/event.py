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

import functools
import json
import time
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii as _string
from typing import Any

from gateway.wire.requestinfo import RequestInfo
from gateway.wire.status import status_object

RESPONSE_STARTED = "ResponseStarted"
RESPONSE_COMPLETE = "ResponseComplete"
CLUSTER_ANNOTATION = "hubproxy.dev/cluster"
NO_USER = "{}"  # a request refused before a user was known, as kube-apiserver writes it

_second: tuple[int, str] = (-1, "")


def micro_time(when: float) -> str:
    """RFC 3339 in UTC with microseconds, as Kubernetes' ``MicroTime``."""
    global _second
    whole = int(when)
    if _second[0] != whole:  # one strftime per second, not per event
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{_second[1]}.{min(999999, round((when - whole) * 1e6)):06d}Z"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


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


@functools.lru_cache(maxsize=4096)  # requests repeat their paths: a controller's, a kubectl's
def _object_ref_field(info: RequestInfo) -> str:
    ref = object_ref(info)
    return "" if ref is None else ',"objectRef":' + _json(ref)


def user_json(username: str, uid: str = "", groups: Sequence[str] = (),
              extra: Mapping[str, Sequence[str]] | None = None) -> str:
    """The ``user`` field (``authentication.k8s.io/v1`` ``UserInfo``, empty fields left out)
    as JSON; callers keep it for as long as they keep the user."""
    user: dict[str, Any] = {"username": username}
    if uid:
        user["uid"] = uid
    if groups:
        user["groups"] = list(groups)
    if extra:
        user["extra"] = {key: list(values) for key, values in extra.items()}
    return _json(user)


@functools.lru_cache(maxsize=64)
def _success(code: int) -> str:
    return _json({"metadata": {}, "code": code})


def response_status(code: int, message: str | None = None) -> str:
    """``responseStatus`` as JSON: the code; with the gateway's own refusal message, its
    ``Status`` (kind and apiVersion left out, as kube-apiserver does)."""
    if message is None:
        return _success(code)
    status = status_object(code, message)
    del status["kind"], status["apiVersion"]
    return _json(status)


@functools.lru_cache(maxsize=4096)
def _source_ips(ips: tuple[str, ...]) -> str:
    return _json(list(ips))


@functools.lru_cache(maxsize=1024)
def _user_agent_field(user_agent: str) -> str:
    return ',"userAgent":' + _string(user_agent) if user_agent else ""


@functools.lru_cache(maxsize=4096)
def _annotations_field(cluster: str) -> str:
    return ',"annotations":' + _json({CLUSTER_ANNOTATION: cluster}) if cluster else ""


_HEAD = '{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":'


def event_line(*, audit_id: str, stage: str, request_uri: str, info: RequestInfo, user: str,
               source_ips: tuple[str, ...], user_agent: str, status: str, received: float,
               now: float, cluster: str) -> str:
    """The event as one compact JSON line (no newline), fields in kube-apiserver's order.

    ``user`` and ``status`` are JSON (:func:`user_json`, :data:`NO_USER`,
    :func:`response_status`); ``user_agent`` "" and ``cluster`` "" leave their fields out. Built
    from cached pieces: the parts that repeat (a user, a path, an address) are encoded once."""
    return "".join((
        _HEAD, _string(audit_id), ',"stage":', _string(stage), ',"requestURI":',
        _string(request_uri), ',"verb":', _string(info.verb), ',"user":', user,
        ',"sourceIPs":', _source_ips(source_ips), _user_agent_field(user_agent),
        _object_ref_field(info), ',"responseStatus":', status,
        ',"requestReceivedTimestamp":"', micro_time(received), '","stageTimestamp":"',
        micro_time(now), '"', _annotations_field(cluster), "}"))
