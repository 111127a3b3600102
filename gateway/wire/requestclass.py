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

How the request line is read is :mod:`gateway.wire.requestinfo`'s (kube-apiserver's
``RequestInfo``, also the verb of the gateway's Kubernetes audit events): one reading for both.
Pure and cheap on the common request: a target with no ``/watch/`` or ``%`` in its path and no
parameter that is or may decode to ``watch`` or ``follow`` is ``short`` after a few substring
tests. :func:`request_class` takes the API target (path and query after ``/<cluster>``, not
decoded: as it is forwarded); :func:`front_door_class` the client's whole ``/<cluster>/...``
target. The gateway's own Service form (``.../services/<svc>:<port>/proxy-service/...``) reads
as a request for a named object, so only its upgrades are long-running.
"""

from __future__ import annotations

from gateway.wire.requestinfo import query_flag, request_info

SHORT = "short"
WATCH = "watch"
STREAM = "stream"
CLASSES = (SHORT, WATCH, STREAM)


def request_class(target: bytes, upgrade: bool = False, method: bytes = b"GET") -> str:
    """``short``, ``watch`` or ``stream`` for ``method target`` (the API path and query, as
    forwarded); ``upgrade``: the request asks for a protocol upgrade the gateway allowed."""
    if upgrade:
        return STREAM
    path, _, query = target.partition(b"?")
    if b"/watch/" not in path and b"%" not in path and (
            not query or (b"watch" not in query and b"follow" not in query
                          and (b"%" not in query or not _escaped_name(query)))):
        return SHORT
    info = request_info(method, target)
    if info.verb == "watch":
        return WATCH
    if info.verb == "get" and info.subresource == "log" and info.resource == "pods" \
            and query_flag(query, b"follow"):
        return STREAM
    return SHORT


def front_door_class(target: bytes, upgrade: bool = False, method: bytes = b"GET") -> str:
    """:func:`request_class` of a front-door target ``/<cluster>/<api path>``."""
    slash = target.find(b"/", 1)
    return request_class(target[slash:] if slash > 0 else b"/", upgrade, method)


def is_long_running(target: bytes, upgrade: bool = False, method: bytes = b"GET") -> bool:
    """Whether :func:`request_class` is ``watch`` or ``stream``."""
    return request_class(target, upgrade, method) != SHORT


def _escaped_name(query: bytes) -> bool:
    """Whether a parameter name is percent-encoded (``wat%63h`` is ``watch`` once decoded)."""
    return any(b"%" in pair.partition(b"=")[0] for pair in query.split(b"&"))
