"""Is a request long-running, and how: ``short``, ``watch`` or ``stream``? One rule for the
whole gateway, read from the request line as kube-apiserver reads it.

A long-running request is one the server holds open until someone ends it: a watch, a
``logs -f``, an upgraded exec/attach/port-forward. Everything in the gateway that treats those
differently asks :func:`request_class`: admission (a per-identity stream slot instead of a
fair-queuing seat, ``gateway.hub.admission.chain``), the response-header timeout and the audit
line's ``stream_start``/``stream_end`` (``gateway.hub.request``), the latency histograms
(one per class), and the agent's choice of HTTP/2 for its apiserver connection. Were they to
disagree, a request could take a stream slot yet be cut off as a short one, or dodge the stream
cap by a spelling the gateway misreads and the apiserver does not.

What starts a watch or a follow on kube-apiserver (v1.36, observed on the real server by
``tests/realkube/test_long_running.py``: the audit verb, whether it writes the
``ResponseStarted`` event it keeps for long-running requests, and the query it sends the
kubelet for a pod's log):

=================================================================  ===========================
request                                                            kube-apiserver
=================================================================  ===========================
``GET <collection>?watch=V``, V one of ``1 t T true True TRUE``    watch
``tRuE yes y on 2 00 f F no``, empty (``watch=``), bare ``watch``  watch (!)
``GET <collection>?watch=V``, V one of ``0 false FALSE False``     list
(``false`` in any case, even ``fal%C5%BFe``: Go's EqualFold)
``watch=false&watch=true`` / ``watch=true&watch=false``            list / watch (first wins)
``wat%63h=true``, ``watch=%74rue`` / ``watch=fals%65``             watch / list (decoded)
``watch=false+`` (a space after it), ``watch=%20``                 watch (not ``false``)
``watch=true;x=1``, ``watch=%zz`` (a pair Go cannot parse)         list (the pair is skipped)
``watch=%zz&watch=true``, ``watch=false;&watch=true``              watch (first valid pair)
``WATCH=true``, ``Watch=true``                                     list (names are exact)
``GET <object>?watch=1``: ``configmaps/x``, ``namespaces/x``,      get: no watch
``pods/x/status``
``HEAD <collection>?watch=1``                                      watch (answered 405)
``POST`` / ``DELETE <collection>?watch=true``                      create / deletecollection
``/api/v1/watch/...``, ``/apis/<g>/<v>/watch/...``: any method,    watch (a POST gets 405)
named or not, whatever the query (``?watch=false`` too)
``/api/v1/w%61tch/configmaps``, ``configm%61ps?watch=1``           watch (the path is decoded)
``/api/v1?watch=1``, ``/apis/apps/v1?watch=1``, ``/version?...``   get (no resource)
``GET pods/<name>/log?follow=V``                                   follow for the V that watch
                                                                   takes, first value, decoded
``follow=true`` anywhere else (a collection, another object)       no follow
=================================================================  ===========================

One difference is on purpose: kube-apiserver's ``LongRunningFunc`` also exempts *every*
``log``, ``exec``, ``attach``, ``portforward`` and ``proxy`` subresource request from its
request timeout (a ``pods/x/log`` without ``follow`` gets a ``ResponseStarted`` event too).
Here a log without ``follow`` is ``short``: it ends on its own once the kubelet has sent the
log, so it takes a fair-queuing seat, not a stream slot, and a gateway shutdown lets it finish
instead of ending it early like a watch. Upgrades (exec, attach, port-forward, a Service's
WebSocket) are ``stream``: they need the ``Upgrade`` the gateway checked, not the path.

The classes: ``watch`` for watches; ``stream`` for upgrades and ``logs -f``; ``short`` for the
rest, which kube-apiserver cuts off after its request timeout.

Pure and cheap on the common request: a target whose path has no ``/watch/`` and whose query
has neither ``watch``, ``follow`` nor ``%`` is ``short`` after a few substring tests.
:func:`request_class` takes the API target (path and query after ``/<cluster>``, not decoded:
as it is forwarded); :func:`front_door_class` the client's whole ``/<cluster>/...`` target.
The gateway's own Service form (``.../services/<svc>:<port>/proxy-service/...``) reads as a
request for a named object, so only its upgrades are long-running.
"""

from __future__ import annotations

SHORT = "short"
WATCH = "watch"
STREAM = "stream"
CLASSES = (SHORT, WATCH, STREAM)

