"""The HTTP side of kubesim: kube-apiserver's filter chain and REST handlers on aiohttp.web.

Every request goes, in this order, through:
  1. record      — appended to `KubeSim.received` (method, raw path, headers, who) for tests;
  2. authenticate — bearer token (static CSV users, minted service-account tokens), the
                    WebSocket `base64url.bearer.authorization.k8s.io.` subprotocol, optional
                    client certificate; missing credentials are allowed only on the health and
                    version paths (as `system:anonymous`), anything else is 401;
  3. impersonate  — kubesim.impersonation, exactly like the real filter;
  4. authorize    — RBAC-lite (kubesim.rbac) on the RequestInfo of the path;
  5. serve        — discovery/health/OpenAPI, or the REST verbs on a resource, watch, reviews,
                    TokenRequest, and pods' streaming subresources (kubesim.streams).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import re
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web

from kubesim import impersonation, openapi, protobuf, requestinfo, reviews, status
from kubesim.auth import (
    ALL_UNAUTHENTICATED,
    ANONYMOUS,
    DEFAULT_ISSUER,
    AuthenticationFailed,
    Authenticator,
    StaticUser,
    UserInfo,
)
from kubesim.objects import CRD_KEY, NAMESPACES, SERVICEACCOUNTS, Objects
from kubesim.rbac import Attributes, Authorizer, bootstrap_policy, forbidden_error
from kubesim.resources import Registry, ResourceType
from kubesim.selectors import EXTRA_FIELDS, parse_field_selector, parse_label_selector
from kubesim.status import StatusError
from kubesim.store import Store, TooOld
from kubesim.table import partial, partial_list, to_table, wants_partial_metadata, wants_table

ANONYMOUS_PATHS = ("/healthz", "/livez", "/readyz", "/version")
WS_TOKEN_PREFIX = "base64url.bearer.authorization.k8s.io."
STREAM_SUBRESOURCES = ("log", "exec", "attach", "portforward")
_RETURNS_OBJECT_ON_DELETE = {("", "pods"), NAMESPACES, CRD_KEY}


@dataclass
class Config:
    name: str = "kubesim"
    static_users: list[StaticUser] = field(default_factory=list)
    rbac: list[dict[str, Any]] = field(default_factory=list)  # Role/ClusterRole/bindings objects
    crds: list[dict[str, Any]] = field(default_factory=list)
    api_audiences: tuple[str, ...] = (DEFAULT_ISSUER,)
    bookmark_interval: float = 5.0
    watch_history: int = 2000


@dataclass
class ReceivedRequest:
    """One request as kubesim received it, before any filter changed it."""

    method: str
    path: str  # raw path and query, as sent
    headers: list[tuple[str, str]]
    user: str = ""  # authenticated user, "" if authentication failed
    acting_as: str = ""  # impersonated user, if any
    groups: tuple[str, ...] = ()  # groups of the effective (possibly impersonated) user
    status: int = 0
    at: float = field(default_factory=time.time)

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


class PathNotServed(Exception):
    """No API group owns the path; answered with Go's plain-text "404 page not found"."""


def _attributes(user: UserInfo, info: requestinfo.RequestInfo) -> Attributes:
    """What the request asks to do, as the authorizer (and impersonation) sees it."""
    if not info.resource_request:
        return Attributes(user, info.verb, False, path=info.path)
    return Attributes(
        user,
        info.verb,
        True,
        namespace=info.namespace,
        api_group=info.group,
        api_version=info.version,
        resource=info.resource,
        subresource=info.subresource,
        name=info.name,
        path=info.path,
    )


def _json(obj: Any, code: int = 200) -> web.Response:
    # Compact, newline-terminated: what kube-apiserver's JSON serializer writes.
    body = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    return web.Response(body=body, status=code, content_type="application/json")


def _error(err: StatusError) -> web.Response:
    return web.Response(body=err.json_bytes(), status=err.code, content_type="application/json")


def _semver_safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z-]", "-", name) or "kubesim"


