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
- Batching (``send_batched``, for provider updates): a batchable job opens a
  transaction (``transaction``, a `Transaction`) and is applied at once; the
  batchable jobs queued behind it join it, each applied as it is taken, at
  most ``max_batch_jobs`` jobs and ``max_batch_bytes`` of estimated payload (a
  job over the byte bound runs alone). Until ``commit_interval_s`` has passed
  since the last batch committed, the thread also waits for more to join; after
  that, or when nothing more is queued once it has, it commits. So under load
  transactions come at most once per interval, and an update after a quiet
  spell commits at once (seed 001: no collection window delays an isolated
  update). Any other job ends the batch at once and runs after it (the order of
  submission is the order of commit), except a job sent with ``item`` (``run``:
  a client's command, the daemon's outbox bookkeeping): that is applied last in
  the batch's transaction and commits it, so it waits for one COMMIT, not for
  the updates before it (applied as they arrived); if the database cannot take
  it, it fails as it would alone, and the updates are held. Each job keeps its
  own outcome.
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
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import apsw
import outcome
import trio

from t3d import waits
from t3d.errors import DatabaseUnavailableError, StoreError, WriterClosedError
from t3d.os_thread_name import name_this_thread
from t3d.store import availability
from t3d.store.jobs import BatchableJob, Job, JoinableJob, Pending, Transaction

__all__ = ["RETRY_MAX_S", "RETRY_MIN_S", "Pending", "Transaction", "WriterThread"]

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
        transaction: Transaction | None = None,
        max_batch_jobs: int = 1,
        max_batch_bytes: int = 0,
        commit_interval_s: float = 0.0,
        max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
        db_path: str = "the database",
        busy_timeout_ms: int = 5000,
    ) -> None:
        self._connect = connect
        self._transaction = transaction
        self._max_batch_jobs = max_batch_jobs
        self._max_batch_bytes = max_batch_bytes
        self._commit_interval_s = commit_interval_s
        self._gather_waited = 0.0  # seconds the open batch has waited for jobs to join it
        self._committed_at = -math.inf  # when the last batch committed (time.monotonic)
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

    async def run(
        self, fn: Callable[[apsw.Connection], T], deliver: Callable[[T], None] | None = None, *, item: object = None
    ) -> T:
        """Run ``fn(conn)`` on the writer thread and return its result.

        ``deliver`` (optional) runs on the loop with the result just before the
        caller wakes, in commit order; use it to publish committed events.
        With ``item`` (what ``fn`` commits, as the ``transaction`` takes it), a job that
        meets a batch still taking jobs is applied to the batch's transaction instead,
        last, and commits it. If the caller is cancelled, the job still runs to completion.
        """
        job = Job(fn, deliver) if item is None else JoinableJob(fn, item, deliver)
        await self._send(job)
        return await Pending(job).outcome()

    async def send_batched(self, item: object, size: int, deliver: Callable[[T], None] | None = None) -> Pending[T]:
        """Queue ``item`` to commit through the ``transaction``, sharing the transaction with
        the batchable jobs queued around it (``size``: its estimated payload in bytes), and
        return at once: its place in the commit order is fixed now, its outcome is awaited
        later (`Pending.outcome`). Waits only for a free place in the bounded queue (and for
        room within ``max_inflight_bytes``)."""
        assert self._transaction is not None, "this writer has no transaction for batches"
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
        name_this_thread()  # top -H, and the bench, tell it apart
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
                    self._commit_batch(conn, [job], self._gather(job))
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

    def _gather(self, first: BatchableJob[Any]) -> Iterator[Job[Any]]:
        """The batchable jobs taken off the queue behind ``first``, within the bounds, waited
        for until ``commit_interval_s`` after the last commit; then a joinable job that
        ends the batch. Another job that ends the batch is kept to run next (``_carried``)."""
        count, size = 1, first.size
        until = self._committed_at + self._commit_interval_s
        while count < self._max_batch_jobs:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                wait = until - time.monotonic()
                if wait <= 0:
                    return
                waiting_since = time.perf_counter()
                try:
                    job = self._queue.get(timeout=wait)
                except queue.Empty:
                    return
                finally:
                    self._gather_waited += time.perf_counter() - waiting_since
            if isinstance(job, JoinableJob):
                yield job
                return
            if not isinstance(job, BatchableJob) or size + job.size > self._max_batch_bytes:
                self._carried = job
                return
            count += 1
            size += job.size
            yield job

    def _commit_batch(self, conn: apsw.Connection, batch: list[Job[Any]], gather: Iterable[Job[Any]] = ()) -> bool:
        """Apply ``batch``, then the jobs ``gather`` takes (added to it), in one transaction,
        commit it and finish them. False if the database could not take it: then its
        batchable jobs are held, at the front, in order, and a joined client's command fails
        with the trouble."""
        transaction = self._transaction
        assert transaction is not None
        started = time.perf_counter()
        self._gather_waited = 0.0
        try:
            transaction.begin(conn)
            results = [transaction.apply(conn, _item(job)) for job in batch]
            for job in gather:
                batch.append(job)
                results.append(transaction.apply(conn, _item(job)))
            transaction.commit(conn)
            self._committed_at = time.monotonic()
        except Exception as exc:  # the transaction itself failed: so did every job in it
            transaction.rollback(conn)
            trouble = self._unavailable(conn, exc)
            if trouble is not None:
                self._hold([job for job in batch if isinstance(job, BatchableJob)], front=True)
                joined = [job for job in batch if not isinstance(job, BatchableJob)]
                for job in joined:
                    job.result = outcome.Error(trouble)
                self._in_trouble(trouble)
                if joined:
                    self._finish(joined)
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
        self._finish(batch, time.perf_counter() - started - self._gather_waited)
        return True

    def _retry_held(self, conn: apsw.Connection) -> None:
        """Commit the held jobs, oldest first, in batches, until one cannot."""
        while self._held:
            first = self._held.popleft()
            batch: list[Job[Any]] = [first]
            size = first.size
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


def _item(job: Job[Any]) -> object:
    assert isinstance(job, BatchableJob | JoinableJob)
    return job.item


def _batch_failed(exc: Exception, jobs: int) -> StoreError:
    error = StoreError(f"database transaction of {jobs} batched writes failed, so this write did not commit: {exc}")
    error.__cause__ = exc
    return error
