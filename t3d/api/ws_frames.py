"""WebSocket text messages written straight to the connection's stream, many per write.

Theory of operation: trio-websocket frames each message in Python (wsproto: the
payload copied into a bytearray, the header built bit by bit) and writes it with
a socket send of its own, behind a lock, after our JSON bytes were decoded to a
str only to be encoded again. Here a server's text frame is two to ten bytes of
header before the payload (RFC 6455 5.2: no mask from a server, no extension
negotiated), so `encode_messages` builds the frames of every message ready for a
connection in one buffer, and `MessageWriter.send` writes it with one send. The
handshake, reading, pings and the close stay trio-websocket's.

Rules:
- Frames go through the connection's `PrefixedStream`, which serializes every
  write (ours and trio-websocket's), so frames never interleave.
- `MessageWriter.send_now` writes from synchronous code (the hub's publish): only
  when no write is in progress; what the socket does not take is the stream's
  backlog, written before anything else.
- Nothing is written once the close handshake has begun (trio-websocket sets its
  close reason before it writes a close frame, and that check is made under the
  stream's lock): the send raises `ConnectionClosed`, as ``send_message`` does. A
  peer gone (broken pipe, the send timeout) raises it too.
- The payloads are our own JSON (orjson's or spliced from it), so valid UTF-8; the
  writer does not check it again.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import trio
import trio_websocket

from t3d.api.prefixed_stream import PrefixedStream

_TEXT = 0x81  # FIN + opcode 1 (text)
_HEAD_7 = struct.Struct("!BB")
_HEAD_16 = struct.Struct("!BBH")
_HEAD_64 = struct.Struct("!BBQ")


def frame_header(length: int) -> bytes:
    """The header of one unmasked, final text frame of ``length`` payload bytes."""
    if length < 126:
        return _HEAD_7.pack(_TEXT, length)
    if length < 1 << 16:
        return _HEAD_16.pack(_TEXT, 126, length)
    return _HEAD_64.pack(_TEXT, 127, length)


def encode_messages(payloads: Sequence[bytes]) -> bytes:
    """Every payload as one text message, in order, in one buffer."""
    if len(payloads) == 1:
        return frame_header(len(payloads[0])) + payloads[0]
    pieces: list[bytes] = []
    for payload in payloads:
        pieces.append(frame_header(len(payload)))
        pieces.append(payload)
    return b"".join(pieces)


class MessageWriter:
    """Sends text messages on a server-side WebSocket (``ws``) over its ``stream``."""

    def __init__(self, ws: trio_websocket.WebSocketConnection, stream: PrefixedStream) -> None:
        self._ws = ws
        self._stream = stream

    def _closing(self) -> bool:
        return self._ws.closed is not None

    @property
    def ready_now(self) -> bool:
        """`send_now` would take messages now (open, and no write in progress or waiting)."""
        return self._ws.closed is None and self._stream.writable_now

    def send_now(self, payloads: Sequence[bytes]) -> int:
        """From synchronous code, when `ready_now`: hand the messages to the socket at
        once; what it does not take stays in the stream's backlog (sent by `flush`, or
        before the next send). Returns the backlog's size. Raises `ConnectionClosed` when
        the peer is gone."""
        try:
            self._stream.write_or_keep(encode_messages(payloads))
        except trio.BrokenResourceError:
            raise trio_websocket.ConnectionClosed(trio_websocket.CloseReason(1006, "the peer is gone")) from None
        return self._stream.backlog

    async def flush(self) -> None:
        """Send what `send_now` left over. Raises `ConnectionClosed` when the peer is gone."""
        try:
            await self._stream.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise trio_websocket.ConnectionClosed(trio_websocket.CloseReason(1006, "the peer is gone")) from None

    async def send(self, payloads: Sequence[bytes]) -> None:
        """Send each payload as a text message, all with one write. Raises `ConnectionClosed`
        once the connection is closing or the peer is gone."""
        if not payloads:
            return
        reason = self._ws.closed
        if reason is not None:
            raise trio_websocket.ConnectionClosed(reason)
        try:
            sent = await self._stream.send_all_unless(self._closing, encode_messages(payloads))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise trio_websocket.ConnectionClosed(
                trio_websocket.CloseReason(1006, "the peer is gone")
            ) from None
        if not sent:
            raise trio_websocket.ConnectionClosed(self._ws.closed)
