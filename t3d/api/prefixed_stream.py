"""A stream that replays bytes already read, so a protocol can start mid-conversation."""

from __future__ import annotations

from collections.abc import Callable

import trio

# A WebSocket close frame from a server: FIN set, opcode 8, unmasked.
_CLOSE_FRAME_START = 0x88
# How long a last frame (see `PrefixedStream.farewell`) may take to send.
_FAREWELL_SEND_S = 1.0


class PrefixedStream(trio.abc.Stream):
    """A stream that first yields ``prefix``, bytes already read from ``stream``, then reads on.

    Sending and closing go to ``stream``. A send that ``stream`` does not
    accept within ``send_timeout_s`` fails with BrokenResourceError.

    For WebSocket: ``farewell``, if set, is asked on closing for a close frame
    to send first, unless one was already sent. The WebSocket library sends
    each frame in one ``send_all``, so a close frame is seen by its first byte.
    """

    def __init__(self, prefix: bytes, stream: trio.abc.Stream, *, send_timeout_s: float) -> None:
        self._prefix = prefix
        self._stream = stream
        self._send_timeout_s = send_timeout_s
        self._receive_ended = trio.Event()
        self._close_frame_sent = False
        self._send_lock = trio.Lock()
        self.farewell: Callable[[], bytes | None] | None = None

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            size = len(self._prefix) if max_bytes is None else max_bytes
            chunk, self._prefix = self._prefix[:size], self._prefix[size:]
            return chunk
        try:
            data = await self._stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._receive_ended.set()
            raise
        if not data:
            self._receive_ended.set()
        return data

    async def wait_receive_ended(self) -> None:
        """Wait until the underlying stream has reached its end, failed or been closed."""
        await self._receive_ended.wait()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._send_lock:  # the farewell may come from another task
            if len(data) and data[0] == _CLOSE_FRAME_START:
                self._close_frame_sent = True
            with trio.move_on_after(self._send_timeout_s) as scope:
                await self._stream.send_all(data)
        if scope.cancelled_caught:
            raise trio.BrokenResourceError(f"the peer took no data for {self._send_timeout_s} s")

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        self._receive_ended.set()
        try:
            # Shielded and bounded: a close under cancellation still says goodbye, briefly.
            with trio.CancelScope(shield=True), trio.move_on_after(_FAREWELL_SEND_S):
                async with self._send_lock:
                    last = None if self._close_frame_sent else self.farewell and self.farewell()
                    if last:
                        self._close_frame_sent = True
                        await self._stream.send_all(last)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer is gone: there is no one to tell
        finally:
            await self._stream.aclose()
