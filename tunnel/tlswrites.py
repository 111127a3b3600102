"""How a flush's frames are handed to a TLS transport (pure: pieces in, pieces out).

A TLS transport encrypts each piece given to ``writelines`` on its own: one ``SSL_write``, at
least one TLS record (header and tag), and on the peer one ``SSL_read`` per record. The tunnel's
flush is a list of 12-byte frame headers, control frames and payloads side by side, so written
as it is, a small response costs the session half a dozen records each way. Pieces smaller than
``COPY_BELOW`` are therefore joined into one (a copy of a few KiB costs less than a record);
larger pieces are passed as they are, since TLS splits them into full records anyway and copying
them would cost more than the record it saves.
"""

from __future__ import annotations

from collections.abc import Sequence

Piece = bytes | bytearray | memoryview

# A TLS record carries at most 16 KiB: a piece this large fills records on its own.
COPY_BELOW = 16 * 1024


def tls_pieces(pieces: Sequence[Piece], copy_below: int = COPY_BELOW) -> list[Piece]:
    """``pieces`` with every run of small neighbours joined into one; the bytes and their order
    are unchanged. Large pieces are never copied."""
    out: list[Piece] = []
    run: list[Piece] = []
    for piece in pieces:
        if len(piece) < copy_below:
            run.append(piece)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        out.append(piece)
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out
