"""The writer thread: the only connection that writes, on its own OS thread.

Rules:
- The Trio loop never runs SQLite. It hands a job (a function of the
  connection) to this thread and awaits the outcome; a busy disk delays the
  job, never the loop.
- Jobs run one at a time, in submission order. Outcomes are delivered back
  with ``TrioToken.run_sync_soon``, which runs callbacks in FIFO order, so
  whatever a job publishes reaches the loop in commit order.
- The queue is bounded by a semaphore the loop acquires before submitting
  (``capacity`` jobs in flight); at the bound, submitters wait their turn.
- A job that was sent before `close` finishes and commits; jobs after it fail
  with "database writer is closed".
- If the thread dies outside a job (it should not), ``on_lost`` is called once
  on the loop; the daemon then exits with status 1 and systemd restarts it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import apsw
import outcome
import trio

from t3d.errors import WriterClosedError

log = logging.getLogger("t3d.store")

T = TypeVar("T")

_CLOSE = object()


class _Job(Generic[T]):
    __slots__ = ("deliver", "done", "fn", "result")

    def __init__(self, fn: Callable[[apsw.Connection], T], deliver: Callable[[T], None] | None) -> None:
        self.fn = fn
        self.deliver = deliver
        self.done = trio.Event()
        self.result: outcome.Outcome[T] | None = None


class WriterThread:
    def __init__(
        self,
        connect: Callable[[], apsw.Connection],
        *,
        capacity: int,
        on_lost: Callable[[BaseException | None], None],
    ) -> None:
        self._connect = connect
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._capacity = capacity
        self._slots = trio.Semaphore(capacity)
        self._token = trio.lowlevel.current_trio_token()
        self._on_lost = on_lost
        self._closing = False
        self._stopped = trio.Event()
        self._ready: outcome.Outcome[None] | None = None
        self._thread = threading.Thread(target=self._main, name="t3d-writer", daemon=True)
        self.jobs_done = 0
        # When each job still in the thread's queue was sent (loop side; jobs finish in order).
        self._sent_at: deque[float] = deque()

    # --- loop side -------------------------------------------------------------

    async def start(self) -> None:
        started = trio.Event()
        self._started = started
        self._thread.start()
        await started.wait()
        assert self._ready is not None
        self._ready.unwrap()

    @property
    def queued(self) -> int:
        """Jobs submitted and not yet delivered."""
        return self._capacity - self._slots.value

    def oldest_job_age(self) -> float:
        """Seconds the oldest unfinished job has waited (0 when idle)."""
        return trio.current_time() - self._sent_at[0] if self._sent_at else 0.0

    async def run(self, fn: Callable[[apsw.Connection], T], deliver: Callable[[T], None] | None = None) -> T:
        """Run ``fn(conn)`` on the writer thread and return its result.

        ``deliver`` (optional) runs on the loop with the result just before the
        caller wakes, in commit order; use it to publish committed events.
        If the caller is cancelled, the job still runs to completion.
        """
        if self._closing:
            raise WriterClosedError("database writer is closed")
        await self._slots.acquire()
        if self._closing:
            self._slots.release()
            raise WriterClosedError("database writer is closed")
        job: _Job[T] = _Job(fn, deliver)
        self._sent_at.append(trio.current_time())
        self._queue.put(job)
        await job.done.wait()
        assert job.result is not None
        return job.result.unwrap()

    async def close(self) -> None:
        """Let every job already sent finish and commit, then stop the thread."""
        if not self._closing:
            self._closing = True
            self._queue.put(_CLOSE)
        with trio.CancelScope(shield=True):
            await self._stopped.wait()

    # --- thread side -----------------------------------------------------------

    def _main(self) -> None:
        error: BaseException | None = None
        try:
            try:
                conn = self._connect()
            except BaseException as exc:
                self._ready = outcome.Error(exc)
                self._token.run_sync_soon(self._started.set)
                return
            self._ready = outcome.Value(None)
            self._token.run_sync_soon(self._started.set)
            self._serve(conn)
            conn.close()
        except BaseException as exc:  # the thread itself failed: report, never hide
            error = exc
            log.critical("database writer thread died", exc_info=exc)
        finally:
            with contextlib.suppress(trio.RunFinishedError):  # the loop is gone: nobody to tell
                self._token.run_sync_soon(self._finished, error)

    def _serve(self, conn: apsw.Connection) -> None:
        while True:
            job = self._queue.get()
            if job is _CLOSE:
                return
            job.result = outcome.capture(job.fn, conn)
            self.jobs_done += 1
            self._token.run_sync_soon(self._complete, job)

    def _complete(self, job: _Job[Any]) -> None:
        self._sent_at.popleft()
        if job.deliver is not None and isinstance(job.result, outcome.Value):
            job.deliver(job.result.value)
        job.done.set()
        self._slots.release()

    def _fail_unserved(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not _CLOSE:
                self._sent_at.popleft()
                job.result = outcome.Error(WriterClosedError("database writer is closed"))
                job.done.set()
                self._slots.release()

    def _finished(self, error: BaseException | None) -> None:
        lost = not self._closing or error is not None
        self._closing = True
        self._fail_unserved()
        self._stopped.set()
        if lost and self._ready is not None and isinstance(self._ready, outcome.Value):
            self._on_lost(error)
