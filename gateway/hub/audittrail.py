"""A request's audit trail: the gateway's JSON line and, opt-in, Kubernetes audit events.

Both front doors report each request once when it ends (and a long-running one also when its
response starts) through :class:`AuditTrail`, which writes:

* the gateway's own JSON line (``gateway.ops.audit``; on unless ``--audit-log-path -`` puts
  Kubernetes events on stdout in its place), now with ``client`` (the real client, see
  ``gateway.hub.admission.forwarded``) and, behind trusted proxies, ``proxies``;
* with ``--audit-log-path`` or ``--audit-webhook-config-file``, an ``audit.k8s.io/v1`` ``Event``
  per stage (``gateway.ops.k8saudit``): ``ResponseStarted`` for watches, ``logs -f`` and
  upgrades, ``ResponseComplete`` for every request, when the policy's level for it is
  ``Metadata``. ``auditID`` is the gateway's request id (the one the managed apiserver gets as
  ``Audit-ID``), ``requestURI`` the URI the client sent (``/<cluster>/...``, credential-like
  query values redacted), ``verb`` and ``objectRef`` read from the path after ``/<cluster>`` as
  kube-apiserver reads it, ``user`` the hub user, ``sourceIPs`` the real client then the
  proxies it came through, and the cluster as the annotation ``hubproxy.dev/cluster``.

Never a token: the user agent of a request that was refused before admission is dropped when
it contains the request's own credential (an admitted request's cannot: admission refuses a
token copied into another header), and credential-shaped strings are scrubbed from it.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Sequence
from typing import Protocol

from gateway.hub.admission.auth import UserInfo
from gateway.hub.admission.bearer import BearerError, extract_token
from gateway.hub.admission.chain import MIN_TOKEN_TO_SEARCH, Admitted
from gateway.hub.admission.routing import RouteError, route
from gateway.ops import audit, startup
from gateway.ops.k8saudit import event as k8s
from gateway.ops.k8saudit.backends import (
    LogBackend,
    WebhookBackend,
    WebhookSettings,
    kubeconfig_sender,
)
from gateway.ops.k8saudit.policy import AUDIT_EVERYTHING, NONE, Policy, PolicyError, load_policy
from gateway.ops.version import version
from gateway.wire.http1 import RequestHead
from gateway.wire.requestinfo import request_info
from gateway.wire.status import scrub


class EventBackend(Protocol):
    """Where Kubernetes events go (``gateway.ops.k8saudit.backends``)."""

    name: str
    events: int

    def emit(self, line: str) -> None: ...

    def start(self) -> None: ...

    async def close(self, timeout: float = 5.0) -> None: ...

    def dropped(self) -> dict[str, int]: ...


class KubeAudit:
    """The Kubernetes-format half of the trail: a policy and its backends (a log, a webhook,
    or both, as kube-apiserver allows)."""

    def __init__(self, backends: Sequence[EventBackend], policy: Policy = AUDIT_EVERYTHING
                 ) -> None:
        self.backends = tuple(backends)
        self.policy = policy
        self._users: dict[int, tuple[UserInfo, str]] = {}

    def event(self, stage: str, *, request_id: str, head: RequestHead | None,
              admitted: Admitted | None, user: UserInfo | None, status: int,
              message: str | None, source_ips: tuple[str, ...], received: float,
              now: float) -> None:
        target = head.target if head is not None else b"/"
        cluster, rest = _cluster_and_rest(target, admitted)
        info = _request_info(head.method if head is not None else b"GET", rest)
        level = self.policy.level(user.username if user else "", user.groups if user else (),
                                  cluster, info.verb)
        if level == NONE:
            return
        line = k8s.event_line(
            audit_id=request_id, stage=stage, request_uri=audit.redact_target(target),
            info=info, user=self._user_json(user), source_ips=source_ips,
            user_agent=_user_agent(head, admitted), status=k8s.response_status(status, message),
            received=received, now=now, cluster=cluster)
        for backend in self.backends:
            backend.emit(line)

    def _user_json(self, user: UserInfo | None) -> str:
        """The user's JSON, encoded once per user object (the authenticator caches them)."""
        if user is None:
            return k8s.NO_USER
        cached = self._users.get(id(user))
        if cached is not None and cached[0] is user:
            return cached[1]
        if len(self._users) >= USERS_CACHED:
            self._users.clear()
        encoded = k8s.user_json(user.username, user.uid, user.groups, user.extra)
        self._users[id(user)] = (user, encoded)
        return encoded


