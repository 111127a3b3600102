"""Kubernetes `Status` objects and error responses, as kube-apiserver and the kubelet send them."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    500: "InternalError",
}


def status_object(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "InternalError"),
        "code": code,
    }
    if details:
        obj["details"] = details
    return obj


def error_response(code: int, message: str, reason: str | None = None) -> web.Response:
    return web.Response(
        status=code,
        content_type="application/json",
        text=json.dumps(status_object(code, message, reason)),
    )


def exec_success() -> bytes:
    """What the v4/v5 error channel carries when the command exited 0."""
    return json.dumps({"metadata": {}, "status": "Success"}).encode()


def exec_exit_code(code: int) -> bytes:
    """kubelet's NonZeroExitCode Status; client-go turns the ExitCode cause into the exit code."""
    return json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    ).encode()


def exec_internal_error(message: str) -> bytes:
    """apierrors.NewInternalError as the kubelet writes it when the exec itself fails."""
    return json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "message": f"Internal error occurred: {message}",
            "reason": "InternalError",
            "details": {"causes": [{"message": message}]},
            "code": 500,
        }
    ).encode()