class KubeSim:
    """One simulated apiserver: state (store, CRDs, tokens) plus the aiohttp application."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self.store = Store(history=self.config.watch_history)
        self.registry = Registry()
        self.objects = Objects(self.store, self.registry)
        self.authn = Authenticator(
            self._service_account_uid, api_audiences=self.config.api_audiences
        )
        self.authn.add_static(self.config.static_users)
        self.authz = Authorizer(self.store)
        self.received: collections.deque[ReceivedRequest] = collections.deque(maxlen=100_000)
        # Test hooks, run in order before authentication: each may delay, or answer instead
        # of kubesim (return a response), e.g. to make the hub slow or fail for a while.
        self.interceptors: list[Callable[[web.Request], Awaitable[web.StreamResponse | None]]] = []
        self.started = time.time()
        self.server_address = "127.0.0.1:6443"
        self._bootstrap()

    # --- state helpers (no auth; for the CLI, testing helpers and bootstrap) -------------
    def _service_account_uid(self, namespace: str, name: str) -> str | None:
        sa = self.store.get(SERVICEACCOUNTS, namespace, name)
        return sa["metadata"]["uid"] if sa else None

    def _bootstrap(self) -> None:
        ns_type = self.type_for("v1", "namespaces")
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.objects.create(ns_type, "", {"metadata": {"name": ns}})
        for obj in bootstrap_policy():
            self.apply(obj)
        for crd in self.config.crds:
            self.apply(crd)
        for obj in self.config.rbac:
            self.apply(obj)

    def _lookup_core(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.store.get(("", plural), namespace, name)

    def type_for(self, api_version: str, plural: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        rtype = self.registry.lookup(group, version, plural)
        if rtype is None:
            raise KeyError(f"no resource {plural} in {api_version}")
        return rtype

    def type_for_kind(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for t in self.registry.all():
            if t.group == group and t.version == version and t.kind == kind:
                return t
        raise KeyError(f"no kind {kind} in {api_version}")

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace `obj` (any served kind) as the system would, bypassing RBAC."""
        if obj.get("kind", "").endswith("List") and "items" in obj:
            for item in obj["items"]:
                self.apply(item)
            return obj
        rtype = self.type_for_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        meta = obj.get("metadata") or {}
        namespace = (meta.get("namespace") or "default") if rtype.namespaced else ""
        existing = self.store.get(rtype.key, namespace, meta.get("name", ""))
        if existing is None:
            if rtype.namespaced and self.store.get(NAMESPACES, "", namespace) is None:
                self.objects.create(
                    self.type_for("v1", "namespaces"), "", {"metadata": {"name": namespace}}
                )
            return self.objects.create(rtype, namespace, obj)
        replacement = json.loads(json.dumps(obj))
        replacement.setdefault("metadata", {}).pop("resourceVersion", None)
        result = self.objects.update(rtype, namespace, meta["name"], replacement)
        if rtype.has_status and "status" in obj:
            result = self.objects.update(
                rtype, namespace, meta["name"], {"status": obj["status"]}, subresource="status"
            )
        return result

    def ensure_service_account(self, namespace: str, name: str) -> dict[str, Any]:
        sa = self.store.get(SERVICEACCOUNTS, namespace, name)
        if sa is not None:
            return sa
        return self.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            }
        )

    def mint_token(
        self,
        namespace: str,
        name: str,
        audiences: Iterable[str] | None = None,
        expiration_seconds: int = 3600,
    ) -> str:
        """A token for ServiceAccount namespace/name (created if missing), like TokenRequest."""
        sa = self.ensure_service_account(namespace, name)
        token, _ = self.authn.mint(
            namespace, name, sa["metadata"]["uid"], audiences, expiration_seconds
        )
        return token

    # --- the aiohttp application -------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)

        async def close_watches(_: web.Application) -> None:
            self.store.close_watchers()

        app.on_shutdown.append(close_watches)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        record = ReceivedRequest(request.method, request.raw_path, list(request.headers.items()))
        self.received.append(record)
        try:
            response = None
            for intercept in list(self.interceptors):
                response = await intercept(request)
                if response is not None:
                    break
            if response is None:
                response = await self._serve(request, record)
        except StatusError as err:
            response = _error(err)
        except PathNotServed:
            # No API group claims the path: Go's mux answers, in plain text, not a Status.
            response = web.Response(status=404, text="404 page not found\n")
        record.status = response.status
        if not response.prepared:
            # As kube-apiserver's WithAuditInit: the first server that received the request
            # may have set its ID; it is echoed back.
            response.headers.setdefault("Audit-Id",
                                        request.headers.get("Audit-ID") or str(uuid.uuid4()))
            response.headers.setdefault("Cache-Control", "no-cache, private")
        return response

    # --- filters -----------------------------------------------------------------------
    def _authenticate(self, request: web.Request) -> UserInfo | None:
        header = request.headers.get("Authorization", "")
        token = ""
        if header:
            scheme, _, value = header.strip().partition(" ")
            if scheme.lower() == "bearer" and value.strip():
                token = value.strip()
        if not token:
            for proto in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
                proto = proto.strip()
                if proto.startswith(WS_TOKEN_PREFIX):
                    with contextlib.suppress(ValueError):
                        raw = proto[len(WS_TOKEN_PREFIX) :]
                        token = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
        if token:
            try:
                user, _ = self.authn.authenticate(token)
            except AuthenticationFailed:
                raise status.unauthorized() from None
            return user
        cert_user = self._client_certificate_user(request)
        if cert_user is not None:
            return cert_user
        if header:
            raise status.unauthorized()
        return None

    @staticmethod
    def _client_certificate_user(request: web.Request) -> UserInfo | None:
        transport = request.transport
        peer = transport.get_extra_info("peercert") if transport else None
        if not peer:
            return None
        cn, orgs = "", []
        for rdn in peer.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
                elif key == "organizationName":
                    orgs.append(value)
        if not cn:
            return None
        return UserInfo(cn, "", (*orgs, "system:authenticated"))

    async def _serve(self, request: web.Request, record: ReceivedRequest) -> web.StreamResponse:
        user = self._authenticate(request)
        path = request.path
        if user is None:
            if path.rstrip("/") not in ANONYMOUS_PATHS and not path.startswith(
                ("/healthz/", "/livez/", "/readyz/")
            ):
                raise status.unauthorized()
            user = UserInfo(ANONYMOUS, "", (ALL_UNAUTHENTICATED,))
        record.user = user.name
        query = dict(request.query)
        info = requestinfo.parse(request.method, path, query)
        acting = impersonation.impersonate(
            user, list(request.headers.items()), self.authz.authorize, _attributes(user, info)
        )
        if acting is not None:
            user = acting
            record.acting_as = acting.name
        record.groups = user.groups
        if not info.resource_request:
            attrs = _attributes(user, info)
            if not self.authz.authorize(attrs)[0]:
                raise forbidden_error(attrs)
            return self._non_resource(request, path)
        return await self._resource(request, info, user, query)

    # --- non-resource paths --------------------------------------------------------------
    def _non_resource(self, request: web.Request, path: str) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise status.method_not_allowed()
        trimmed = path.rstrip("/") or "/"
        if trimmed in ("/healthz", "/livez", "/readyz") or re.fullmatch(
            r"/(healthz|livez|readyz)/[a-z-]+", trimmed
        ):
            if "verbose" in request.query:
                return web.Response(text=f"[+]ping ok\n[+]etcd ok\n{trimmed[1:]} check passed\n")
            return web.Response(text="ok")
        if trimmed == "/version":
            return _json(
                {
                    "major": "1",
                    "minor": "32",
                    "gitVersion": f"v1.32.0+kubesim-{_semver_safe(self.config.name)}",
                    "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean",
                    "buildDate": "2025-01-01T00:00:00Z",
                    "goVersion": "go1.23.0",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                }
            )
        if trimmed in ("/api", "/apis") and _wants_aggregated(request.headers.get("Accept", "")):
            body = json.dumps(self.registry.aggregated(core=trimmed == "/api")).encode()
            return web.Response(body=body, headers={"Content-Type": AGGREGATED_DISCOVERY})
        if trimmed == "/api":
            return _json(self.registry.api_versions(self.server_address))
        if trimmed == "/apis":
            return _json(self.registry.api_group_list())
        parts = trimmed.strip("/").split("/")
        if parts[0] == "apis" and len(parts) == 2:
            group = self.registry.api_group(parts[1])
            if group:
                return _json({"kind": "APIGroup", "apiVersion": "v1", **group})
        if (parts[0] == "api" and len(parts) == 2) or (parts[0] == "apis" and len(parts) == 3):
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            doc = self.registry.resource_list(group, version)
            if doc:
                return _json(doc)
        if trimmed == "/openapi/v3":
            return _json(openapi.index(self.registry))
        if trimmed.startswith("/openapi/v3/"):
            gv = trimmed[len("/openapi/v3/") :].split("/")
            if gv[0] == "api" and len(gv) == 2:
                doc = openapi.gv_document(self.registry, "", gv[1])
            elif gv[0] == "apis" and len(gv) == 3:
                doc = openapi.gv_document(self.registry, gv[1], gv[2])
            else:
                doc = None
            if doc:
                return _json(doc)
        if not self._api_served(parts):
            raise PathNotServed(path)
        raise status.resource_not_found()

    def _api_served(self, parts: list[str]) -> bool:
        """Whether an API handler owns this path: /api/..., /apis, /apis/<known group>/..."""
        if parts[0] == "api" or parts == ["apis"]:
            return True
        return parts[0] == "apis" and self.registry.api_group(parts[1]) is not None

    # --- resources ---------------------------------------------------------------------
    async def _resource(
        self,
        request: web.Request,
        info: requestinfo.RequestInfo,
        user: UserInfo,
        query: dict[str, str],
    ) -> web.StreamResponse:
        # Authorization is a filter in front of every handler: a user without the permission
        # gets 403 even for a resource that does not exist, as from kube-apiserver.
        attrs = _attributes(user, info)
        allowed, _ = self.authz.authorize(attrs)
        if not allowed:
            raise forbidden_error(attrs)
        rtype = self.registry.lookup(info.group, info.version, info.resource)
        if rtype is None and info.group and self.registry.api_group(info.group) is None:
            raise PathNotServed(info.path)
        if rtype is None or info.parts_count > 3:
            raise status.resource_not_found()
        if (
            rtype.namespaced
            and not info.namespace
            and (info.name or info.verb not in ("list", "watch"))
        ):
            raise status.resource_not_found()
        if not rtype.namespaced and info.namespace and info.resource != "namespaces":
            raise status.resource_not_found()
        if info.subresource and info.subresource not in rtype.subresources:
            raise status.resource_not_found()
        allowed_verbs = rtype.subresources[info.subresource] if info.subresource else rtype.verbs
        # POST to a named object, or PUT/PATCH to a collection, has no handler in the real one.
        misplaced = (info.verb == "create" and info.name and not info.subresource) or (
            info.verb in ("update", "patch") and not info.name
        )
        if info.verb not in allowed_verbs or misplaced:
            raise status.method_not_allowed()

        if info.subresource in ("exec", "attach", "portforward") and info.verb == "get":
            # Websocket upgrades are GETs; since 1.30 they also need `create`, as SPDY POSTs do.
            create = Attributes(**{**attrs.__dict__, "verb": "create"})
            if not self.authz.authorize(create)[0]:
                raise forbidden_error(create)

        if rtype.virtual:
            return await self._review(request, rtype, info, user)
        if info.subresource in STREAM_SUBRESOURCES:
            pod = self.objects.get(rtype, info.namespace, info.name)
            return await self._stream(request, info.subresource, pod)
        if info.subresource == "token":
            sa = self.objects.get(rtype, info.namespace, info.name)
            body = await self._body(request)
            return _json(reviews.token_request(self.authn, sa, body, self._lookup_core), 201)

        verb = info.verb
        accept = request.headers.get("Accept", "")
        table = wants_table(accept)
        metadata_only = not table and wants_partial_metadata(accept)
        dry_run = "All" in request.query.getall("dryRun", [])
        strict = query.get("fieldValidation") == "Strict"
        if verb == "get":
            obj = self.objects.get(rtype, info.namespace, info.name)
            if table:
                return _json(
                    to_table(
                        rtype,
                        [obj],
                        obj["metadata"]["resourceVersion"],
                        query.get("includeObject", "Metadata"),
                    )
                )
            return _json(partial(obj) if metadata_only else obj)
        if verb == "list":
            return self._list(rtype, info, query, table, metadata_only)
        if verb == "watch":
            return await self._watch(request, rtype, info, query, table, metadata_only)
        if verb == "create":
            body = await self._body(request)
            return _json(self.objects.create(rtype, info.namespace, body, dry_run, strict), 201)
        if verb == "update":
            body = await self._body(request)
            return _json(
                self.objects.update(
                    rtype, info.namespace, info.name, body, info.subresource, dry_run, strict
                )
            )
        if verb == "patch":
            raw = await request.read()
            return _json(
                self.objects.patch(
                    rtype,
                    info.namespace,
                    info.name,
                    request.headers.get("Content-Type", ""),
                    raw,
                    info.subresource,
                    dry_run,
                    strict,
                )
            )
        if verb == "delete":
            options = await self._body(request, allow_empty=True)
            gone = self.objects.delete(rtype, info.namespace, info.name, options, dry_run)
            if rtype.key in _RETURNS_OBJECT_ON_DELETE or rtype.crd_name:
                return _json(gone)
            return _json(
                status.success(rtype.group, rtype.plural, info.name, gone["metadata"]["uid"])
            )
        if verb == "deletecollection":
            items = self._select(rtype, info.namespace or None, query)
            for obj in items:
                meta = obj["metadata"]
                self.objects.delete(rtype, meta.get("namespace", ""), meta["name"], None, dry_run)
            return _json(self._list_body(rtype, items, str(self.store.resource_version)))
        raise status.method_not_allowed()

    async def _body(self, request: web.Request, allow_empty: bool = False) -> Any:
        raw = await request.read()
        if not raw.strip():
            if allow_empty:
                return {}
            raise status.bad_request("the body of the request was empty")
        content_type = request.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if content_type == protobuf.CONTENT_TYPE:
            try:
                return protobuf.decode(raw)
            except protobuf.UnsupportedKind:
                raise status.unsupported_media_type(
                    content_type, ["application/json", "application/yaml"]
                ) from None
            except ValueError as exc:
                raise status.bad_request(f"couldn't decode protobuf body: {exc}") from exc
        if content_type not in (
            "application/json",
            "application/yaml",
            "application/x-yaml",
            "*/*",
            "",
        ):
            # Protobuf/CBOR bodies: 415 makes client-go (1.32+) retry the request as JSON.
            raise status.unsupported_media_type(
                content_type, ["application/json", "application/yaml"]
            )
        try:
            if content_type in ("application/yaml", "application/x-yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise status.bad_request(
                f"couldn't get version/kind; json parse error: {_json_error(exc)}"
            ) from exc

    async def _review(
        self,
        request: web.Request,
        rtype: ResourceType,
        info: requestinfo.RequestInfo,
        user: UserInfo,
    ) -> web.StreamResponse:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise status.bad_request("Object 'Kind' is missing in the body")
        kind = rtype.kind
        if kind == "TokenReview":
            return _json(reviews.token_review(self.authn, body), 201)
        if kind == "SelfSubjectReview":
            return _json(reviews.self_subject_review(user, rtype.group_version), 201)
        if kind == "SubjectAccessReview":
            return _json(reviews.subject_access_review(self.authz, body), 201)
        if kind == "SelfSubjectRulesReview":
            return _json(reviews.self_subject_rules_review(self.store, user, body), 201)
        if kind == "LocalSubjectAccessReview":
            return _json(reviews.subject_access_review(self.authz, body, info.namespace), 201)
        return _json(reviews.self_subject_access_review(self.authz, user, body), 201)

    async def _stream(
        self, request: web.Request, subresource: str, pod: dict[str, Any]
    ) -> web.StreamResponse:
        try:
            from kubesim.streams import serve_pod_subresource
        except ImportError:
            raise StatusError(
                501,
                "NotImplemented",
                f"pods/{subresource} is not implemented in this kubesim build",
                {},
            ) from None
        return await serve_pod_subresource(request, subresource, pod)

    # --- list & watch ------------------------------------------------------------------
    def _select(
        self, rtype: ResourceType, namespace: str | None, query: dict[str, str]
    ) -> list[dict[str, Any]]:
        try:
            labels = parse_label_selector(query.get("labelSelector"))
            fields = parse_field_selector(
                query.get("fieldSelector"), EXTRA_FIELDS.get(rtype.key, set())
            )
        except ValueError as exc:
            raise status.bad_request(str(exc)) from exc
        return [
            o
            for o in self.objects.list(rtype, namespace)
            if labels((o.get("metadata") or {}).get("labels") or {}) and fields(o)
        ]

    def _list_body(
        self,
        rtype: ResourceType,
        items: list[dict[str, Any]],
        rv: str,
        continue_token: str = "",
        remaining: int = 0,
    ) -> dict[str, Any]:
        if not rtype.crd_name:
            items = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")} for o in items]
        meta: dict[str, Any] = {"resourceVersion": rv}
        if continue_token:
            meta["continue"] = continue_token
            meta["remainingItemCount"] = remaining
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.group_version,
            "metadata": meta,
            "items": items,
        }

    def _list(
        self,
        rtype: ResourceType,
        info: requestinfo.RequestInfo,
        query: dict[str, str],
        table: bool,
        metadata_only: bool = False,
    ) -> web.Response:
        items = self._select(rtype, info.namespace or None, query)
        rv = str(self.store.resource_version)
        start = query.get("continue")
        if start:
            try:
                token = json.loads(base64.urlsafe_b64decode(start.encode()))
                after = tuple(token["after"])
                rv = token["rv"]
            except (ValueError, KeyError, TypeError):
                raise status.bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion "
                    "(version meta.k8s.io/v1)"
                ) from None
            items = [
                o
                for o in items
                if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after
            ]
        continue_token, remaining = "", 0
        limit = int(query.get("limit") or 0) if (query.get("limit") or "0").isdigit() else 0
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            remaining = len(items) - limit
            items = items[:limit]
            continue_token = base64.urlsafe_b64encode(
                json.dumps({"rv": rv, "after": [last.get("namespace", ""), last["name"]]}).encode()
            ).decode()
        if table:
            return _json(
                to_table(
                    rtype,
                    items,
                    rv,
                    query.get("includeObject", "Metadata"),
                    continue_token=continue_token,
                )
            )
        body = self._list_body(rtype, items, rv, continue_token, remaining)
        if metadata_only:
            return _json(partial_list(items, body["metadata"]))
        return _json(body)

    async def _watch(
        self,
        request: web.Request,
        rtype: ResourceType,
        info: requestinfo.RequestInfo,
        query: dict[str, str],
        table: bool,
        metadata_only: bool = False,
    ) -> web.StreamResponse:
        if info.name:  # deprecated /watch/.../name form
            selector = query.get("fieldSelector")
            query = {
                **query,
                "fieldSelector": f"metadata.name={info.name}"
                + (f",{selector}" if selector else ""),
            }
        try:
            labels = parse_label_selector(query.get("labelSelector"))
            fields = parse_field_selector(
                query.get("fieldSelector"), EXTRA_FIELDS.get(rtype.key, set())
            )
        except ValueError as exc:
            raise status.bad_request(str(exc)) from exc

        def matches(obj: dict[str, Any]) -> bool:
            return labels((obj.get("metadata") or {}).get("labels") or {}) and fields(obj)

        rv_param = query.get("resourceVersion", "")
        send_initial = query.get("sendInitialEvents") == "true"
        bookmarks = query.get("allowWatchBookmarks") == "true"
        timeout = float(query.get("timeoutSeconds") or 1800)
        namespace = info.namespace or None
        initial: list[dict[str, Any]] = []
        if rv_param in ("", "0") or send_initial:
            since = self.store.resource_version
            initial = [o for o in self.objects.list(rtype, namespace) if matches(o)]
        else:
            try:
                since = int(rv_param)
            except ValueError:
                raise status.bad_request(f"invalid resource version: {rv_param}") from None

        response = web.StreamResponse(
            headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
        )
        response.enable_chunked_encoding()
        try:
            watcher = self.store.watch(rtype.key, namespace, since)
        except TooOld as exc:
            await response.prepare(request)
            await self._send(response, "ERROR", status.gone(str(exc)).body())
            await response.write_eof()
            return response
        if since > self.store.resource_version:
            # A resourceVersion from the future (e.g. from before a restart): the watch cache
            # answers with a Timeout error so that clients relist.
            self.store.unwatch(watcher)
            await response.prepare(request)
            await self._send(
                response,
                "ERROR",
                status.too_large_resource_version(since, self.store.resource_version).body(),
            )
            await response.write_eof()
            return response
        include = query.get("includeObject", "Metadata")
        first = [True]

        def render(obj: dict[str, Any]) -> dict[str, Any]:
            if metadata_only:
                return partial(obj)
            if not table:
                return obj
            out = to_table(
                rtype, [obj], obj["metadata"].get("resourceVersion", ""), include, headers=first[0]
            )
            first[0] = False
            return out

        try:
            await response.prepare(request)
            for obj in initial:
                await self._send(response, "ADDED", render(obj))
            if send_initial and bookmarks:
                await self._send(
                    response, "BOOKMARK", self._bookmark(rtype, since, initial_end=True)
                )
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + self.config.bookmark_interval
            last_rv = since
            while True:
                now_ = time.monotonic()
                if now_ >= deadline:
                    break
                if request.transport is None or request.transport.is_closing():
                    break  # the client went away; aiohttp does not cancel us, so look
                wait = min(deadline, next_bookmark) - now_ if bookmarks else deadline - now_
                wait = min(wait, 1.0)
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), max(wait, 0.001))
                except TimeoutError:
                    if bookmarks and time.monotonic() >= next_bookmark:
                        await self._send(response, "BOOKMARK", self._bookmark(rtype, last_rv))
                        next_bookmark = time.monotonic() + self.config.bookmark_interval
                    continue
                if event is None or watcher.overflowed:
                    break
                last_rv = event.rv
                obj = Objects._as_version(rtype, json.loads(json.dumps(event.obj)))
                kind = event.type
                if kind == "MODIFIED":
                    # Like the watch cache: entering the selection is ADDED, leaving it DELETED.
                    was = event.prev is not None and matches(event.prev)
                    now_in = matches(obj)
                    kind = {
                        (True, True): "MODIFIED",
                        (False, True): "ADDED",
                        (True, False): "DELETED",
                    }.get((was, now_in), "")
                    if kind:
                        await self._send(response, kind, render(obj))
                elif matches(obj):
                    await self._send(response, kind, render(obj))
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(watcher)
        return response

    @staticmethod
    def _bookmark(rtype: ResourceType, rv: int, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": rtype.kind, "apiVersion": rtype.group_version, "metadata": meta}

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: dict[str, Any]) -> None:
        event = {"type": kind, "object": obj}
        await response.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")