_HEX = frozenset(b"0123456789abcdefABCDEF")
# RequestInfo's namespace subresources: /namespaces/<ns>/status is the namespace's, not a
# resource named "status".
_NAMESPACE_SUBRESOURCES = (b"status", b"finalize")
_GET = (b"GET", b"HEAD")


def request_class(target: bytes, upgrade: bool = False, method: bytes = b"GET") -> str:
    """``short``, ``watch`` or ``stream`` for ``method target`` (the API path and query, as
    forwarded); ``upgrade``: the request asks for a protocol upgrade the gateway allowed."""
    if upgrade:
        return STREAM
    path, _, query = target.partition(b"?")
    if b"%" in path:
        path = _unescape(path, plus_is_space=False) or path
    if b"/watch/" not in path and (not query or (b"watch" not in query and b"follow" not in query
                                                 and b"%" not in query)):
        return SHORT
    rest = _resource_parts(path)
    if rest is None:
        return SHORT
    if rest[0] == b"watch":  # the legacy watch path: the verb, whatever the method or query
        return WATCH if len(rest) > 1 else SHORT  # (nothing after it: an error there)
    if rest[0] == b"proxy" or method not in _GET:  # the legacy proxy verb; not a get
        return SHORT
    if rest[0] == b"namespaces" and len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
        rest = rest[2:]
    if len(rest) == 1:  # a collection: a list, or a watch
        return WATCH if _is_true(query, b"watch") else SHORT
    if len(rest) > 2 and rest[0] == b"pods" and rest[2] == b"log":
        return STREAM if _is_true(query, b"follow") else SHORT
    return SHORT


def front_door_class(target: bytes, upgrade: bool = False, method: bytes = b"GET") -> str:
    """:func:`request_class` of a front-door target ``/<cluster>/<api path>``."""
    slash = target.find(b"/", 1)
    return request_class(target[slash:] if slash > 0 else b"/", upgrade, method)


def is_long_running(target: bytes, upgrade: bool = False, method: bytes = b"GET") -> bool:
    """Whether :func:`request_class` is ``watch`` or ``stream``."""
    return request_class(target, upgrade, method) != SHORT


def _resource_parts(path: bytes) -> list[bytes] | None:
    """What kube-apiserver's RequestInfo reads after ``/api/<version>`` or
    ``/apis/<group>/<version>`` of a resource request (None: not one)."""
    parts = path.strip(b"/").split(b"/")
    if len(parts) < 3:
        return None
    if parts[0] == b"api":
        return parts[2:]
    if parts[0] == b"apis" and len(parts) > 3:
        return parts[3:]
    return None


def _is_true(query: bytes, name: bytes) -> bool:
    """The first value of ``name`` as a bool the way kube-apiserver converts query parameters
    (``runtime.Convert_Slice_string_To_bool``): absent, ``0`` or ``false`` in any case (Go's
    ``strings.EqualFold``) is false, anything else, the empty string included, is true."""
    value = _first_value(query, name)
    if value is None:
        return False
    # EqualFold with "false": ASCII case, and U+017F (long s) folds to "s".
    return value != b"0" and value.replace(b"\xc5\xbf", b"s").lower() != b"false"


def _first_value(query: bytes, name: bytes) -> bytes | None:
    """The first value of parameter ``name`` as Go's ``url.ParseQuery`` reads the query: pairs
    split at ``&``, a pair with a ``;`` or a bad escape ignored, names and values decoded."""
    for pair in query.split(b"&"):
        if not pair or b";" in pair:
            continue
        key, _, value = pair.partition(b"=")
        if key != name and ((b"%" not in key and b"+" not in key)
                            or _unescape(key, plus_is_space=True) != name):
            continue
        if b"%" in value or b"+" in value:
            decoded = _unescape(value, plus_is_space=True)
            if decoded is None:
                continue
            value = decoded
        return value
    return None


def _unescape(text: bytes, *, plus_is_space: bool) -> bytes | None:
    """Percent-decoding (and ``+`` as a space in a query); None for a malformed escape."""
    if plus_is_space:
        text = text.replace(b"+", b" ")
    pieces = text.split(b"%")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if len(piece) < 2 or piece[0] not in _HEX or piece[1] not in _HEX:
            return None
        out.append(bytes((int(piece[:2], 16),)))
        out.append(piece[2:])
    return b"".join(out)
