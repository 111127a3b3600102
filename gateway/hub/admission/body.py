"""How large a request body may be (``--max-request-body``, DESIGN §6 rule 7): pure.

kube-apiserver refuses request bodies over 3 MiB (``MaxRequestBodyBytes``) with 413; the gateway
keeps the same limit at its edge so a caller cannot make it relay what the managed apiserver
would refuse anyway. A body whose ``Content-Length`` says it is too large is refused here,
before the hub is asked anything and before ``100 Continue`` could be sent. A chunked body has
no declared length: the front door counts its chunks as they stream
(``gateway.wire.http1.ChunkedBody(max_body=...)``) and ends the request with 413 there.
"""

from __future__ import annotations

from gateway.hub.config import DEFAULT_MAX_REQUEST_BODY
from gateway.wire.http1 import RequestHead

__all__ = ["DEFAULT_MAX_REQUEST_BODY", "BodyTooLarge", "check_body_size", "too_large_message"]


class BodyTooLarge(ValueError):
    """A request body over the limit (413)."""

    status = 413


def too_large_message(max_bytes: int) -> str:
    return f"the request body is larger than the gateway's limit of {max_bytes} bytes"


def check_body_size(head: RequestHead, max_bytes: int) -> None:
    """Raise :class:`BodyTooLarge` when ``Content-Length`` exceeds ``max_bytes``."""
    if head.content_length is not None and head.content_length > max_bytes:
        raise BodyTooLarge(too_large_message(max_bytes))