AGGREGATED_DISCOVERY = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def _wants_aggregated(accept: str) -> bool:
    """True when the client accepts v2 aggregated discovery (kubectl does, then the legacy form)."""
    for media in accept.split(","):
        params = {p.strip() for p in media.split(";")[1:]}
        if {"g=apidiscovery.k8s.io", "v=v2", "as=APIGroupDiscoveryList"} <= params:
            return True
    return False


def _json_error(exc: Exception) -> str:
    """Word a JSON syntax error the way Go's encoding/json does, for kube-apiserver parity."""
    if not isinstance(exc, json.JSONDecodeError):
        return str(exc)
    if exc.pos >= len(exc.doc.rstrip()):
        return "unexpected end of JSON input"
    char = exc.doc[exc.pos]
    if exc.msg.startswith("Expecting property name"):
        return f"invalid character '{char}' looking for beginning of object key string"
    if exc.msg.startswith("Expecting value"):
        return f"invalid character '{char}' looking for beginning of value"
    if exc.msg.startswith("Extra data"):
        return f"invalid character '{char}' after top-level value"
    if exc.msg.startswith("Expecting ',' delimiter"):
        return f"invalid character '{char}' after object key:value pair"
    if exc.msg.startswith("Expecting ':' delimiter"):
        return f"invalid character '{char}' after object key"
    return f"invalid character '{char}' {exc.msg.lower()}"


async def start(
    sim: KubeSim, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> web.AppRunner:
    """Serve `sim` on host:port; returns the runner (call `await runner.cleanup()` to stop)."""
    runner = web.AppRunner(sim.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=256, reuse_address=True)
    await site.start()
    sockets = [s for s in (getattr(site._server, "sockets", None) or [])]
    if sockets:
        bound = sockets[0].getsockname()
        sim.server_address = f"{bound[0]}:{bound[1]}"
    else:
        sim.server_address = f"{host}:{port}"
    return runner
