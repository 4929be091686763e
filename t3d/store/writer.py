"""The writer thread: the only connection that writes, on its own OS thread.

Rules:
- The Trio loop never runs SQLite. It hands a job (a function of the
  connection) to this thread and awaits the outcome; a busy disk delays the
  job, never the loop.
- Jobs run one at a time, in submission order. Outcomes are delivered back
  with ``TrioToken.run_sync_soon``, which runs callbacks in FIFO order, so
  whatever a job publishes reaches the loop in commit order.
- The queue is bounded by semaphores the loop acquires before submitting
  (``capacity`` batchable jobs and ``capacity`` others in flight, so provider
  updates never take the places client commands need), and batchable jobs
  also by ``max_inflight_bytes`` of estimated payload (a larger job goes alone);
  at a bound, submitters wait their turn.
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
  the loop and the other jobs go on. ``deliver`` runs only for a job that committed.
- The database unavailable (a full disk, another process's lock: availability.py):
  the error is mapped once, here, onto a `DatabaseUnavailableError`, and the
  writer is "in trouble" (`unavailable`, for health) until a write commits again.
  A batchable job that met it is held, in order, with every batchable job after
  it, and retried with backoff (`RETRY_MIN_S` doubling to `RETRY_MAX_S`) until it
  commits: provider output waits (its sessions stop reading at the bounds above),
  nothing is dropped. Any other job fails with the error (a client's command: the
  caller is told). With nothing held the writer probes instead (availability.probe).
  At close, held jobs get one last try; those that still cannot commit fail.
- ``on_done`` (for /metrics), if set, is called on the loop once per transaction with
  each of its jobs' seconds from submission to outcome and the seconds the thread spent
  on the transaction.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import apsw
import outcome
import trio

from t3d import waits
from t3d.errors import DatabaseUnavailableError, StoreError, WriterClosedError
from t3d.store import availability
from t3d.store.jobs import BatchableJob, ExecuteBatch, Job, Pending

__all__ = ["RETRY_MAX_S", "RETRY_MIN_S", "ExecuteBatch", "Pending", "WriterThread"]

log = logging.getLogger("t3d.store")

T = TypeVar("T")

_CLOSE = object()

# Retries of held jobs (and probes) while the database is unavailable: the first after
# RETRY_MIN_S, then twice as long each time, at most RETRY_MAX_S apart.
RETRY_MIN_S = 0.1
RETRY_MAX_S = 1.0
# Estimated payload of batchable jobs in flight at once (held ones included).
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024


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
        max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
        db_path: str = "the database",
        busy_timeout_ms: int = 5000,
    ) -> None:
        self._connect = connect
        self._execute_batch = execute_batch
        self._max_batch_jobs = max_batch_jobs
        self._max_batch_bytes = max_batch_bytes
        self._db_path = db_path
        self._busy_timeout_ms = busy_timeout_ms
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._capacity = capacity
        self._slots = trio.Semaphore(capacity)
        self._batch_slots = trio.Semaphore(capacity)
        self._max_inflight_bytes = max_inflight_bytes
        self._inflight_bytes = 0
        self._bytes_freed = trio.Event()
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
        # When each unfinished job was sent (loop side), oldest first.
        self._sent_at: dict[Job[Any], float] = {}
        self.on_done: Callable[[list[float], float], None] | None = None
        # Loop side: why the database cannot take writes now (None: it can), and since when.
        self.unavailable: DatabaseUnavailableError | None = None
        self.unavailable_since = 0.0
        self.unavailable_failures = 0  # jobs failed for it (client commands, bookkeeping)
        self._available = trio.Event()
        self._available.set()
        # Thread side: the trouble, held batchable jobs (oldest first), next retry.
        self._trouble: DatabaseUnavailableError | None = None
        self._held: deque[BatchableJob[Any]] = deque()
        self.held_jobs = 0  # len(_held), readable from the loop
        self._retry_delay = RETRY_MIN_S
        self._retry_at = 0.0
        self._trouble_began = 0.0
        self._logged: type[DatabaseUnavailableError] | None = None  # the trouble last logged

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
        return 2 * self._capacity - self._slots.value - self._batch_slots.value

    def oldest_job_age(self) -> float:
        """Seconds the oldest unfinished job has waited (0 when idle)."""
        for sent_at in self._sent_at.values():
            return trio.current_time() - sent_at
        return 0.0

    async def wait_available(self) -> None:
        """Return once the database takes writes again (at once if it does)."""
        await self._available.wait()

    async def run(self, fn: Callable[[apsw.Connection], T], deliver: Callable[[T], None] | None = None) -> T:
        """Run ``fn(conn)`` on the writer thread and return its result.

        ``deliver`` (optional) runs on the loop with the result just before the
        caller wakes, in commit order; use it to publish committed events.
        If the caller is cancelled, the job still runs to completion.
        """
        job = Job(fn, deliver)
        await self._send(job)
        return await Pending(job).outcome()

    async def send_batched(self, item: object, size: int, deliver: Callable[[T], None] | None = None) -> Pending[T]:
        """Queue ``item`` to commit through ``execute_batch``, sharing the transaction with
        the batchable jobs queued around it (``size``: its estimated payload in bytes), and
        return at once: its place in the commit order is fixed now, its outcome is awaited
        later (`Pending.outcome`). Waits only for a free place in the bounded queue (and for
        room within ``max_inflight_bytes``)."""
        assert self._execute_batch is not None, "this writer has no execute_batch"
        job: BatchableJob[T] = BatchableJob(item, size, deliver)
        await self._send(job)
        return Pending(job)

    async def _send(self, job: Job[Any]) -> None:
        self._check_open()
        batchable = isinstance(job, BatchableJob)
        await waits.acquire(self._batch_slots if batchable else self._slots)  # no trip when free
        try:
            if isinstance(job, BatchableJob):
                while self._inflight_bytes and self._inflight_bytes + job.size > self._max_inflight_bytes:
                    self._check_open()
                    await self._bytes_freed.wait()
            self._check_open()
        except BaseException:
            (self._batch_slots if batchable else self._slots).release()
            raise
        if isinstance(job, BatchableJob):
            self._inflight_bytes += job.size
        self._sent_at[job] = trio.current_time()
        self._queue.put(job)

    def _check_open(self) -> None:
        if self._closing:
            raise WriterClosedError("database writer is closed")

    async def close(self) -> None:
        """Let every job already sent finish and commit, then stop the thread."""
        if not self._closing:
            self._closing = True
            self._queue.put(_CLOSE)
            self._wake_senders()
        with trio.CancelScope(shield=True):
            await self._stopped.wait()

    def _wake_senders(self) -> None:
        self._bytes_freed.set()
        self._bytes_freed = trio.Event()

    def _set_unavailable(self, trouble: DatabaseUnavailableError | None) -> None:
        if trouble is None:
            self.unavailable = None
            self._available.set()
            return
        if self.unavailable is None:
            self.unavailable_since = trio.current_time()
            self._available = trio.Event()
        self.unavailable = trouble

    # --- thread side -----------------------------------------------------------

    def _main(self) -> None:
        error: BaseException | None = None
        try:
            try:
                conn = self._connect()
            except BaseException as exc:
                self._ready = outcome.Error(availability.unavailable(exc, self._db_path) or exc)
                self._token.run_sync_soon(self._started.set)
                return
            self._ready = outcome.Value(None)
            self._token.run_sync_soon(self._started.set)
            self._serve(conn)
            try:
                conn.close()
            except apsw.Error as exc:  # a last checkpoint that found no room: the WAL stays
                log.warning("the database did not close cleanly (%s); it is recovered at the next start", exc)
        except BaseException as exc:  # the thread itself failed: report, never hide
            error = exc
            log.critical("database writer thread died", exc_info=exc)
        finally:
            with contextlib.suppress(trio.RunFinishedError):  # the loop is gone: nobody to tell
                self._token.run_sync_soon(self._finished, error)

    def _serve(self, conn: apsw.Connection) -> None:
        while True:
            job = self._next(conn)
            if job is None:  # a retry or a probe ran instead
                continue
            if job is _CLOSE:
                if self._held:
                    self._retry_held(conn)
                self._give_up_held()
                return
            if isinstance(job, BatchableJob):
                if self._held:  # behind the held ones, in order
                    self._hold([job])
                else:
                    batch, self._carried = self._drain_batch(job)
                    self._commit_batch(conn, batch)
            else:
                self._run_one(conn, job)

    def _next(self, conn: apsw.Connection) -> Any:
        """The next job to run, or None after a due retry or probe (while in trouble)."""
        if self._carried is not None:
            job, self._carried = self._carried, None
            return job
        if self._trouble is None:
            if not self._held:
                return self._queue.get()
            self._retry_held(conn)  # another job found the database writable again
            return None
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            try:
                return self._queue.get(timeout=wait)
            except queue.Empty:
                pass
        if self._held:
            self._retry_held(conn)
        elif availability.probe(conn, self._trouble, self._db_path, self._busy_timeout_ms):
            self._recovered(committed=False)
        else:
            self._schedule_retry()
        return None

    def _run_one(self, conn: apsw.Connection, job: Job[Any]) -> None:
        started = time.perf_counter()
        job.result = result = outcome.capture(job.fn, conn)
        took = time.perf_counter() - started
        if isinstance(result, outcome.Error):
            trouble = self._unavailable(conn, result.error)
            if trouble is not None:
                job.result = outcome.Error(trouble)
                self._in_trouble(trouble)
        elif self._trouble is not None:
            self._recovered()
        self._finish([job], took)

    def _drain_batch(self, first: BatchableJob[Any]) -> tuple[list[BatchableJob[Any]], Any]:
        """``first`` and the batchable jobs already queued behind it, within the bounds;
        also the job that ended the batch, if one was taken off the queue."""
        batch, size = [first], first.size
        while len(batch) < self._max_batch_jobs:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return batch, None
            if not isinstance(job, BatchableJob) or size + job.size > self._max_batch_bytes:
                return batch, job
            batch.append(job)
            size += job.size
        return batch, None

    def _commit_batch(self, conn: apsw.Connection, batch: list[BatchableJob[Any]]) -> bool:
        """Run ``batch`` as one transaction and finish its jobs; False (the jobs held, at
        the front, in order) if the database could not take it."""
        assert self._execute_batch is not None
        started = time.perf_counter()
        try:
            results = self._execute_batch(conn, [job.item for job in batch])
        except Exception as exc:  # the transaction itself failed: so did every job in it
            trouble = self._unavailable(conn, exc)
            if trouble is not None:
                self._hold(batch, front=True)
                self._in_trouble(trouble)
                return False
            if len(batch) == 1:
                results = [outcome.Error(exc)]
            else:
                results = [outcome.Error(_batch_failed(exc, len(batch))) for _ in batch]
        else:
            if self._trouble is not None:
                self._recovered()
        for job, result in zip(batch, results, strict=True):
            job.result = result
        self.batches_done += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        self._finish(batch, time.perf_counter() - started)
        return True

    def _retry_held(self, conn: apsw.Connection) -> None:
        """Commit the held jobs, oldest first, in batches, until one cannot."""
        while self._held:
            batch = [self._held.popleft()]
            size = batch[0].size
            while self._held and len(batch) < self._max_batch_jobs and size + self._held[0].size <= self._max_batch_bytes:
                size += self._held[0].size
                batch.append(self._held.popleft())
            self.held_jobs = len(self._held)
            if not self._commit_batch(conn, batch):
                return

    def _hold(self, jobs: list[BatchableJob[Any]], *, front: bool = False) -> None:
        if front:
            self._held.extendleft(reversed(jobs))
        else:
            self._held.extend(jobs)
        self.held_jobs = len(self._held)

    def _give_up_held(self) -> None:
        """At close: the held jobs that still cannot commit fail with the trouble."""
        if not self._held:
            return
        assert self._trouble is not None
        log.error("%d provider update(s) could not be written before the database closed: %s", len(self._held), self._trouble)
        jobs = list(self._held)
        self._held.clear()
        self.held_jobs = 0
        for job in jobs:
            job.result = outcome.Error(self._trouble)
        self._finish(jobs)

    def _unavailable(self, conn: apsw.Connection, exc: BaseException) -> DatabaseUnavailableError | None:
        try:
            errno = conn.system_errno
        except apsw.Error:
            errno = 0
        return availability.unavailable(exc, self._db_path, errno)

    def _in_trouble(self, trouble: DatabaseUnavailableError) -> None:
        """A write met ``trouble``: say so (once per kind of trouble), retry later."""
        if self._logged is not type(trouble):  # once per episode and kind, however it flaps
            log.error("%s; until then client writes fail and provider output waits, then both go on", trouble)
            if self._logged is None:
                self._trouble_began = time.monotonic()
            self._logged = type(trouble)
        self._trouble = trouble
        self._schedule_retry()
        self._token.run_sync_soon(self._set_unavailable, trouble)

    def _schedule_retry(self) -> None:
        self._retry_at = time.monotonic() + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)

    def _recovered(self, *, committed: bool = True) -> None:
        """The trouble is over: a write committed (``committed``), or a probe says so; a
        probe's word does not reset the backoff, so a disk that is still short of room
        for the next write is not retried at a faster pace."""
        if committed:
            log.warning("the database takes writes again, after %.1f s", time.monotonic() - self._trouble_began)
            self._retry_delay = RETRY_MIN_S
            self._logged = None
        self._trouble = None
        self._token.run_sync_soon(self._set_unavailable, None)

    def _finish(self, jobs: Sequence[Job[Any]], took: float | None = None) -> None:
        """Hand finished jobs to the loop; ``took``: the thread's seconds on their transaction."""
        self.jobs_done += len(jobs)
        self._token.run_sync_soon(self._complete, jobs, took)

    def _complete(self, jobs: Sequence[Job[Any]], took: float | None = None) -> None:
        if self.on_done is not None and took is not None:
            now = trio.current_time()
            self.on_done([now - self._sent_at.get(job, now) for job in jobs], took)
        for job in jobs:
            if isinstance(job.result, outcome.Error) and isinstance(job.result.error, DatabaseUnavailableError):
                self.unavailable_failures += 1
            if job.deliver is not None and isinstance(job.result, outcome.Value):
                try:
                    job.deliver(job.result.value)
                except Exception as exc:  # fails this job only, never the loop
                    log.error("a committed write could not be delivered", exc_info=exc)
                    job.result = outcome.Error(StoreError(f"the write committed but could not be delivered: {exc!r}"))
            self._release(job)

    def _release(self, job: Job[Any]) -> None:
        self._sent_at.pop(job, None)
        job.done.set()
        if isinstance(job, BatchableJob):
            self._inflight_bytes -= job.size
            self._wake_senders()
            self._batch_slots.release()
        else:
            self._slots.release()

    def _fail_unserved(self) -> None:
        unserved = list(self._held)
        self._held.clear()
        while True:
            try:
                job, self._carried = (self._carried if self._carried is not None else self._queue.get_nowait()), None
            except queue.Empty:
                break
            if job is not _CLOSE:
                unserved.append(job)
        for job in unserved:
            job.result = outcome.Error(WriterClosedError("database writer is closed"))
            self._release(job)

    def _finished(self, error: BaseException | None) -> None:
        lost = not self._closing or error is not None
        self._closing = True
        self._fail_unserved()
        self._wake_senders()
        self._stopped.set()
        if lost and self._ready is not None and isinstance(self._ready, outcome.Value):
            self._on_lost(error)


def _batch_failed(exc: Exception, jobs: int) -> StoreError:
    error = StoreError(f"database transaction of {jobs} batched writes failed, so this write did not commit: {exc}")
    error.__cause__ = exc
    return error
