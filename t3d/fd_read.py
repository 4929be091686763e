"""Reading a non-blocking descriptor (a provider's stdout pipe, a client's socket) without
a large allocation per read.

``os.read(fd, n)`` and ``socket.recv(n)`` allocate an ``n``-byte object before the system
call, even when the descriptor is empty (then it is freed at once), and shrink it to what
arrived afterwards. With ``n`` at 64 KiB, under the mmap threshold, every read takes a
block that size from the C heap and gives most of it back, hundreds of times a second at
PRIMARY 250, among blocks that live longer. After a start on a cold page cache, PRIMARY
250's RSS grew 86 -> 97 MiB in ten minutes so; with these reads it stayed at 74-77 MiB
(docs/benchmarks.md, round 6).

`read_now` reads instead into one reusable buffer per trio run and copies out only the
bytes that arrived. The buffer is shared by every reader of the run: that is safe because
it is filled and copied from in one synchronous call, with no checkpoint between. A
thread with a run of its own has a buffer of its own.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import trio

READ_BYTES = 65536
_BUFFER: trio.lowlevel.RunVar[memoryview] = trio.lowlevel.RunVar("t3d_read_buffer")


def read_now(fd: int, max_bytes: int = READ_BYTES) -> bytes:
    """Up to ``max_bytes`` (at most `READ_BYTES`) of what ``fd`` holds now; b"" at EOF.

    Raises BlockingIOError when it holds nothing, trio.ClosedResourceError when it is
    closed (-1 or EBADF), trio.BrokenResourceError on any other error.
    """
    if fd == -1:
        raise trio.ClosedResourceError("the descriptor was closed")
    try:
        buffer = _BUFFER.get()
    except LookupError:
        buffer = memoryview(bytearray(READ_BYTES))
        _BUFFER.set(buffer)
    try:
        size = os.readv(fd, (buffer[: min(max_bytes, READ_BYTES)],))
    except BlockingIOError:
        raise
    except OSError as exc:
        if exc.errno == errno.EBADF:
            raise trio.ClosedResourceError("the descriptor was closed") from None
        raise trio.BrokenResourceError(str(exc)) from exc
    return bytes(buffer[:size])


async def receive_some(fileno: Callable[[], int], max_bytes: int = READ_BYTES, *, wait_first: bool = False) -> bytes:
    """A trio stream's ``receive_some(max_bytes)`` through `read_now`, for the descriptor
    ``fileno()`` returns (-1 once closed, never a reused one): the next bytes (b"" at
    EOF), waiting for them if none are there. ``wait_first``: the caller knows it is
    empty (its last read took less than it asked for), so it waits before reading, one
    failing system call fewer. As trio's own, a cancelled caller reads nothing, and bytes
    read are never lost to a cancellation after the read; a read that did not wait still
    yields once."""
    await trio.lowlevel.checkpoint_if_cancelled()
    waited = False
    while True:
        fd = fileno()
        if waited or not wait_first:
            try:
                data = read_now(fd, max_bytes)
            except BlockingIOError:
                pass
            else:
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return data
        elif fd == -1:
            raise trio.ClosedResourceError("the descriptor was closed")
        await trio.lowlevel.wait_readable(fd)
        waited = True
