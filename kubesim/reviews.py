"""The create-only review APIs and TokenRequest, answered as kube-apiserver answers them.

TokenReview (authentication.k8s.io/v1) with audience semantics: with `spec.audiences` the token
must be valid for one of them and `status.audiences` is the intersection; without, the API
audiences are used. A rejected token gives `status: {user: {}, error: "..."}` (authenticated is
omitted, i.e. false). SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectAccessReview,
SelfSubjectReview (`kubectl auth whoami`) and serviceaccounts/token (`kubectl create token`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubesim import status
from kubesim.auth import AuthenticationFailed, Authenticator, UserInfo
from kubesim.objects import now
from kubesim.rbac import Attributes, Authorizer, rules_for
from kubesim.status import FieldError
from kubesim.store import Store


def _envelope(kind: str, api_version: str, body: dict[str, Any], name: str = "") -> dict[str, Any]:
    meta = dict(body.get("metadata") or {})
    # An unnamed review is never stored: the real apiserver sends no creationTimestamp at all
    # (not null) in its metadata.
    if name:
        meta["creationTimestamp"] = now()
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": meta,
        "spec": body.get("spec") or {},
    }


def token_review(authn: Authenticator, body: dict[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    token = spec.get("token") or ""
    if not token:
        raise status.bad_request("token is required for TokenReview in authentication")
    out = _envelope("TokenReview", "authentication.k8s.io/v1", body)
    try:
        user, auds = authn.authenticate(token, spec.get("audiences") or None)
    except AuthenticationFailed as exc:
        out["status"] = {"user": {}, "error": str(exc)}
        return out
    out["status"] = {"authenticated": True, "user": user.to_api(), "audiences": auds}
    return out


def _review_attributes(
    user: UserInfo, spec: dict[str, Any], kind: str, namespace: str = ""
) -> Attributes:
    res = spec.get("resourceAttributes")
    non = spec.get("nonResourceAttributes")
    if bool(res) == bool(non):
        raise status.invalid(
            "authorization.k8s.io",
            kind,
            "",
            [
                FieldError(
                    "spec.resourceAttributes",
                    "FieldValueInvalid",
                    'Invalid value: "null": exactly one of nonResourceAttributes or '
                    "resourceAttributes must be specified",
                )
            ],
        )
    if non:
        return Attributes(user, non.get("verb", ""), False, path=non.get("path", ""))
    return Attributes(
        user,
        res.get("verb", ""),
        True,
        namespace=namespace or res.get("namespace", ""),
        api_group=res.get("group", ""),
        api_version=res.get("version", ""),
        resource=res.get("resource", ""),
        subresource=res.get("subresource", ""),
        name=res.get("name", ""),
    )


def _decide(authz: Authorizer, attrs: Attributes) -> dict[str, Any]:
    allowed, reason = authz.authorize(attrs)
    result: dict[str, Any] = {"allowed": allowed}
    if reason:
        result["reason"] = reason
    return result


def subject_access_review(
    authz: Authorizer, body: dict[str, Any], namespace: str = ""
) -> dict[str, Any]:
    kind = "LocalSubjectAccessReview" if namespace else "SubjectAccessReview"
    spec = body.get("spec") or {}
    if not spec.get("user") and not spec.get("groups"):
        raise status.invalid(
            "authorization.k8s.io",
            kind,
            "",
            [
                FieldError(
                    "spec.user",
                    "FieldValueInvalid",
                    'Invalid value: "": at least one of user or group must be specified',
                )
            ],
        )
    res_ns = (spec.get("resourceAttributes") or {}).get("namespace", "")
    if namespace and res_ns and res_ns != namespace:
        raise status.bad_request(
            f"spec.resourceAttributes.namespace must match namespace: {namespace}"
        )
    extra = {k: tuple(v) for k, v in (spec.get("extra") or {}).items()}
    user = UserInfo(
        spec.get("user", ""), spec.get("uid", ""), tuple(spec.get("groups") or ()), extra
    )
    out = _envelope(kind, "authorization.k8s.io/v1", body)
    out["status"] = _decide(authz, _review_attributes(user, spec, kind, namespace))
    return out


def self_subject_access_review(
    authz: Authorizer, user: UserInfo, body: dict[str, Any]
) -> dict[str, Any]:
    spec = body.get("spec") or {}
    out = _envelope("SelfSubjectAccessReview", "authorization.k8s.io/v1", body)
    out["status"] = _decide(authz, _review_attributes(user, spec, "SelfSubjectAccessReview"))
    return out


def self_subject_rules_review(store: Store, user: UserInfo, body: dict[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    namespace = spec.get("namespace", "")
    out = _envelope("SelfSubjectRulesReview", "authorization.k8s.io/v1", body)
    resource_rules, non_resource_rules = [], []
    for rule in rules_for(store, user, namespace):
        if rule.get("nonResourceURLs"):
            non_resource_rules.append(
                {"verbs": rule.get("verbs") or [], "nonResourceURLs": rule["nonResourceURLs"]}
            )
        else:
            entry = {
                k: rule[k]
                for k in ("verbs", "apiGroups", "resources", "resourceNames")
                if rule.get(k)
            }
            resource_rules.append(entry)
    out["status"] = {
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": False,
    }
    return out


def self_subject_review(user: UserInfo, api_version: str) -> dict[str, Any]:
    return {
        "kind": "SelfSubjectReview",
        "apiVersion": api_version,
        "metadata": {"creationTimestamp": now()},
        "status": {"userInfo": user.to_api()},
    }


def token_request(
    authn: Authenticator,
    sa: dict[str, Any],
    body: dict[str, Any],
    lookup: Callable[[str, str, str], dict[str, Any] | None],
) -> dict[str, Any]:
    """serviceaccounts/token; `lookup(plural, namespace, name)` finds a bound Pod or Secret."""
    spec = dict(body.get("spec") or {})
    name, namespace = sa["metadata"]["name"], sa["metadata"]["namespace"]
    seconds = spec.get("expirationSeconds") or 3600
    if not isinstance(seconds, int) or seconds < 600:
        raise status.invalid(
            "authentication.k8s.io",
            "TokenRequest",
            name,
            [
                FieldError(
                    "spec.expirationSeconds",
                    "FieldValueInvalid",
                    f"Invalid value: {seconds}: may not specify a duration less than 10 minutes",
                )
            ],
        )
    if seconds > 1 << 32:
        raise status.invalid(
            "authentication.k8s.io",
            "TokenRequest",
            name,
            [
                FieldError(
                    "spec.expirationSeconds",
                    "FieldValueTooLong",
                    f"Invalid value: {seconds}: may not specify a duration larger than 2^32 "
                    "seconds",
                )
            ],
        )
    audiences = list(spec.get("audiences") or authn.api_audiences)
    bound = None
    ref = spec.get("boundObjectRef")
    if ref:
        # The bound object must exist (and match its uid); its identity goes into the claims.
        kind = ref.get("kind", "")
        plural = {"Pod": "pods", "Secret": "secrets"}.get(kind)
        if plural is None:
            raise status.bad_request(f"cannot bind token to object of type {kind}")
        obj = lookup(plural, namespace, ref.get("name", ""))
        if obj is None:
            raise status.not_found("", plural, ref.get("name", ""))
        uid = obj["metadata"]["uid"]
        if ref.get("uid") and ref["uid"] != uid:
            raise status.conflict(
                "",
                plural,
                ref.get("name", ""),
                f"the UID in the bound object reference ({ref['uid']}) does not "
                f"match the UID in record. The object might have been deleted "
                f"and then recreated",
            )
        ref = {**ref, "uid": uid}
        bound = {kind.lower(): {"name": ref.get("name"), "uid": uid}}
    token, exp = authn.mint(namespace, name, sa["metadata"]["uid"], audiences, seconds, bound)
    spec.update({"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": ref})
    return {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": now()},
        "spec": spec,
        "status": {
            "token": token,
            "expirationTimestamp": datetime.fromtimestamp(exp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }
