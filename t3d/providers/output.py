"""`ProviderOutput`: a provider process's stdout as lines, each with the byte offset just
past it, ended by the process's exit. Provider-neutral; the session driver parses lines.

Theory of operation. Offsets count bytes since the process's first byte of output. A
spawner's child can outlive a daemon; the next daemon reads its stdout again from
``child.replay.start`` (the last offset the previous daemon acked), so the offsets of
what it reads continue the old ones. Bytes up to ``child.replay.end`` are the *replay*
(what the child wrote before this daemon attached); `replayed` is set once every line
of it has been handed out.

Rules:
- `offset` is always just past the last complete line handed out: acking it never
  cuts a line in two.
- The exit of the process ends the stream, not EOF on a pipe someone else may hold: once
  the process has exited and the pipe has stayed empty for `STDOUT_DRAIN_S`, reading
  stops (a grandchild that inherited stdout cannot keep the turn open).
- Bounded: a line is at most ``max_line`` bytes (`LineBuffer`).
- One trip through the scheduler per read: a pipe is read straight from its
  descriptor, waiting for it to become readable only when it is empty (trio's
  ``receive_some`` yields before every read as well, so a line cost two trips).
  After a read that took less than it asked for (the pipe is empty), the next
  waits first instead of trying a read that fails (one system call fewer per
  line). A read that did not wait yields once first, so a provider that never
  stops writing cannot hold the loop. Reads go through `t3d.fd_read.receive_some`: no
  64 KiB allocation per read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from t3d.fd_read import READ_BYTES, receive_some
from t3d.providers.lines import DEFAULT_MAX_LINE, LineBuffer, LineTooLong
from t3d.spawn.child import Child

STDOUT_DRAIN_S = 2.0

OnLine = Callable[[bytes | LineTooLong], Awaitable[None]]


class ProviderOutput:
    def __init__(self, child: Child, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        self._child = child
        self._lines = LineBuffer(max_line)
        self.start = child.replay.start
        self.replay_end = child.replay.end
        self.offset = self.start
        self.last_output = trio.current_time()
        self.replayed = trio.Event()
        if self.replay_end <= self.start:
            self.replayed.set()
        self._receiving_since: float | None = None
        self._stopped = False
        # The last read took less than it asked for: the pipe was empty after it.
        self._drained = False

    @property
    def replaying(self) -> bool:
        """True while the line being handled was written before this daemon attached."""
        return self.offset <= self.replay_end and self.replay_end > self.start

    async def run(self, on_line: OnLine) -> None:
        """Hand every line to ``on_line`` until EOF, `stop`, or the process's exit (drained)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._close_after_exit)
                await self._read(on_line)
                nursery.cancel_scope.cancel()
        finally:
            self.replayed.set()

    async def stop(self) -> None:
        """Stop reading after the line being handled (the daemon detaches)."""
        self._stopped = True
        await self._child.stdout.aclose()

    async def _receive(self) -> bytes:
        """The next bytes of stdout (b"" at EOF); raises ClosedResourceError or
        BrokenResourceError as ``receive_some`` does."""
        stdout = self._child.stdout
        if not isinstance(stdout, trio.lowlevel.FdStream):
            return bytes(await stdout.receive_some(READ_BYTES))
        chunk = await receive_some(stdout.fileno, wait_first=self._drained)
        self._drained = len(chunk) < READ_BYTES
        return chunk

    async def _read(self, on_line: OnLine) -> None:
        position = self.start  # offset of the next byte to arrive
        while True:
            self._receiving_since = trio.current_time()
            try:
                chunk = await self._receive()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            finally:
                self._receiving_since = None
            if not chunk:
                break
            self.last_output = trio.current_time()
            begin = 0
            while (newline := chunk.find(b"\n", begin)) != -1:
                line = self._lines.complete(chunk, begin, newline)
                self.offset = position + newline + 1
                if line is not None:
                    await on_line(line)
                if self.offset >= self.replay_end:
                    self.replayed.set()
                if self._stopped:
                    return
                begin = newline + 1
            if begin < len(chunk):
                self._lines.feed(chunk[begin:])
            position += len(chunk)
        final = self._lines.eof()
        if final is not None and not self._stopped:
            self.offset = position
            await on_line(final)

    async def _close_after_exit(self) -> None:
        await self._child.wait()
        while True:
            since = self._receiving_since
            if since is not None and trio.current_time() - since >= STDOUT_DRAIN_S:
                break
            await trio.sleep(STDOUT_DRAIN_S / 4)
        await self._child.stdout.aclose()
