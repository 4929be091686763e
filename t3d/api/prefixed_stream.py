"""A stream that replays bytes already read, so a protocol can start mid-conversation."""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

Buffer = bytes | bytearray | memoryview

# A WebSocket close frame from a server: FIN set, opcode 8, unmasked.
_CLOSE_FRAME_START = 0x88
# How long a last frame (see `PrefixedStream.farewell`) may take to send.
_FAREWELL_SEND_S = 1.0


def _never() -> bool:
    return False


def write_now(stream: trio.abc.SendStream, data: Buffer, *more: Buffer) -> int:
    """Write to ``stream``'s socket what the kernel takes at once of ``data`` and then
    ``more`` (one system call, no copy to join them; no wait, no trip through the
    scheduler); the bytes written (0 for a stream that is not a socket). Raises
    BrokenResourceError when the peer is gone. The caller must be the only sender."""
    if not isinstance(stream, trio.SocketStream) or stream.socket.did_shutdown_SHUT_WR:
        return 0
    fd = stream.socket.fileno()
    if fd == -1:
        return 0
    try:
        return os.writev(fd, (data, *more)) if more else os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:  # EPIPE, ECONNRESET: the peer is gone
        raise trio.BrokenResourceError(f"the peer is gone ({exc})") from exc


class PrefixedStream(trio.abc.Stream):
    """A stream that first yields ``prefix``, bytes already read from ``stream``, then reads on.

    Sending and closing go to ``stream``. A send that ``stream`` does not
    accept within ``send_timeout_s`` fails with BrokenResourceError. Sends are
    serialized (a lock, taken at once when free), so the WebSocket library's
    writes and ours (t3d/api/ws_frames.py) never interleave. On a socket, what
    the kernel takes at once is written without a trip through the scheduler
    (one non-blocking write); only the rest waits, through ``stream``.

    For WebSocket: ``farewell``, if set, is asked on closing for a close frame
    to send first, unless one was already sent (after the rest of a frame
    begun, if any). The WebSocket library sends each frame in one ``send_all``,
    so a close frame is seen by its first byte.
    """

    def __init__(self, prefix: bytes, stream: trio.abc.Stream, *, send_timeout_s: float) -> None:
        self._prefix = prefix
        self._stream = stream
        self._send_timeout_s = send_timeout_s
        self._receive_ended = trio.Event()
        self._close_frame_sent = False
        # Every send (the farewell may come from another task); taken at once when free.
        self._send_lock = trio.Lock()
        self.farewell: Callable[[], bytes | None] | None = None
        # The rest of a `write_or_keep` the socket did not take: it goes before any other write.
        self._backlog: bytes | memoryview = b""

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
        await self.send_all_unless(_never, data)

    async def send_all_unless(self, stop: Callable[[], bool], data: bytes | bytearray | memoryview) -> bool:
        """`send_all`, unless ``stop()`` is true once it is this send's turn: then send
        nothing and return False."""
        lock = self._send_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            await self._send_backlog()  # a frame begun must end before anything else
            if stop():
                return False
            if len(data) and data[0] == _CLOSE_FRAME_START:
                self._close_frame_sent = True
            sent = write_now(self._stream, data)
            if sent < len(data):
                await self._send(memoryview(data)[sent:])
            return True
        finally:
            lock.release()

    @property
    def writable_now(self) -> bool:
        """No write is in progress and none waits: `write_or_keep` would take bytes now."""
        return not self._send_lock.locked() and not self._backlog

    @property
    def backlog(self) -> int:
        """Bytes a `write_or_keep` left to send (`flush` sends them)."""
        return len(self._backlog)

    def write_or_keep(self, data: bytes) -> None:
        """Without waiting (from synchronous code), when `writable_now`: write what the
        socket takes and keep the rest as the backlog, which goes before any other write
        (`flush`, or the next send). Raises BrokenResourceError when the peer is gone."""
        assert self.writable_now, "write_or_keep while another write is in progress"
        sent = write_now(self._stream, data)
        if sent < len(data):
            self._backlog = memoryview(data)[sent:]

    async def flush(self) -> None:
        """Send the backlog, if any."""
        if not self._backlog:
            return
        lock = self._send_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            await self._send_backlog()
        finally:
            lock.release()

    async def _send_backlog(self) -> None:
        while self._backlog:
            data, self._backlog = self._backlog, b""
            await self._send(data)

    async def _send(self, data: bytes | bytearray | memoryview) -> None:
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
                        await self._send_backlog()  # the frame begun ends first
                        await self._stream.send_all(last)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer is gone: there is no one to tell
        finally:
            await self._stream.aclose()