def _cluster_and_rest(target: bytes, admitted: Admitted | None) -> tuple[str, bytes]:
    """The cluster (admitted, else routed; "" for a path that is not a route) and the target
    after its ``/<cluster>`` prefix, which is what kube-apiserver would have seen."""
    if admitted is not None:
        return admitted.cluster, target[len(admitted.cluster) + 1:] or b"/"
    try:
        cluster = route(target).cluster
    except RouteError:
        return "", b"/"
    return cluster, target[len(cluster) + 1:] or b"/"


# Request facts that repeat from request to request, kept once (bounded).
_request_info = functools.lru_cache(maxsize=4096)(request_info)
USERS_CACHED = 4096


@functools.lru_cache(maxsize=1024)
def _clean(user_agent: bytes) -> str:
    return scrub(user_agent.decode("latin-1"))


def _user_agent(head: RequestHead | None, admitted: Admitted | None) -> str:
    """The client's User-Agent, scrubbed ("" for none)."""
    if admitted is not None:
        value = admitted.user_agent
    elif head is not None and head.headers:
        value = head.get(b"user-agent") or b""
        if value and _carries_credential(head, value):
            return audit.REDACTED
    else:
        value = b""
    return _clean(value) if value else ""


def _carries_credential(head: RequestHead, value: bytes) -> bool:
    """Whether ``value`` contains the request's bearer token (or, when the credentials are
    malformed, any long word of its Authorization headers)."""
    secrets = [part for v in head.get_all(b"authorization") for part in v.split()
               if len(part) >= MIN_TOKEN_TO_SEARCH]
    try:
        token = extract_token(head.headers).token
    except BearerError:
        token = None
    if token is not None and len(token) >= MIN_TOKEN_TO_SEARCH:
        secrets.append(token.encode("utf-8", "replace"))
    return any(secret in value for secret in secrets)


