"""An agent's output, relayed through the spawner so that no daemon death loses it. Pure
bookkeeping plus non-blocking reads and writes on descriptors the caller's selector watches.

Theory of operation. The spawner owns the read ends of a long-lived child's stdout and
stderr. The daemon attached to the child gets the read end of a fresh pipe per stream
(its *sink* here), and the spawner copies the child's output into it. A daemon that goes
away takes only its sink with it: the child keeps writing into pipes the spawner holds,
and the next daemon attaches and gets a new sink.

stdout (`OutputRelay`) is counted in bytes from the child's first byte (absolute
offsets). Every byte read stays in the *replay buffer* until the daemon acks it; the
buffer holds ``[base, end)``. On attach the daemon's sink is fed from ``base``, so the new
daemon re-reads everything it has not acked (a turn in progress, from its start) and then
the live output. ``sent`` is how far the current sink has been fed.

Rules (the policy at each bound):
- Attached: the child is read only while less than `FORWARD_AHEAD` bytes wait to be
  forwarded, so a daemon that stops reading stops the child on its pipe (backpressure,
  as without the spawner). A buffer over its bound (or the spawner-wide budget) drops its
  oldest already-forwarded bytes and is marked incomplete: a later attach cannot replay
  from the daemon's last ack any more, and says so.
- Detached: the child is read until the buffer reaches its bound (or the budget is
  spent), then not at all: the agent waits on its pipe and nothing is lost.
- The budget may be passed by at most one read (`READ_CHUNK`) per child; an attached
  child's buffer may pass its own bound by the bytes not yet forwarded.
- stderr (`TailRelay`) never holds the child up: it is always read, its last
  `STDERR_TAIL` bytes are kept and replayed first to a new sink, and at most
  `STDERR_PENDING` bytes wait for a slow sink (the oldest are dropped).
"""

from __future__ import annotations

import os
from collections import deque

READ_CHUNK = 64 * 1024
FORWARD_AHEAD = 64 * 1024
DEFAULT_REPLAY_BOUND = 16 * 1024 * 1024
DEFAULT_REPLAY_BUDGET = 256 * 1024 * 1024
STDERR_TAIL = 8 * 1024
STDERR_PENDING = 64 * 1024


class Budget:
    """Bytes held in replay buffers across the spawner, against one limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class OutputRelay:
    """The child's stdout: the replay buffer and the feed into the attached daemon's sink."""

    def __init__(self, source: int, bound: int, budget: Budget) -> None:
        os.set_blocking(source, False)
        self.source: int | None = source
        self.sink: int | None = None
        self.bound = bound
        self._budget = budget
        self._buffer = bytearray()
        self.base = 0
        self.sent = 0
        # False once bytes the daemon had not acked were dropped at the bound.
        self.complete = True

    @property
    def end(self) -> int:
        return self.base + len(self._buffer)

    def wants_read(self) -> bool:
        if self.source is None:
            return False
        if self.sink is not None:
            return self.end - self.sent < FORWARD_AHEAD
        return len(self._buffer) < self.bound and self._budget.used < self._budget.limit

    def wants_write(self) -> bool:
        return self.sink is not None and self.sent < self.end

    def watching(self) -> tuple[bool, bool]:
        """What the selector should watch: (read the source, write the sink)."""
        return (self.source is not None and self.wants_read(), self.sink is not None and self.wants_write())

    def done(self) -> bool:
        """The source is closed and everything read has gone to the sink (or there is none)."""
        return self.source is None and not self.wants_write()

    def read(self) -> bool:
        """One non-blocking read from the child; True at EOF (then `take_source`)."""
        assert self.source is not None
        size = READ_CHUNK if self.sink is not None else max(1, min(READ_CHUNK, self.bound - len(self._buffer)))
        try:
            data = os.read(self.source, size)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            return True
        self._buffer += data
        self._budget.used += len(data)
        if self.sink is not None:
            over = max(len(self._buffer) - self.bound, self._budget.used - self._budget.limit)
            if over > 0:
                self._drop(min(over, self.sent - self.base))
        return False

    def write(self) -> bool:
        """Forward what waits to the sink; True when the sink is broken (its daemon is
        gone: then `detach`)."""
        assert self.sink is not None
        start = self.sent - self.base
        try:
            self.sent += os.write(self.sink, memoryview(self._buffer)[start : start + READ_CHUNK])
        except BlockingIOError:
            pass
        except OSError:  # EPIPE: the daemon closed its end
            return True
        return False

    def _drop(self, count: int) -> None:
        if count <= 0:
            return
        del self._buffer[:count]
        self.base += count
        self._budget.used -= count
        self.complete = False

    def ack(self, offset: int) -> None:
        """Forget the bytes before ``offset`` (the daemon has committed what they said).
        Raises ValueError for an offset the daemon cannot have read yet."""
        if offset > self.sent:
            raise ValueError(f"offset {offset} is past the {self.sent} bytes sent")
        if offset > self.base:
            count = offset - self.base
            del self._buffer[:count]
            self.base = offset
            self._budget.used -= count
            self.complete = True

    def attach(self, sink: int) -> int | None:
        """Feed ``sink`` from the start of the buffer; returns the previous sink to close."""
        os.set_blocking(sink, False)
        previous, self.sink = self.sink, sink
        self.sent = self.base
        return previous

    def detach(self) -> int | None:
        """No daemon reads any more: keep the buffer; returns the sink to close."""
        previous, self.sink = self.sink, None
        self.sent = self.base
        return previous

    def take_source(self) -> int | None:
        source, self.source = self.source, None
        return source

    def release(self) -> None:
        """The child is forgotten: give its buffer back to the budget."""
        self._budget.used -= len(self._buffer)
        self._buffer = bytearray()


class TailRelay:
    """The child's stderr: always read, the tail kept, forwarded when the sink takes it."""

    def __init__(self, source: int) -> None:
        os.set_blocking(source, False)
        self.source: int | None = source
        self.sink: int | None = None
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._pending = bytearray()

    def wants_read(self) -> bool:
        return self.source is not None

    def wants_write(self) -> bool:
        return self.sink is not None and bool(self._pending)

    def watching(self) -> tuple[bool, bool]:
        return (self.source is not None, self.wants_write())

    def done(self) -> bool:
        return self.source is None and not self.wants_write()

    def read(self) -> bool:
        assert self.source is not None
        try:
            data = os.read(self.source, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            return True
        self._tail.append(data)
        self._tail_bytes += len(data)
        while self._tail_bytes - len(self._tail[0]) >= STDERR_TAIL:
            self._tail_bytes -= len(self._tail.popleft())
        if self.sink is not None:
            self._pending += data
            if len(self._pending) > STDERR_PENDING:
                del self._pending[: len(self._pending) - STDERR_PENDING]
        return False

    def write(self) -> bool:
        assert self.sink is not None
        try:
            del self._pending[: os.write(self.sink, self._pending)]
        except BlockingIOError:
            pass
        except OSError:
            return True
        return False

    def attach(self, sink: int) -> int | None:
        os.set_blocking(sink, False)
        previous, self.sink = self.sink, sink
        self._pending = bytearray(b"".join(self._tail)[-STDERR_TAIL:])
        return previous

    def detach(self) -> int | None:
        previous, self.sink = self.sink, None
        self._pending = bytearray()
        return previous

    def take_source(self) -> int | None:
        source, self.source = self.source, None
        return source
