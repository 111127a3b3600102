"""One structured audit line per request, and stream start/end events (pure formatting).

Records are compact JSON objects logged at INFO on the logger ``hubproxy.audit``; a deployment
routes that logger wherever its audit trail lives. The ``hubproxy gateway`` command instead
installs an :class:`AuditWriter` (see :func:`install_writer`): the same lines, bare JSON, written
straight to its stream once per event-loop turn, because a ``logging`` record and a write per
request cost a fifth of the gateway's time on small requests. Fields (absent when unknown)::

    {"event":"request","ts":"2026-11-23T01:02:03.456Z","request_id":"...","user":"<hub user>",
     "cluster":"c1","method":"GET","path":"/api/v1/pods?watch=1","status":200,
     "bytes_in":0,"bytes_out":1234,"duration_ms":12.3, ...}

``event`` is ``request`` (a finished plain exchange), ``stream_start`` (a watch, ``logs -f`` or an
upgraded connection began) or ``stream_end`` (it ended; carries bytes and duration).

DESIGN §6 rule 5: the path is logged without secrets. Values of query parameters whose name
suggests a credential (``access_token``, ``token``, ``id_token``, ``authorization``, anything
containing ``token``, ``secret``, ``password``, ``passwd``, ``credential``, ``api_key``/``apikey``,
``signature``; exactly ``auth``, ``sig``, ``code``, ``key``) and any JWT-shaped value are
replaced by ``REDACTED``. Nothing else is decoded or rewritten. Callers pass hub user names,
never tokens; extra keyword fields are allowed but must not carry secrets either.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from typing import Any, TextIO
from urllib.parse import unquote_to_bytes

AUDIT_LOGGER = "hubproxy.audit"
ATOMIC_WRITE = 4096  # PIPE_BUF on Linux
logger = logging.getLogger(AUDIT_LOGGER)

REDACTED = "REDACTED"
MAX_PATH = 4096
_SECRET_NAMES = frozenset({"authorization", "auth", "sig", "code", "key"})
_SECRET_PARTS = (
    "token", "secret", "password", "passwd", "credential", "api_key", "apikey", "signature",
)
_JWT = re.compile(rb"eyJ[A-Za-z0-9_-]{4,}(?:(?:\.|%2[eE])[A-Za-z0-9_-]*){1,2}")


def _is_secret_param(name: bytes) -> bool:
    lowered = unquote_to_bytes(name.replace(b"+", b" ")).decode("utf-8", "replace").lower()
    lowered = lowered.strip()
    return lowered in _SECRET_NAMES or any(part in lowered for part in _SECRET_PARTS)


def redact_target(target: bytes) -> str:
    """The request-target as text, with credential-like query values replaced."""
    if b"?" not in target and b"eyJ" not in target:  # no query, nothing JWT-shaped: as is
        text = target.decode("ascii", "backslashreplace")
        if len(text) <= MAX_PATH:
            return text
    path, sep, query = target[: MAX_PATH * 2].partition(b"?")
    if sep:
        params = []
        for param in query.split(b"&"):
            name, eq, value = param.partition(b"=")
            if eq and (_is_secret_param(name) or _JWT.search(value)):
                value = REDACTED.encode()
            params.append(name + eq + value)
        query = b"&".join(params)
    path = _JWT.sub(REDACTED.encode(), path)
    text = (path + sep + query).decode("ascii", "backslashreplace")
    return text if len(text) <= MAX_PATH else text[: MAX_PATH - 3] + "..."


_second: tuple[int, str] = (-1, "")
_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))  # a timestamp's tail, formatted once


def _timestamp(now: float) -> str:
    global _second
    whole = int(now)
    if _second[0] != whole:  # one strftime per second, not per request
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return _second[1] + _MILLIS[int(now * 1000) % 1000]


def audit_record(
    event: str,
    *,
    request_id: str,
    user: str | None = None,
    cluster: str | None = None,
    method: bytes | str | None = None,
    target: bytes | None = None,
    status: int | None = None,
    bytes_in: int | None = None,
    bytes_out: int | None = None,
    duration: float | None = None,
    now: float | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The audit record as an ordered dict (``duration`` in seconds, logged in ms)."""
    record: dict[str, Any] = {
        "event": event,
        "ts": _timestamp(time.time() if now is None else now),
        "request_id": request_id,
    }
    if user is not None:
        record["user"] = user
    if cluster is not None:
        record["cluster"] = cluster
    if method is not None:
        if isinstance(method, bytes):
            method = method.decode("ascii", "replace")
        record["method"] = method
    if target is not None:
        record["path"] = redact_target(target)
    if status is not None:
        record["status"] = status
    if bytes_in is not None:
        record["bytes_in"] = bytes_in
    if bytes_out is not None:
        record["bytes_out"] = bytes_out
    if duration is not None:
        record["duration_ms"] = round(duration * 1000, 3)
    for key, value in fields.items():
        if value is not None:
            record[key] = value
    return record


# One encoder for every line: json.dumps with arguments builds a new encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, default=str)
_quote = json.encoder.encode_basestring_ascii  # a str as that encoder writes it (in C)


def format_record(record: dict[str, Any]) -> str:
    return _ENCODER.encode(record)


class LineMemo:
    """What a client connection's requests repeat in their audit lines (user, cluster,
    method, path, protocol, client, proxies), formatted once for the connection's last
    request: :func:`request_line` formats it again only when one of them changes. One per
    client connection, never shared between connections: it holds that connection's last
    path."""

    __slots__ = ("key", "middle", "tail")

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.middle = ""  # from ``,"user"`` through ``"path"``
        self.tail = ""  # from ``,"protocol"`` through the closing brace