class AuditTrail:
    """Both audit formats for the gateway process; see the module docstring."""

    def __init__(self, *, lines: bool, kube: KubeAudit | None = None) -> None:
        self.lines = lines  # the gateway's JSON line (hubproxy.audit enabled, not replaced)
        self.kube = kube
        # Wall clock = monotonic + this: a request's received time, taken from its monotonic
        # start, is then the same in both of its events.
        self._wall = time.time() - time.monotonic()

    def start(self) -> None:
        for backend in self.kube.backends if self.kube else ():
            backend.start()

    async def close(self, timeout: float = 5.0) -> None:
        """Flush the backends (the webhook gets up to ``timeout`` for what it holds); once."""
        kube, self.kube = self.kube, None  # later requests (a shutdown's stragglers): lines only
        for backend in kube.backends if kube else ():
            await backend.close(timeout)

    def events(self) -> dict[str, int]:
        """Events each backend wrote or delivered (metrics)."""
        return {b.name: b.events for b in self.kube.backends} if self.kube else {}

    def dropped(self) -> dict[str, int]:
        """Events each backend lost, as ``backend/reason`` (metrics)."""
        return {f"{b.name}/{reason}": count for b in (self.kube.backends if self.kube else ())
                for reason, count in b.dropped().items()}

    def request_done(self, request_id: str, head: RequestHead | None,
                     admitted: Admitted | None, status: int, bytes_in: int, bytes_out: int,
                     duration: float, stream: bool, protocol: str, source_ips: tuple[str, ...],
                     message: str | None, started: float = 0.0,
                     user_info: UserInfo | None = None,
                     line_memo: audit.LineMemo | None = None) -> None:
        """A request ended (``started``: when its head arrived, monotonic; 0 if none did;
        ``user_info``: the hub user of a request refused after authentication;
        ``line_memo``: its client connection's, see :func:`gateway.ops.audit.request_line`).
        Positional arguments welcome: the gateway calls this once per request."""
        if admitted is not None:
            user_info = admitted.user_info
        if self.lines:
            user = admitted.user if admitted else (user_info.username if user_info else "")
            client: str | None
            if len(source_ips) == 1:  # no proxy: the common case (see _addresses)
                client, proxies = source_ips[0], None
            else:
                client, proxies = _addresses(source_ips)
            audit.write(audit.request_line(
                "stream_end" if stream else "request", request_id=request_id,
                user=user or None, cluster=admitted.cluster if admitted else None,
                method=head.method if head is not None else None,
                target=head.target if head is not None else None, status=status,
                bytes_in=bytes_in, bytes_out=bytes_out, duration=duration, protocol=protocol,
                client=client, proxies=proxies, memo=line_memo))
        if self.kube is not None:
            now = time.time()
            self.kube.event(k8s.RESPONSE_COMPLETE, request_id=request_id, head=head,
                            admitted=admitted, user=user_info, status=status, message=message,
                            source_ips=source_ips,
                            received=self._wall + started if started else now - duration,
                            now=now)

    def stream_start(self, *, request_id: str, head: RequestHead, admitted: Admitted,
                     status: int, protocol: str, source_ips: tuple[str, ...],
                     started: float) -> None:
        """A long-running request's response began (``started``: its monotonic start)."""
        if self.lines:
            client, proxies = _addresses(source_ips)
            audit.stream_start(request_id=request_id, user=admitted.user or None,
                               cluster=admitted.cluster, method=head.method,
                               target=head.target, status=status, protocol=protocol,
                               client=client, proxies=proxies)  # None: left out
        if self.kube is not None:
            self.kube.event(k8s.RESPONSE_STARTED, request_id=request_id, head=head,
                            admitted=admitted, user=admitted.user_info, status=status,
                            message=None,
                            source_ips=source_ips, received=self._wall + started,
                            now=time.time())


def _addresses(source_ips: Sequence[str]) -> tuple[str | None, list[str] | None]:
    """The audit line's ``client`` and ``proxies`` (each None, and left out, when there is
    none); a tuple, not keyword arguments: this runs per request."""
    if not source_ips:
        return None, None
    if len(source_ips) == 1:
        return source_ips[0], None
    return source_ips[0], list(source_ips[1:])


async def build_audit_trail(*, lines: bool, policy_file: str | None, log_path: str | None,
                            webhook_config_file: str | None, webhook: WebhookSettings,
                            atomic: bool) -> AuditTrail:
    """The process's trail from its flags (see ``gateway.hub.serve``). ``lines``: the JSON
    line's logger is enabled; ``atomic``: several workers write the same log."""
    if not (log_path or webhook_config_file):
        return AuditTrail(lines=lines)
    try:
        policy = load_policy(policy_file) if policy_file else AUDIT_EVERYTHING
    except PolicyError as exc:
        raise startup.StartupError(f"--audit-policy-file {policy_file}: {exc}") from None
    backends: list[EventBackend] = []
    if log_path == "-":
        backends.append(LogBackend(sys.stdout, atomic=atomic))
    elif log_path:
        try:
            backends.append(LogBackend.to_file(log_path, atomic=atomic))
        except OSError as exc:
            raise startup.StartupError(f"--audit-log-path {log_path}: cannot open it for "
                                       f"appending ({exc.strerror or exc})") from None
    if webhook_config_file:
        try:
            send, close = await kubeconfig_sender(webhook_config_file,
                                                  user_agent=f"hubproxy/{version()}")
        except Exception as exc:  # the loader's errors name keys and files, never values
            for backend in backends:
                await backend.close()
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise startup.StartupError(f"--audit-webhook-config-file {webhook_config_file}: "
                                       f"cannot use it ({why})") from None
        backends.append(WebhookBackend(send, webhook, on_close=close))
    return AuditTrail(lines=lines and log_path != "-", kube=KubeAudit(backends, policy))
