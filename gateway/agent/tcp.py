"""Raw TCP relay for ``TCPTarget`` streams, and the refusal protocol for refused opens.

:class:`RawRelay` dials the address the policy resolved (never a name the hub sent), accepts
the stream, then copies bytes both ways with half-close and back-pressure (stream window full
-> stop reading the socket; socket buffer full -> stop reading the stream). A reset stream
aborts the socket; a socket error resets the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tunnel.errors import OpenErrorCode, OpenRefused, ResetCode, StreamError

log = logging.getLogger(__name__)


class Refusal:
    """A StreamProtocol that refuses its stream with a typed code as soon as it is made."""

    def __init__(self, code: OpenErrorCode, message: str) -> None:
        self.code = code
        self.message = message

    def connection_made(self, stream: Any) -> None:
        stream.refuse(self.code, self.message)

    def data_received(self, data: bytes | memoryview) -> None:
        pass

    def eof_received(self) -> None:
        pass

    def connection_lost(self, exc: StreamError | None) -> None:
        pass

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


class _Socket(asyncio.Protocol):
    def __init__(self, relay: RawRelay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses; no isinstance check)
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.relay.stream.write(data)

    def eof_received(self) -> bool:
        self.relay.stream.write_eof()
        return True  # keep our sending direction open: half-close

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.socket_lost(exc)

    def pause_writing(self) -> None:
        self.relay.stream.pause_reading()

    def resume_writing(self) -> None:
        self.relay.stream.resume_reading()


class RawRelay:
    def __init__(
        self,
        resolve: Callable[[], Awaitable[Any]],
        connect_timeout: float,
        on_done: Callable[[Any], None] | None = None,
    ) -> None:
        self._resolve = resolve
        self.connect_timeout = connect_timeout
        self.on_done = on_done
        self.stream: Any = None
        self.sock: _Socket | None = None
        self.outcome = ""
        self._pending: list[bytes] = []
        self._eof_pending = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, stream: Any) -> None:
        self.stream = stream
        stream.pause_reading()  # nothing to write to until the socket is up
        self._task = asyncio.get_running_loop().create_task(self._dial())

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            resolved = await self._resolve()
            async with asyncio.timeout(self.connect_timeout):
                _, sock = await loop.create_connection(
                    lambda: _Socket(self), resolved.host_ip, resolved.port
                )
        except OpenRefused as exc:
            self._refuse(exc.code, exc.message)
            return
        except TimeoutError:
            self._refuse(OpenErrorCode.TIMEOUT, "connect timed out")
            return
        except OSError as exc:
            self._refuse(OpenErrorCode.UNREACHABLE, f"connect failed: {exc.strerror or exc}")
            return
        except Exception:
            log.exception("tcp relay: dial failed")
            self._refuse(OpenErrorCode.INTERNAL, "agent error")
            return
        if self._closed:
            if sock.transport is not None:
                sock.transport.abort()
            return
        self.sock = sock
        self.outcome = "relayed"
        self.stream.accept()
        assert sock.transport is not None
        for chunk in self._pending:
            sock.transport.write(chunk)
        self._pending.clear()
        if self._eof_pending:
            sock.transport.write_eof()
        self.stream.resume_reading()

    def _refuse(self, code: OpenErrorCode, message: str) -> None:
        self.outcome = f"refused {code.name}"
        if not self._closed:
            self.stream.refuse(code, message)

    def data_received(self, data: bytes | memoryview) -> None:
        if self.sock is None or self.sock.transport is None:
            self._pending.append(bytes(data))
        elif not self.sock.transport.is_closing():
            self.sock.transport.write(data)

    def eof_received(self) -> None:
        if self.sock is None or self.sock.transport is None:
            self._eof_pending = True
        elif not self.sock.transport.is_closing():
            self.sock.transport.write_eof()

    def connection_lost(self, exc: StreamError | None) -> None:
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.sock is not None and self.sock.transport is not None:
            if exc is not None:
                self.sock.transport.abort()
            else:
                self.sock.transport.close()
        if self.on_done is not None:
            callback, self.on_done = self.on_done, None
            callback(self)

    def pause_writing(self) -> None:
        if self.sock is not None and self.sock.transport is not None:
            self.sock.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.sock is not None and self.sock.transport is not None:
            self.sock.transport.resume_reading()

    def socket_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        if exc is not None:
            self.stream.reset(ResetCode.CANCEL)
        else:
            self.stream.write_eof()
