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
- Batching (``send_batched``, for provider updates): when the thread takes a
  batchable job it also takes the batchable jobs queued right behind it, only
  what is already queued (no collection timer, so an isolated update commits
  at once), at most ``max_batch_jobs`` jobs and ``max_batch_bytes`` of
  estimated payload; a job over the byte bound runs alone. The batch runs as
  one transaction (``execute_batch``); each job keeps its own outcome. Any
  other job ends the batch and runs after it, so the order of submission is
  the order of commit.
- A job whose ``deliver`` raises fails only itself: its caller gets the error,
  the loop and the other jobs go on.
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

from t3d.errors import StoreError, WriterClosedError

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


class _BatchableJob(_Job[T]):
    """A job that may share a transaction: ``item`` goes to ``execute_batch``."""

    __slots__ = ("item", "size")

    def __init__(self, item: object, size: int, deliver: Callable[[T], None] | None) -> None:
        super().__init__(_unbatched, deliver)
        self.item = item
        self.size = size


def _unbatched(conn: apsw.Connection) -> Any:
    raise AssertionError("a batchable job runs through execute_batch")


class Pending(Generic[T]):
    """A job handed to the writer whose outcome is awaited later."""

    __slots__ = ("_job",)

    def __init__(self, job: _Job[T]) -> None:
        self._job = job

    async def settled(self) -> None:
        """Wait until the job is done, leaving its outcome to `outcome`."""
        await self._job.done.wait()

    async def outcome(self) -> T:
        """The job's result once it committed, or its error (a cancelled wait leaves the
        job running: it still commits)."""
        await self._job.done.wait()
        assert self._job.result is not None
        return self._job.result.unwrap()


ExecuteBatch = Callable[[apsw.Connection, list[Any]], list[outcome.Outcome[Any]]]


class WriterThread:
    def __init__(
        self,
        connect: Callable[[], apsw.Connection],
        *,
        capacity: int,
        on_lost: Callable[[BaseException | None], None],
        execute_batch: ExecuteBatch | None = None,
        max_batch_jobs: int = 1,
        max_batch_bytes: int = 0,
    ) -> None:
        self._connect = connect
        self._execute_batch = execute_batch
        self._max_batch_jobs = max_batch_jobs
        self._max_batch_bytes = max_batch_bytes
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
        self.batches_done = 0  # transactions of batchable jobs (a batch of one counts)
        self.largest_batch = 0
        self._carried: Any = None  # taken off the queue while draining a batch; it runs next
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
        return await self._submit(_Job(fn, deliver))

    async def send_batched(self, item: object, size: int, deliver: Callable[[T], None] | None = None) -> Pending[T]:
        """Queue ``item`` to commit through ``execute_batch``, sharing the transaction with
        the batchable jobs queued around it (``size``: its estimated payload in bytes), and
        return at once: its place in the commit order is fixed now, its outcome is awaited
        later (`Pending.outcome`). Waits only for a free place in the bounded queue."""
        assert self._execute_batch is not None, "this writer has no execute_batch"
        job: _BatchableJob[T] = _BatchableJob(item, size, deliver)
        await self._send(job)
        return Pending(job)

    async def _submit(self, job: _Job[T]) -> T:
        await self._send(job)
        return await Pending(job).outcome()

    async def _send(self, job: _Job[Any]) -> None:
        if self._closing:
            raise WriterClosedError("database writer is closed")
        await self._slots.acquire()
        if self._closing:
            self._slots.release()
            raise WriterClosedError("database writer is closed")
        self._sent_at.append(trio.current_time())
        self._queue.put(job)

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
            job, self._carried = (self._carried if self._carried is not None else self._queue.get()), None
            if job is _CLOSE:
                return
            batch: list[_Job[Any]]
            if isinstance(job, _BatchableJob):
                batchable, self._carried = self._drain_batch(job)
                self._run_batch(conn, batchable)
                batch = list(batchable)
            else:
                job.result = outcome.capture(job.fn, conn)
                batch = [job]
            self.jobs_done += len(batch)
            self._token.run_sync_soon(self._complete, batch)

    def _drain_batch(self, first: _BatchableJob[Any]) -> tuple[list[_BatchableJob[Any]], Any]:
        """``first`` and the batchable jobs already queued behind it, within the bounds;
        also the job that ended the batch, if one was taken off the queue."""
        batch, size = [first], first.size
        while len(batch) < self._max_batch_jobs:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return batch, None
            if not isinstance(job, _BatchableJob) or size + job.size > self._max_batch_bytes:
                return batch, job
            batch.append(job)
            size += job.size
        return batch, None

    def _run_batch(self, conn: apsw.Connection, batch: list[_BatchableJob[Any]]) -> None:
        assert self._execute_batch is not None
        try:
            results = self._execute_batch(conn, [job.item for job in batch])
        except Exception as exc:  # the transaction itself failed: so did every job in it
            if len(batch) == 1:
                results = [outcome.Error(exc)]
            else:
                results = [outcome.Error(_batch_failed(exc, len(batch))) for _ in batch]
        for job, result in zip(batch, results, strict=True):
            job.result = result
        self.batches_done += 1
        self.largest_batch = max(self.largest_batch, len(batch))

    def _complete(self, jobs: list[_Job[Any]]) -> None:
        for job in jobs:
            self._sent_at.popleft()
            if job.deliver is not None and isinstance(job.result, outcome.Value):
                try:
                    job.deliver(job.result.value)
                except Exception as exc:  # fails this job only, never the loop
                    log.error("a committed write could not be delivered", exc_info=exc)
                    job.result = outcome.Error(StoreError(f"the write committed but could not be delivered: {exc!r}"))
            job.done.set()
            self._slots.release()

    def _fail_unserved(self) -> None:
        while True:
            try:
                job, self._carried = (self._carried if self._carried is not None else self._queue.get_nowait()), None
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


def _batch_failed(exc: Exception, jobs: int) -> StoreError:
    error = StoreError(f"database transaction of {jobs} batched writes failed, so this write did not commit: {exc}")
    error.__cause__ = exc
    return error
