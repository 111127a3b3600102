"""Which kind of request is this: ``short``, ``watch`` or ``stream``? From the target alone.

Kubernetes serves two kinds of requests: short ones, which kube-apiserver itself cuts off after
its request timeout (60 s), and long-running ones, which may last hours. The gateway needs the
same split twice: the response-header timeout applies to short requests only, and latency
histograms are kept per class (a watch's duration says nothing about the apiserver's speed).

* ``watch``: ``?watch=1``/``?watch=true`` or the legacy ``/api/v1/watch/...`` and
  ``/apis/<group>/<version>/watch/...`` paths;
* ``stream``: upgrades (exec, attach, port-forward over WebSocket/SPDY) and ``?follow=1``/
  ``?follow=true`` (``logs -f``);
* ``short``: everything else.

Pure and allocation-light: this runs once per request on the event loop. ``request_class``
takes the API target (path and query after ``/<cluster>``, not decoded: as it is forwarded);
``front_door_class`` the client's whole ``/<cluster>/...`` target.
"""

from __future__ import annotations

SHORT = "short"
WATCH = "watch"
STREAM = "stream"
CLASSES = (SHORT, WATCH, STREAM)

_TRUE = (b"1", b"true")


def _flag(query: bytes, name: bytes) -> bool:
    """Is the first ``name=`` parameter ``1``/``true``? The first, as Go's ``url.Values.Get``
    (and so kube-apiserver) reads it."""
    for pair in query.split(b"&"):
        key, _, value = pair.partition(b"=")
        if key == name:
            return value.lower() in _TRUE
    return False


def _legacy_watch_path(path: bytes) -> bool:
    # /api/v1/watch/... or /apis/<group>/<version>/watch/...
    parts = path.split(b"/", 5)
    if len(parts) > 3 and parts[1] == b"api":
        return parts[3] == b"watch"
    return len(parts) > 4 and parts[1] == b"apis" and parts[4] == b"watch"


def request_class(target: bytes, upgrade: bool = False) -> str:
    """``short``, ``watch`` or ``stream`` for a request to ``target`` (path and query)."""
    if upgrade:
        return STREAM
    path, _, query = target.partition(b"?")
    if query:
        if b"watch=" in query and _flag(query, b"watch"):
            return WATCH
        if b"follow=" in query and _flag(query, b"follow"):
            return STREAM
    if b"/watch/" in path and _legacy_watch_path(path):
        return WATCH
    return SHORT


def front_door_class(target: bytes, upgrade: bool = False) -> str:
    """:func:`request_class` of a front-door target ``/<cluster>/<api path>``."""
    slash = target.find(b"/", 1)
    return request_class(target[slash:] if slash > 0 else b"/", upgrade)
