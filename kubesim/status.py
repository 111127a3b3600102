"""Kubernetes `Status` errors with kube-apiserver's exact shape, codes, reasons and messages.

Each constructor mirrors one function of k8s.io/apimachinery/pkg/api/errors (NewNotFound,
NewForbidden, ...) so that clients which switch on `reason`/`code` (kubectl, client-go,
kubernetes-asyncio) behave as they would against a real apiserver.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


def qualified(group: str, resource: str) -> str:
    """GroupResource.String(): `pods`, `clusterprofiles.multicluster.x-k8s.io`."""
    return f"{resource}.{group}" if group else resource


@dataclass
class FieldError:
    """One entry of a field.ErrorList (`Invalid value`, `Required value`, ...)."""

    field: str
    type: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, ...
    body: str  # ErrorBody(): the message without the field prefix

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


@dataclass
class StatusError(Exception):
    """An API error; `body()` is the Status object the apiserver would send."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            status["details"] = {k: v for k, v in self.details.items() if v not in ("", None)}
        status["code"] = self.code
        return status

    def json_bytes(self) -> bytes:
        return json.dumps(self.body(), separators=(",", ":")).encode() + b"\n"


def _details(group: str, kind: str, name: str = "") -> dict[str, Any]:
    return {"name": name, "group": group, "kind": kind}


def not_found(group: str, resource: str, name: str) -> StatusError:
    return StatusError(
        404,
        "NotFound",
        f'{qualified(group, resource)} "{name}" not found',
        _details(group, resource, name),
    )


def already_exists(group: str, resource: str, name: str) -> StatusError:
    return StatusError(
        409,
        "AlreadyExists",
        f'{qualified(group, resource)} "{name}" already exists',
        _details(group, resource, name),
    )


def conflict(group: str, resource: str, name: str, why: str) -> StatusError:
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(group, resource)} "{name}": {why}',
        _details(group, resource, name),
    )


RV_CONFLICT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def forbidden(group: str, resource: str, name: str, message: str) -> StatusError:
    gr = qualified(group, resource)
    if not resource:
        text = f"forbidden: {message}"
    elif not name:
        text = f"{gr} is forbidden: {message}"
    else:
        text = f'{gr} "{name}" is forbidden: {message}'
    return StatusError(403, "Forbidden", text, _details(group, resource, name))


def unauthorized() -> StatusError:
    # kube-apiserver's authentication filter answers with no details at all.
    return StatusError(401, "Unauthorized", "Unauthorized", None)


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message, None)


def invalid(group: str, kind: str, name: str, errors: list[FieldError]) -> StatusError:
    gk = f"{kind}.{group}" if group else kind
    if len(errors) == 1:
        text = f'{gk} "{name}" is invalid: {errors[0]}'
    else:
        text = f'{gk} "{name}" is invalid: [{", ".join(str(e) for e in errors)}]'
    details = _details(group, kind, name)
    details["causes"] = [{"reason": e.type, "message": e.body, "field": e.field} for e in errors]
    return StatusError(422, "Invalid", text, details)


def resource_not_found() -> StatusError:
    """The router's answer for a path no API serves (unknown resource or group)."""
    return StatusError(404, "NotFound", "the server could not find the requested resource", {})


def method_not_allowed() -> StatusError:
    return StatusError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )


def unsupported_media_type(content_type: str, accepted: list[str]) -> StatusError:
    return StatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
        {},
    )


def not_acceptable(accepted: list[str]) -> StatusError:
    return StatusError(
        406,
        "NotAcceptable",
        f"only the following media types are accepted: {', '.join(accepted)}",
        {},
    )


def gone(message: str) -> StatusError:
    # Watch/list with a compacted resourceVersion: reason Expired, code 410.
    return StatusError(410, "Expired", message, None)


def too_large_resource_version(requested: int, current: int) -> StatusError:
    return StatusError(
        504,
        "Timeout",
        f"Too large resource version: {requested}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
    )


def internal(message: str) -> StatusError:
    return StatusError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


def success(group: str, resource: str, name: str, uid: str) -> dict[str, Any]:
    details = {k: v for k, v in _details(group, resource, name).items() if v}
    details["uid"] = uid
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }
