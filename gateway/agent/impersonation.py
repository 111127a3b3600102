"""Which impersonation profile the agent's own credential holds, asked of its kube-apiserver.

The agent acts only by impersonating hub identities, and how far that reaches depends on the
RBAC its ServiceAccount was given (``deploy/agent``):

* ``legacy`` — the verb ``impersonate`` on ``users``: the agent can act as any user for any
  request the user may make (``deploy/agent`` as shipped);
* ``constrained`` — KEP-5284 constrained impersonation: ``impersonate:user-info`` on ``users`` in
  ``authentication.k8s.io`` and ``impersonate-on:user-info:<verb>`` only on what the operator
  exposes (``deploy/agent/profiles/read-only``). Holding the legacy verb as well makes the
  apiserver fall back to it, so that case counts as ``legacy``;
* ``none`` — neither: every request through this agent will be refused (a deployment mistake);
* ``unknown`` — the apiserver could not be asked: not reachable (asked again every 10 s), or
  it refused the question (a 4xx such as kubesim's 404: logged once, not asked again).

The question is a handful of SelfSubjectAccessReviews with the agent's own credential, the one
kind of request the agent makes without impersonating (it asks about itself, and acts on
nothing). The answer is for operators (one log line, the ``/readyz`` body); it changes no
decision: the managed apiserver enforces the profile on every request anyway.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from mypy_extensions import mypyc_attr

from gateway.agent.kubeapi import KubeAPIAccess

log = logging.getLogger("hubproxy.agent")

SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
# The legacy check kube-apiserver makes for Impersonate-User (core group).
LEGACY = {"group": "", "resource": "users", "verb": "impersonate"}
# The constrained-impersonation check for the same header (KEP-5284, mode user-info).
CONSTRAINED = {"group": "authentication.k8s.io", "resource": "users",
               "verb": "impersonate:user-info"}
# Verbs whose `impersonate-on:user-info:<verb>` is reported when granted on every resource.
ACTION_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete",
                "deletecollection")
RETRY_SECONDS = 10.0


@dataclass(frozen=True)
class ImpersonationProfile:
    """What the agent's credential may impersonate; ``name`` is one of the four above."""

    name: str
    final: bool = True  # False: "unknown" for now, worth asking again
    # With "constrained": the verbs granted as impersonate-on:user-info:<verb> on every
    # resource of every group (a narrower grant shows as absent here, not as refused).
    everywhere: tuple[str, ...] = ()
    detail: str = ""  # why "unknown"

    def describe(self) -> str:
        if self.name == "legacy":
            return ("legacy (verb impersonate on users: any request the impersonated user's "
                    "RBAC allows)")
        if self.name == "constrained":
            verbs = ", ".join(self.everywhere) or "none"
            return (f"constrained (impersonate:user-info; impersonate-on:user-info on every "
                    f"resource: {verbs}; narrower grants per resource not listed)")
        if self.name == "none":
            return "none (the credential may not impersonate users: every request will fail)"
        return f"unknown ({self.detail or 'not checked yet'})"


UNKNOWN = ImpersonationProfile("unknown", final=False)


def classify(legacy: bool, constrained: bool,
             everywhere: tuple[str, ...] = ()) -> ImpersonationProfile:
    """The profile from the SelfSubjectAccessReview answers (pure)."""
    if legacy:
        # The apiserver tries constrained first and falls back to the legacy verb: with the
        # legacy verb held, the constrained rules restrict nothing.
        return ImpersonationProfile("legacy")
    if constrained:
        return ImpersonationProfile("constrained", everywhere=everywhere)
    return ImpersonationProfile("none")


def review_body(attributes: dict[str, str]) -> bytes:
    return json.dumps({"apiVersion": "authorization.k8s.io/v1",
                       "kind": "SelfSubjectAccessReview",
                       "spec": {"resourceAttributes": attributes}}).encode()


@mypyc_attr(native_class=False)
class ReviewError(Exception):
    """The apiserver gave no usable answer; the message is safe to log (no credential).
    ``final``: asking again will not help (a 4xx: no such API, or not allowed to ask)."""

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


async def _allowed(session: Any, kube: KubeAPIAccess, attributes: dict[str, str]) -> bool:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    authorization = kube.authorization()
    if authorization is not None:
        headers["Authorization"] = authorization.decode("ascii")
    url = f"https://{kube.host}:{kube.port}{SSAR_PATH}"
    if ":" in kube.host:
        url = f"https://[{kube.host}]:{kube.port}{SSAR_PATH}"
    async with session.post(url, data=review_body(attributes), headers=headers,
                            ssl=kube.ssl_context(),
                            server_hostname=kube.server_hostname) as answer:
        if answer.status != 201 and answer.status != 200:
            raise ReviewError(f"SelfSubjectAccessReview answered {answer.status}",
                              final=400 <= answer.status < 500)
        try:
            body = json.loads(await answer.read())
            return bool(body["status"]["allowed"])
        except (ValueError, KeyError, TypeError):
            raise ReviewError("SelfSubjectAccessReview answer without status.allowed") from None


async def detect(kube: KubeAPIAccess, timeout: float = 10.0) -> ImpersonationProfile:
    """Ask the apiserver; UNKNOWN-like profile with the reason if it cannot be asked."""
    import aiohttp

    try:
        async with asyncio.timeout(timeout), aiohttp.ClientSession() as session:
            legacy = await _allowed(session, kube, LEGACY)
            constrained = await _allowed(session, kube, CONSTRAINED)
            everywhere: tuple[str, ...] = ()
            if constrained and not legacy:
                granted = await asyncio.gather(*(
                    _allowed(session, kube, {"group": "*", "resource": "*",
                                             "verb": f"impersonate-on:user-info:{verb}"})
                    for verb in ACTION_VERBS))
                everywhere = tuple(v for v, ok in zip(ACTION_VERBS, granted, strict=True) if ok)
            return classify(legacy, constrained, everywhere)
    except ReviewError as exc:
        return ImpersonationProfile("unknown", final=exc.final, detail=str(exc))
    except (OSError, TimeoutError, aiohttp.ClientError) as exc:
        return ImpersonationProfile("unknown", final=False,
                                    detail=f"apiserver not reachable: {type(exc).__name__}")


class ProfileWatch:
    """Holds the current profile; `run` asks until an answer arrives, logging it once."""

    def __init__(self, kube: KubeAPIAccess) -> None:
        self.kube = kube
        self.profile = UNKNOWN

    async def run(self, retry: float = RETRY_SECONDS) -> None:
        while True:
            self.profile = await detect(self.kube)
            if self.profile.final:
                level = logging.INFO if self.profile.name in ("legacy", "constrained") \
                    else logging.WARNING
                log.log(level, "impersonation profile: %s", self.profile.describe())
                return
            log.warning("impersonation profile: %s; asking again in %.0fs",
                        self.profile.describe(), retry)
            await asyncio.sleep(retry)