def request_line(event: str, *, request_id: str, user: str | None, cluster: str | None,
                 method: bytes | None, target: bytes | None, status: int, bytes_in: int,
                 bytes_out: int, duration: float, protocol: str, client: str | None = None,
                 proxies: list[str] | None = None, now: float | None = None,
                 memo: LineMemo | None = None) -> str:
    """The line of a finished request (``request``, ``stream_end``): the same, character for
    character, as :func:`format_record` of :func:`audit_record` with these fields, written
    in one go (the gateway writes one per request; the generic way costs twice as much).
    ``memo``: the client connection's :class:`LineMemo`, for the fields its requests repeat."""
    ts = _timestamp(time.time() if now is None else now)
    duration_ms = round(duration * 1000, 3)
    # proxies as a tuple: a list the caller changed later must not match its old lines.
    key = (user, cluster, method, target, protocol, client,
           None if proxies is None else tuple(proxies))
    if memo is not None and memo.key == key:
        middle, tail = memo.middle, memo.tail
    else:
        middle = "".join((
            "" if user is None else f',"user":{_quote(user)}',
            "" if cluster is None else f',"cluster":{_quote(cluster)}',
            "" if method is None else f',"method":{_quote(method.decode("ascii", "replace"))}',
            "" if target is None else f',"path":{_quote(redact_target(target))}',
        ))
        tail = "".join((
            f',"protocol":{_quote(protocol)}',
            "" if client is None else f',"client":{_quote(client)}',
            "" if proxies is None else f',"proxies":{_ENCODER.encode(proxies)}',
            "}",
        ))
        if memo is not None:
            memo.key, memo.middle, memo.tail = key, middle, tail
    return (
        f'{{"event":{_quote(event)},"ts":"{ts}","request_id":{_quote(request_id)}{middle}'
        f',"status":{int(status)},"bytes_in":{int(bytes_in)},"bytes_out":{int(bytes_out)}'
        + (f',"duration_ms":{duration_ms!r}' if math.isfinite(duration_ms)
           else f',"duration_ms":{_ENCODER.encode(duration_ms)}')
        + tail
    )


class AuditWriter:
    """Audit lines to a text stream, batched: one write and flush per event-loop turn.

    Outside a running loop (start-up, shutdown, tests) each line is written at once. Nothing is
    held longer than the current loop turn, so a crash loses at most that turn's lines.
    """

    def __init__(self, stream: TextIO, *, atomic: bool = False) -> None:
        self.stream = stream
        # Several processes writing one pipe (gateway workers): a write of at most PIPE_BUF
        # bytes is never interleaved with another's, so batches are cut at line ends below it.
        self.max_write = ATOMIC_WRITE if atomic else 0
        self._pending: list[str] = []
        self._scheduled = False
        self.lost = 0  # lines a failed write lost
        # The loop the last batch was flushed on, while it runs: asyncio.get_running_loop()
        # is a getpid() system call on Python 3.11, and at one request in flight every request
        # starts a batch.
        self._loop: asyncio.AbstractEventLoop | None = None

    def write(self, line: str) -> None:
        self._pending.append(line)
        if self._scheduled:
            return
        loop = self._loop
        if loop is None or not loop.is_running():
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:
                self._loop = None
                self.flush()
                return
        self._scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        lines, self._pending = self._pending, []
        try:
            for chunk in self._chunks(lines):
                self.stream.write(chunk)
                self.stream.flush()
        except (OSError, ValueError) as exc:  # a closed or broken stream: say so once per batch
            self.lost += len(lines)
            logger.error("cannot write %d audit lines: %s", len(lines), exc)

    def _chunks(self, lines: list[str]) -> list[str]:
        if not self.max_write:
            return ["\n".join(lines) + "\n"]
        chunks: list[str] = []
        current: list[str] = []
        size = 0
        for line in lines:  # JSON lines are ASCII (ensure_ascii): characters are bytes
            if current and size + len(line) + 1 > self.max_write:
                chunks.append("\n".join(current) + "\n")
                current, size = [], 0
            current.append(line)
            size += len(line) + 1
        if current:
            chunks.append("\n".join(current) + "\n")
        return chunks


_writer: AuditWriter | None = None


def install_writer(writer: AuditWriter | None) -> None:
    """Send audit lines to ``writer`` instead of the ``hubproxy.audit`` logger (None: back)."""
    global _writer
    if _writer is not None:
        _writer.flush()
    _writer = writer


def emit(event: str, **kwargs: Any) -> str:
    """Build, format and log one record on ``hubproxy.audit``; returns the line."""
    line = format_record(audit_record(event, **kwargs))
    write(line)
    return line


def write(line: str) -> None:
    """Log a line already formatted (:func:`request_line`) on ``hubproxy.audit``."""
    if _writer is not None:
        _writer.write(line)
    else:
        logger.info(line)


def request_done(**kwargs: Any) -> str:
    """A finished request/response exchange."""
    return emit("request", **kwargs)


def stream_start(**kwargs: Any) -> str:
    """A long-lived exchange began (watch, follow, upgrade)."""
    return emit("stream_start", **kwargs)


def stream_end(**kwargs: Any) -> str:
    """A long-lived exchange ended."""
    return emit("stream_end", **kwargs)
