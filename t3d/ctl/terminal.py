"""The terminal side of `t3d ctl`: writing to stdout and stderr, reading typed lines.

Output is flushed at once (a person or a pipe is watching); lines typed at the
terminal are read by one worker thread at a time (`StdinLines`).
"""

from __future__ import annotations

import sys

import trio


def out(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def err(text: str) -> None:
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def read_stdin_line() -> str | None:
    try:
        return input()
    except EOFError:
        return None


class StdinLines:
    """Lines typed at the terminal, read by one worker thread at a time.

    A withdrawn question abandons its read, but the thread stays blocked in
    ``input()``; the line it returns goes to the next question only if it
    was typed after that question appeared.
    """

    def __init__(self) -> None:
        self._wanted = trio.Event()
        self._send, self._recv = trio.open_memory_channel[tuple[float, str]](1)

    async def pump(self) -> None:
        async with self._send:
            while True:
                await self._wanted.wait()
                self._wanted = trio.Event()
                line = await trio.to_thread.run_sync(read_stdin_line, abandon_on_cancel=True)
                if line is None:
                    return  # end of input: every later question reads None
                await self._send.send((trio.current_time(), line))

    async def read_line(self, *, since: float) -> str | None:
        while True:
            self._wanted.set()
            try:
                at, line = await self._recv.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return None
            if at >= since:
                return line
