"""The diagnostics log redacts credentials whatever logs them, and pins noisy libraries."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from gateway.ops import diagnostics
from gateway.ops.diagnostics import REDACTED, RedactingFilter, redact

JWT = ("eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZDpkIn0"
       ".c2lnbmF0dXJlLWJ5dGVz")


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer opaque-token-123", "opaque-token-123"),
        ("{'authorization': 'bearer opaque-token-123'}", "opaque-token-123"),
        ("Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.YWJjZGVm, v5", "YWJjZGVm"),
        (f"some text {JWT} more", JWT),
        ('{"token":"opaque-token-123","audiences":null}', "opaque-token-123"),
        ("{'token': 'opaque-token-123'}", "opaque-token-123"),
        ("GET /c1/version?token=opaque-token-123&x=1", "opaque-token-123"),
        ("password=hunter2-secret", "hunter2-secret"),
        ('{"client-key-data": "LS0tLS1CRUdJTi"}', "LS0tLS1CRUdJTi"),
    ],
)
def test_rule5_credentials_redacted(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and REDACTED in out


def test_rule5_review_bodies_dropped_whole() -> None:
    body = ('response body: b\'{"kind":"TokenReview","spec":{"token":"abc"},"status":{"user":'
            '{"username":"alice","uid":"u-1","groups":["g"]}}}\'')
    assert redact(body) == "<a TokenReview body, redacted>"
    sar = '{"kind":"SubjectAccessReview","spec":{"user":"alice","uid":"u-1"}}'
    assert "u-1" not in redact(sar)


def test_ordinary_messages_untouched() -> None:
    for text in ("cluster c1 connected", "hub TokenReview failed with HTTP 500",
                 "token file /var/run/token re-read", "--token-cache-ttl=10s"):
        assert redact(text) == text


def test_rule5_filter_redacts_args_and_exception_text_on_a_handler() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("test.diagnostics.library")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        logger.debug("headers: %s", {"Authorization": "Bearer opaque-token-123"})
        try:
            raise ValueError(f"bad token {JWT}")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert "opaque-token-123" not in text and JWT not in text
    assert "failed" in text and "ValueError" in text


@pytest.fixture
def configured_at_debug(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[logging.Handler]]:
    """``diagnostics.configure("debug")`` on a bare root logger; yields the handlers it
    installed (pytest adds its own to the root during the test). Every logger it touched is
    put back afterwards, the muted ``debug`` included."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    levels = {name: logging.getLogger(name).level for name in diagnostics.PINNED_LOGGERS}
    try:
        diagnostics.configure("debug")
        yield list(root.handlers)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for name in diagnostics.MUTED_DEBUG_LOGGERS:
            vars(logging.getLogger(name)).pop("debug", None)


def test_configure_pins_library_loggers_at_debug(
        configured_at_debug: list[logging.Handler]) -> None:
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("kubernetes_asyncio.client.rest").getEffectiveLevel() == logging.INFO
    assert configured_at_debug
    assert all(any(isinstance(f, RedactingFilter) for f in h.filters)
               for h in configured_at_debug)


def test_configure_mutes_hpack_debug_even_at_debug(configured_at_debug: list[logging.Handler],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """hpack logs each header field (tokens included) at DEBUG: at --log-level debug, encoding
    and decoding a block with a bearer token writes nothing, and costs no logging call."""
    import hpack

    out = io.StringIO()
    configured_at_debug[0].setStream(out)  # type: ignore[attr-defined]
    calls: list[object] = []
    monkeypatch.setattr(logging.Logger, "isEnabledFor",
                        lambda self, level: calls.append(self.name) or True)
    block = hpack.Encoder().encode([(":path", "/c1/api"),
                                    ("authorization", "Bearer opaque-token-123")])
    assert dict(hpack.Decoder().decode(block))["authorization"] == "Bearer opaque-token-123"
    assert not [name for name in calls if name.startswith("hpack")]
    assert out.getvalue() == ""
