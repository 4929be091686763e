"""A long-lived child of the spawner (an agent) and what the spawner keeps of it.

The spawner holds, for the child's whole life, the write end of its stdin (so no daemon
death closes it), the read ends of its stdout and stderr (`spawner.relay`), a pidfd, and
the daemon's ``meta`` (opaque to the spawner: which thread, session and turn the child
serves). A daemon *owns* a child it spawned or adopted, and is *attached* to it while it
holds the child's sinks.

Lifetime rules:
- Exit: the pidfd says the child is gone; its stdout and stderr are still read for
  `EXIT_DRAIN_S` (a grandchild holding them open cannot keep the child's record alive),
  then closed. An attached child is forgotten once everything read has gone to its
  daemon (the daemon then sees EOF); one that nobody reads is kept, with its output,
  for its orphan grace, so a daemon that comes back in time still learns how it ended.
- Orphans: a child whose owner went away waits ``grace`` seconds to be adopted; then a
  live one gets TERM, and KILL `KILL_AFTER_S` later.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from typing import Any, Protocol

from spawner.relay import Budget, OutputRelay, TailRelay

EXIT_DRAIN_S = 1.0
KILL_AFTER_S = 5.0


class Owner(Protocol):
    """The connection of the daemon that owns a child."""

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None: ...
    def gone(self) -> bool: ...


class Child:
    def __init__(
        self,
        child_id: int,
        popen: subprocess.Popen[bytes],
        pidfd: int,
        fds: tuple[int, int, int],
        *,
        tag: str,
        meta: dict[str, Any],
        grace: float,
        owner: Owner,
        bound: int,
        budget: Budget,
    ) -> None:
        self.id = child_id
        self.popen = popen
        self.pidfd = pidfd
        self.stdin: int | None = fds[0]
        self.out = OutputRelay(fds[1], bound, budget)
        self.err = TailRelay(fds[2])
        self.tag = tag
        self.meta = meta
        self.grace = grace
        self.owner: Owner | None = owner
        self.attached = False
        self.argv0 = str(popen.args[0])  # type: ignore[index]
        self.started = time.time()
        self.orphaned_at: float | None = None
        self.term_sent_at: float | None = None
        self.returncode: int | None = None
        self.exited_at: float | None = None
        # fd -> events, as registered in the spawner's selector (main thread only).
        self.registered: dict[int, int] = {}

    def describe(self) -> dict[str, Any]:
        return {
            "child": self.id,
            "pid": self.popen.pid,
            "tag": self.tag,
            "argv0": self.argv0,
            "started": self.started,
            "meta": self.meta,
            "returncode": self.returncode,
            "start": self.out.base,
            "end": self.out.end,
            "complete": self.out.complete,
        }

    def drained(self, now: float) -> bool:
        """Exited, and its output is either all read or no longer waited for."""
        if self.exited_at is None:
            return False
        return (self.out.source is None and self.err.source is None) or now - self.exited_at >= EXIT_DRAIN_S

    def sinks_done(self) -> bool:
        return self.out.done() and self.err.done()

    def forgettable(self, now: float) -> bool:
        """Exited, drained, and either read to the end by its daemon or unread past its grace."""
        if self.exited_at is None or self.out.source is not None or self.err.source is not None:
            return False
        if self.attached and self.owner is not None:
            return self.sinks_done()
        if self.term_sent_at is not None:  # stopped for want of a daemon: nobody will ask
            return True
        since = self.exited_at if self.orphaned_at is None else max(self.exited_at, self.orphaned_at)
        return now - since >= self.grace

    def close_stdin(self) -> None:
        if self.stdin is not None:
            with contextlib.suppress(OSError):
                os.close(self.stdin)
            self.stdin = None
