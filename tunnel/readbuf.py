"""Where a session's received bytes wait until they form whole frames (issue 22).

A fleet of idle sessions must not hold a frame-sized buffer each (512 KiB, most of what a
session cost before). So a session owns memory only while a frame is incomplete:

* Reads land in a **scratch** buffer shared by every session of the thread. That is safe because
  ``get_buffer`` and ``buffer_updated`` come in synchronous pairs (asyncio's and uvloop's SSL
  transports, and the plain transports, call ``get_buffer``, read into it and call
  ``buffer_updated`` before any other callback runs), and the session parses the bytes before
  ``buffer_updated`` returns. A read that arrives while the scratch is being parsed (a consumer
  triggering another session's read) gets a private buffer instead.
* The bytes of an incomplete frame are kept in a **private** buffer sized for that frame (its
  length is known once its 12-byte header is in; a lone partial header gets a small one), and
  later reads go straight into it, so a frame larger than anything before is read without a
  copy after the first.
* A private buffer is given back as soon as it is empty after a small read (control frames:
  the session has gone quiet); while reads stay large (bulk) it is kept and reused, at most
  ``2 x (max frame + header)``, as before this module.

``get_buffer`` never returns an empty buffer: asyncio's SSL transport would take a zero-byte
read for the peer's close_notify, uvloop's would stop reading.

Pure (no I/O, no event loop): the adapter (:class:`tunnel.connection.TunnelSession`) calls
:meth:`ReceiveBuffer.get_buffer`, then :meth:`received` to get the bytes to parse, then
:meth:`consumed` with how many it parsed.
"""

from __future__ import annotations

import threading

from tunnel.frames import HEADER, HEADER_SIZE

SMALL_READ = 16 * 1024  # a read below this that leaves nothing pending frees the private buffer
MIN_PRIVATE = 4096  # the smallest private buffer (a partial header, a small frame)
MIN_FREE = HEADER_SIZE + 4096  # room always offered to a read (else compact or grow)
SCRATCH_SIZE = 256 * 1024  # the shared buffer's size at least (uvloop reads up to 256 KiB)


class _Scratch(threading.local):
    """The thread's shared read buffer (one event loop per thread)."""

    def __init__(self) -> None:
        self.buf = bytearray(0)
        self.busy = False  # being parsed: a nested read must not land here

    def view(self, size: int) -> memoryview:
        if len(self.buf) < size:
            self.buf = bytearray(size)
        return memoryview(self.buf)


_scratch = _Scratch()


class ReceiveBuffer:
    """One session's unparsed bytes (see the module docstring)."""

    __slots__ = ("_buf", "_end", "_in_scratch", "_start", "bulk_size")

    def __init__(self, max_frame_size: int) -> None:
        # The most a private buffer grows to while reads stay large: one maximum frame being
        # completed plus the next one's start, as one read may end anywhere.
        self.bulk_size = 2 * (max_frame_size + HEADER_SIZE)
        self._buf: bytearray | None = None
        self._start = 0
        self._end = 0
        self._in_scratch = False

    @property
    def held(self) -> int:
        """Bytes of memory this session owns for reading (0 while idle)."""
        return len(self._buf) if self._buf is not None else 0

    @property
    def pending(self) -> int:
        """Bytes received and not yet parsed (an incomplete frame)."""
        return self._end - self._start

    def get_buffer(self) -> memoryview:
        """Where the next read goes: the scratch (nothing pending), else the private buffer,
        grown or compacted so the rest of the pending frame fits."""
        if self._buf is None and not _scratch.busy:
            self._in_scratch = True
            return _scratch.view(max(SCRATCH_SIZE, self.bulk_size))
        self._in_scratch = False
        if self._buf is None:  # nested read while the scratch is parsed: a buffer of its own
            self._buf = bytearray(MIN_PRIVATE)
        need = min(self._frame_size(), self.bulk_size)
        buf = self._buf
        if len(buf) - self._start < need or len(buf) - self._end < MIN_FREE:
            pending = self._end - self._start
            size = max(len(buf), need, pending + MIN_FREE)
            if size > len(buf):
                grown = bytearray(size)
                grown[:pending] = buf[self._start:self._end]
                self._buf = buf = grown
            else:
                buf[:pending] = buf[self._start:self._end]
            self._start, self._end = 0, pending
        return memoryview(buf)[self._end:]

    def received(self, nbytes: int) -> memoryview:
        """``nbytes`` were read into the last :meth:`get_buffer`: every unparsed byte, to parse
        now (a view: parse before returning to the event loop, then call :meth:`consumed`)."""
        if self._in_scratch:
            _scratch.busy = True
            return memoryview(_scratch.buf)[:nbytes]
        self._end += nbytes
        assert self._buf is not None
        return memoryview(self._buf)[self._start:self._end]

    def consumed(self, parsed: int, view: memoryview, nbytes: int) -> None:
        """``parsed`` bytes of ``view`` (from :meth:`received` after a read of ``nbytes``) were
        whole frames; the rest is kept for the next read."""
        rest = len(view) - parsed
        if self._in_scratch:
            self._in_scratch = False
            _scratch.busy = False
            if rest:
                # (the parser has checked a complete header's length against the maximum)
                need = min(_frame_size(view[parsed:]), self.bulk_size)
                size = max(MIN_PRIVATE, need, min(self.bulk_size, 2 * nbytes))
                self._buf = bytearray(size)
                self._buf[:rest] = view[parsed:]
                self._start, self._end = 0, rest
            return
        self._start += parsed
        if rest:
            return
        self._start = self._end = 0
        if nbytes < SMALL_READ:
            self._buf = None  # quiet again: hold nothing

    def release(self) -> None:
        """Drop what this session holds (it ended, or its bytes failed to parse), and give the
        scratch back if its bytes were being parsed there."""
        self._buf = None
        self._start = self._end = 0
        if self._in_scratch:
            self._in_scratch = False
            _scratch.busy = False

    def _frame_size(self) -> int:
        assert self._buf is not None
        return _frame_size(memoryview(self._buf)[self._start:self._end])


def _frame_size(pending: memoryview) -> int:
    """Bytes of the whole frame that ``pending`` starts (a header's worth until it is in)."""
    if len(pending) < HEADER_SIZE:
        return HEADER_SIZE
    return HEADER_SIZE + int(HEADER.unpack_from(pending)[0])
