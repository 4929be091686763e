"""A command run in a real pseudo-terminal, for tests of interactive `t3d ctl` output.

`open_pty` starts the command as a session leader whose controlling terminal is the
pty's slave side (stdin, stdout and stderr all on it), so typing ``\\x03`` at the master
side makes the terminal send SIGINT, as Ctrl-C does. `PtyProcess.expect` reads what the
terminal shows until a pattern appears (with a deadline), keeping everything read.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

# Makes the pty (already on fd 0) the controlling terminal of a new session, then runs the
# command: what a terminal emulator does for its shell.
_LEADER = (
    "import fcntl, os, sys, termios\n"
    "os.setsid()\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execvpe(sys.argv[1], sys.argv[1:], os.environ)\n"
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@attrs.define
class PtyProcess:
    process: trio.Process
    master: int
    seen: bytearray = attrs.Factory(bytearray)
    consumed: int = 0  # how much of `text` earlier expects matched

    @property
    def text(self) -> str:
        """Everything shown so far, without colours and with plain newlines."""
        return ANSI.sub("", self.seen.decode("utf-8", "replace")).replace("\r\n", "\n")

    async def _read_some(self) -> bool:
        await trio.lowlevel.wait_readable(self.master)
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every slave side is closed (the process ended)
            return False
        self.seen += chunk
        return bool(chunk)

    async def expect(self, pattern: str, seconds: float = 60) -> re.Match[str]:
        """Wait until ``pattern`` (a regex) appears in the text shown after what earlier
        expects matched; fail with the whole text after ``seconds``."""
        start = self.consumed
        with trio.move_on_after(seconds):
            while True:
                match = re.compile(pattern).search(self.text, start)
                if match is not None:
                    self.consumed = match.end()
                    return match
                if not await self._read_some():
                    break
        raise AssertionError(f"{pattern!r} did not appear; the terminal shows:\n{self.text}")

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    async def wait(self, seconds: float = 60) -> int:
        """The exit status, reading the terminal until the process ends."""
        with trio.fail_after(seconds):
            async with trio.open_nursery() as nursery:

                async def drain() -> None:
                    while await self._read_some():
                        pass

                nursery.start_soon(drain)
                status = await self.process.wait()
                nursery.cancel_scope.cancel()
        return status


@asynccontextmanager
async def open_pty(argv: Sequence[str], *, env: dict[str, str], columns: int = 160, rows: int = 50) -> AsyncIterator[PtyProcess]:
    """Run ``argv`` on a new pty of ``columns`` x ``rows``; kill it at exit if it still runs."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    os.set_blocking(master, False)
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", _LEADER, *argv], stdin=slave, stdout=slave, stderr=slave, env=env
        )
    finally:
        os.close(slave)
    try:
        yield PtyProcess(process, master)
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            os.close(master)
