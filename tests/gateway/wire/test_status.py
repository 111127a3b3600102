from __future__ import annotations

import json

import pytest

from gateway.wire.http1 import ContentLengthBody, framing_for_response, parse_response_head
from gateway.wire.status import MAX_MESSAGE, error_response, status_body, status_object


def split(response: bytes) -> tuple[bytes, bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", body


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (400, "BadRequest"),
        (401, "Unauthorized"),
        (403, "Forbidden"),
        (404, "NotFound"),
        (429, "TooManyRequests"),
        (500, "InternalError"),
        (503, "ServiceUnavailable"),
        (504, "Timeout"),
    ],
)
def test_status_object_has_the_apiserver_reason(code: int, reason: str) -> None:
    obj = json.loads(status_body(code, "nope"))
    assert obj == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "nope",
        "reason": reason,
        "code": code,
    }


def test_unknown_reason_is_omitted_like_status_reason_unknown() -> None:
    obj = status_object(502, "upstream unreachable")
    assert "reason" not in obj
    assert obj["code"] == 502


def test_explicit_reason_wins() -> None:
    assert status_object(409, "x", reason="AlreadyExists")["reason"] == "AlreadyExists"


def test_error_response_is_a_complete_http_message() -> None:
    data = error_response(403, "impersonation headers are not allowed", close=True)
    head_bytes, body = split(data)
    head = parse_response_head(head_bytes)
    assert head.status == 403
    assert head.reason == b"Forbidden"
    assert head.get(b"content-type") == b"application/json"
    assert head.get(b"connection") == b"close"
    assert not head.keep_alive
    tracker = framing_for_response(head, b"GET")
    assert isinstance(tracker, ContentLengthBody)
    assert tracker.feed(body) == len(body)
    assert tracker.complete
    assert json.loads(body)["message"] == "impersonation headers are not allowed"


def test_keep_alive_by_default() -> None:
    head = parse_response_head(split(error_response(404, "cluster not found"))[0])
    assert head.keep_alive
    assert head.get(b"connection") is None


@pytest.mark.parametrize("code", [429, 503])
def test_retry_after_for_429_and_503(code: int) -> None:
    head_bytes, body = split(error_response(code, "busy", retry_after=2))
    head = parse_response_head(head_bytes)
    assert head.get(b"retry-after") == b"2"
    assert json.loads(body)["details"] == {"retryAfterSeconds": 2}


def test_no_retry_after_for_other_codes() -> None:
    head_bytes, body = split(error_response(400, "bad", retry_after=2))
    assert parse_response_head(head_bytes).get(b"retry-after") is None
    assert "details" not in json.loads(body)


def test_head_only_keeps_content_length_without_body() -> None:
    full = error_response(404, "x")
    head_only = error_response(404, "x", head_only=True)
    assert full.startswith(head_only)
    assert head_only.endswith(b"\r\n\r\n")


def test_rule5_bearer_token_in_message_is_redacted() -> None:
    token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    body = status_body(401, f"bad Authorization: Bearer abc.def-ghi and {token}")
    assert b"abc.def-ghi" not in body
    assert token.encode() not in body
    assert b"Bearer [redacted]" in body


def test_message_control_characters_and_length_are_bounded() -> None:
    obj = status_object(400, "a\r\nInjected: 1" + "x" * 5000)
    message = obj["message"]
    assert isinstance(message, str)
    assert "\r" not in message and "\n" not in message
    assert len(message) <= MAX_MESSAGE
    data = error_response(400, "a\r\nInjected: 1")
    assert b"\r\nInjected" not in data


def test_scrubbing_keeps_our_own_wording_readable() -> None:
    body = json.loads(status_body(401, "a bearer token is required; only Bearer tokens"))
    assert body["message"] == "a bearer token is required; only Bearer tokens"
    leaked = json.loads(status_body(401, "got Bearer tokenABCDEF123 and bearer tok3n"))
    assert "tokenABCDEF123" not in leaked["message"]
    assert "tok3n" not in leaked["message"]
