"""The checkpointer: copies the WAL into the database on its own thread and connection,
so that no writer commit pays for it.

Why: with SQLite's auto-checkpoint, the commit that leaves over 1,000 pages in the WAL
copies them into the database file itself, with its fsync, before the writer takes the
next job. On a large file those pages are scattered: pruning the 4 M-event database,
one retention step in ten took 26 to 34 ms instead of 9 because of it, and every command
queued behind it waited as long (docs/benchmarks.md).

Why not always: on a small or fresh file a checkpoint is cheap (a few ms), and the
thread's rounds, each with its own fsyncs, plus the commit that finishes each one, cost
the daemon more than the inline checkpoint did (PRIMARY 250 on a fresh database: dispatch
p50 and health p99 up 1-3 ms, CPU per turn up a tenth). So the thread takes over only
while checkpoints are slow.

Rules:
- `install` replaces the writer connection's auto-checkpoint by a WAL hook (SQLite calls
  it after each commit, on the writer thread, with the WAL's pages). Each time the WAL
  has grown by `WAL_PAGES` since the last mark (or since it started again), a checkpoint
  is due (PASSIVE: it never waits for readers or the writer).
- Where it runs: while the last checkpoint took at most `SLOW_S`, the commit at the mark
  runs it itself, as SQLite's auto-checkpoint would. Once one takes longer, the hook wakes
  this thread instead, which checkpoints on its own connection while the writer keeps
  appending (WAL mode allows a checkpoint beside the one writer); when the thread's
  rounds are quick again, the commits take the checkpoints back. The first is inline.
- Finishing (thread rounds): the WAL starts again from its beginning only once every
  frame in it is in the database, and the thread's checkpoint leaves out the frames
  appended while it ran. So the first commit after it checkpoints those few itself
  (PASSIVE) if they are at most `FINISH_PAGES`, and the writer's next transaction starts
  the WAL again; if more are left, the thread goes again at once, for what was appended
  (each round is shorter).
- The bound: should the WAL reach `BACKSTOP_PAGES` (the thread slower than the writes,
  or not running: before `start`, after `stop`, or when its connection cannot be
  opened), each commit checkpoints on the writer.
  A reader holding an old snapshot holds the WAL back either way (it is never waited for).
- A checkpoint that fails is counted and logged once per kind of error; the connection is
  opened again at the next wake. ``stop`` ends the thread and closes its connection, so the
  writer's connection, closed after it, is the last one and its close checkpoints the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import apsw
import trio

from t3d.os_thread_name import name_this_thread

log = logging.getLogger("t3d.store")

WAL_PAGES = 1000  # SQLite's own auto-checkpoint mark (~4 MiB of 4 KiB pages)
FINISH_PAGES = 64  # frames left after the thread's checkpoint that a commit copies itself
BACKSTOP_PAGES = 10 * WAL_PAGES
SLOW_S = 0.010  # a checkpoint longer than this moves the next ones to the thread


class Checkpointer:
    def __init__(
        self,
        connect: Callable[[], apsw.Connection],
        *,
        pages: int = WAL_PAGES,
        backstop_pages: int = BACKSTOP_PAGES,
        slow_s: float = SLOW_S,
    ) -> None:
        self._connect = connect
        self._pages = pages
        self._backstop = backstop_pages
        self._slow_s = slow_s
        self._wake = threading.Event()
        self._stopping = False
        self._running = False
        self._thread = threading.Thread(target=self._main, name="t3d-checkpoint", daemon=True)
        # Writer thread only (the hook's state): the WAL's pages at the last commit, and
        # the pages at which the next wake is due.
        self._seen = 0
        self._due = pages
        # Set by the thread: the WAL's frames in the database after its last checkpoint
        # (0: nothing for a commit to finish).
        self._backfilled = 0
        # Whether the last checkpoint at a mark (on either thread) took over `slow_s`: then
        # the thread runs the next; and whether the thread's next round is a chase (those,
        # and a commit's finishing ones, copy a few frames and do not count).
        self._slow = False
        self._chase = False
        # Counts (read from the loop for /metrics; each written by one thread).
        self.checkpoints = 0
        self.thread_s = 0.0  # in its checkpoints
        self.writer_s = 0.0  # in the checkpoints commits ran
        self.failures = 0
        self.finished = 0  # checkpoints a commit ran to finish the thread's
        self.on_writer = 0  # checkpoints a commit ran at the mark (quick ones, or the bound)
        self._logged: type[BaseException] | None = None

    def install(self, conn: apsw.Connection) -> apsw.Connection:
        """Hook the writer's connection (its auto-checkpoint is off from here on)."""
        conn.set_wal_hook(self._hook)
        return conn

    def start(self) -> None:
        self._running = True
        self._thread.start()

    async def stop(self) -> None:
        """End the thread once its checkpoint, if one runs, is done (off the loop)."""
        if not self._thread.is_alive():
            return
        self._stopping = True
        self._wake.set()
        with trio.CancelScope(shield=True):  # the daemon stopping: the connection must close first
            await trio.to_thread.run_sync(self._thread.join)

    # --- writer thread ---------------------------------------------------------

    def _hook(self, conn: apsw.Connection, name: str, pages: int) -> int:
        if pages < self._seen:  # the WAL started again from its beginning
            self._due = self._pages
        self._seen = pages
        backfilled, self._backfilled = self._backfilled, 0
        if 0 < backfilled <= pages <= backfilled + FINISH_PAGES and self._checkpoint_here(conn, name):
            self.finished += 1
        elif 0 < backfilled < pages < self._backstop and self._running:
            self._due = pages + self._pages  # too many appended meanwhile: the thread goes again
            self._chase = True
            self._wake.set()
        elif pages >= self._backstop:
            self.on_writer += self._checkpoint_here(conn, name)
        elif pages >= self._due:
            self._due = pages + self._pages
            if self._running and self._slow:
                self._chase = False
                self._wake.set()
            else:
                self.on_writer += self._checkpoint_here(conn, name, at_mark=True)
        return apsw.SQLITE_OK

    def _checkpoint_here(self, conn: apsw.Connection, name: str, *, at_mark: bool = False) -> bool:
        started = time.perf_counter()
        try:
            conn.wal_checkpoint(name, apsw.SQLITE_CHECKPOINT_PASSIVE)
        except apsw.BusyError:  # the thread (or a maintenance checkpoint) is at it
            return False
        except apsw.Error as exc:  # the commit stands; the next one tries again
            self._failed(exc)
            return False
        seconds = time.perf_counter() - started
        self.writer_s += seconds
        if at_mark:
            self._slow = seconds > self._slow_s
        return True

    # --- checkpointer thread ---------------------------------------------------

    def _main(self) -> None:
        name_this_thread()  # top -H, and the bench, tell it apart
        conn: apsw.Connection | None = None
        last = 0  # the WAL's frames in the database after the last checkpoint
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                chase = self._chase
                try:
                    if conn is None:
                        conn = self._connect()
                    started = time.perf_counter()
                    frames, backfilled = conn.wal_checkpoint("main", apsw.SQLITE_CHECKPOINT_PASSIVE)
                    if frames < 0:  # SQLite did nothing: the connection has not read the file yet
                        raise apsw.SQLError("the checkpointer's connection does not see the database in WAL mode")
                    seconds = time.perf_counter() - started
                    self.thread_s += seconds
                    self.checkpoints += 1
                    if not chase:
                        self._slow = seconds > self._slow_s
                    # Chased only while rounds make headway (a reader's snapshot stops them).
                    self._backfilled = backfilled if backfilled != last else 0
                    last = backfilled
                except apsw.BusyError:
                    pass
                except apsw.Error as exc:
                    self._failed(exc)
                    _closed(conn)
                    conn = None
        except BaseException as exc:  # the thread itself failed: the backstop takes over
            log.critical("the WAL checkpointer thread died; commits checkpoint themselves", exc_info=exc)
        finally:
            self._running = False
            _closed(conn)

    def _failed(self, exc: apsw.Error) -> None:
        self.failures += 1
        if type(exc) is not self._logged:
            self._logged = type(exc)
            log.warning("a WAL checkpoint failed (%s); the WAL grows until one succeeds", exc)


def _closed(conn: apsw.Connection | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except apsw.Error as exc:
            log.warning("the WAL checkpointer's connection did not close cleanly (%s)", exc)
