"""`open_store`: the database as the rest of the daemon sees it.

The loop talks to SQLite only through this object: commands go to the writer
thread (one transaction each), reads go to the reader pool. Committed batches
are handed to the ``on_commit`` listeners on the loop, after COMMIT and in
sequence order, before the command's caller wakes; a write that did not commit
is never handed to them.

While the database cannot take writes (a full disk, another process's lock:
`DatabaseUnavailableError`), `execute` (a client's command) fails with it, and
`record` / `finish_effect` (the daemon's own writes) wait and retry until the
write commits; `mark_effects_done` fails and its caller retries later.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import apsw
import attrs
import orjson
import trio

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.codec import converter
from t3d.errors import DatabaseUnavailableError
from t3d.store import queries as q
from t3d.store.checkpointer import Checkpointer
from t3d.store.commit import (
    BatchTransaction,
    Bookkeeping,
    Committed,
    Write,
    execute,
    finish_effect,
    mark_effects_done,
)
from t3d.store.read_classes import ReadClass
from t3d.store.readers import ReaderPool
from t3d.store.schema import SYNCHRONOUS, WRITER_PRAGMAS, convert_small_database, migrate
from t3d.store.tables import EntityCache
from t3d.store.writer import RETRY_MIN_S, Pending, WriterThread

log = logging.getLogger("t3d.store")

Raw = TypeVar("Raw")

WRITER_QUEUE = 256
# Bounds of one transaction of batched provider updates (seed 001).
BATCH_JOBS = 64
BATCH_BYTES = 1 << 20

EFFECT_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        ev.StartProviderTurn,
        ev.SteerProviderTurn,
        ev.InterruptProviderTurn,
        ev.AnswerProviderRequest,
        ev.StopProviderSession,
        ev.CaptureCheckpoint,
    )
}


@attrs.frozen
class StoreStatistics:
    writer_queue: int
    writer_oldest_job_s: float
    writer_jobs_done: int
    writer_batches_done: int
    writer_largest_batch: int
    readers: int
    readers_busy: int
    # Reads waiting for a reader, per class (read_classes.py).
    reads_waiting_small: int
    reads_waiting_page: int
    reads_waiting_history: int
    # Why the database cannot take writes now (None: it can; headline: naming no path or
    # process), for how long, the provider updates held meanwhile, and the writes failed
    # for it since start.
    unavailable: str | None = None
    unavailable_headline: str | None = None
    unavailable_s: float = 0.0
    writes_held: int = 0
    writes_failed_unavailable: int = 0
    # The WAL checkpoints (checkpointer.py): on its thread, those that failed, those
    # commits ran at the mark (quick ones, or at the bound), and the seconds of each kind.
    wal_checkpoints: int = 0
    wal_checkpoint_s: float = 0.0
    wal_checkpoint_failures: int = 0
    wal_checkpoints_on_writer: int = 0
    wal_checkpoint_on_writer_s: float = 0.0


T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000


def _connect_writer(path: str, synchronous: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> apsw.Connection:
    conn = apsw.Connection(path)
    for pragma in WRITER_PRAGMAS:
        conn.execute(pragma)
    conn.set_busy_timeout(busy_timeout_ms)
    if synchronous not in SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, not {synchronous!r}")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    migrate(conn)
    convert_small_database(conn)
    return conn


def _connect_checkpointer(path: str, synchronous: str) -> apsw.Connection:
    """The checkpointer's connection (checkpointer.py): the writer's has migrated the file.
    It reads the file's header (the journal mode) at once: a connection that has not read
    it yet takes a checkpoint for a no-op."""
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA journal_mode").fetchall()
    return conn


# Effects for a thread whose agent outlived the last daemon that still run after a
# restart (its session takes the open turn over itself, so a turn start is superseded).
_KEPT_FOR_LIVE_AGENTS = ("InterruptProviderTurn", "AnswerProviderRequest", "StopProviderSession")


def _supersede_outbox(conn: apsw.Connection, now: float, live_threads: Sequence[str] = ()) -> None:
    """Effects left from the last run are superseded by recovery's own decisions, except
    the ones that stay open until finished (checkpoint captures), and the interrupts,
    answers and stops for threads whose agent is still alive: they run again."""
    kinds = tuple(cls.__name__ for cls in ev.DONE_WHEN_FINISHED)
    live = tuple(live_threads)
    spared = ""
    if live:
        spared = (
            f" AND NOT (thread_id IN ({','.join('?' * len(live))})"
            f" AND kind IN ({','.join('?' * len(_KEPT_FOR_LIVE_AGENTS))}))"
        )
    with conn:
        conn.execute(
            f"UPDATE outbox SET done_at = ? WHERE done_at IS NULL AND kind NOT IN ({','.join('?' * len(kinds))})" + spared,
            (now, *kinds, *live, *(_KEPT_FOR_LIVE_AGENTS if live else ())),
        )


class Store:
    def __init__(
        self,
        path: Path,
        writer: WriterThread,
        readers: ReaderPool,
        clock: Callable[[], float],
        *,
        batching: bool = True,
        cache: EntityCache | None = None,
        checkpointer: Checkpointer | None = None,
    ) -> None:
        self.path = path
        self._checkpointer = checkpointer
        self._batching = batching
        self._writer = writer
        self._readers = readers
        self._clock = clock
        self._listeners: list[Callable[[Committed], None]] = []
        # The writer thread's decoded entities (tables.EntityCache); touched on that thread only.
        self._cache = cache if cache is not None else EntityCache()

    def on_commit(self, listener: Callable[[Committed], None]) -> None:
        self._listeners.append(listener)

    def time_writes(self, listener: Callable[[list[float], float], None]) -> None:
        """Call ``listener(job_seconds, transaction_seconds)`` on the loop after every writer
        transaction: each job's time from submission to outcome, and the thread's time on it."""
        self._writer.on_done = listener

    def _publish(self, committed: Committed) -> None:
        if committed.replayed:
            return
        for listener in self._listeners:
            listener(committed)

    async def execute(
        self, command: c.Command, *, command_id: str | None = None, fingerprint: bytes | None = None
    ) -> Committed:
        """Decide and commit ``command``; raises `DomainError` if it is rejected. A retry of
        ``command_id`` replays the first outcome; with another ``fingerprint`` it is refused."""
        write, cache = Write(command, command_id, self._clock(), fingerprint), self._cache
        return await self._writer.run(
            lambda conn: execute(conn, command, command_id, write.now, fingerprint, cache),
            self._publish,
            item=write,  # or joins an open transaction of provider updates
        )

    async def record(self, command: c.Command) -> Committed:
        """Commit one of the daemon's own writes (a provider session's update, a turn's
        end, admission's decisions, a checkpoint). Updates of all sessions share
        transactions (bounded; see `WriterThread`); a turn's end or an opened request
        commits after every earlier update (joining an open transaction, or alone).
        While the database is unavailable it waits and retries until the write commits
        (raises `DomainError` if it is rejected, as `execute` does)."""
        if not isinstance(command, c.BATCHABLE):
            return await self._until_committed(lambda: self.execute(command))
        return await (await self.send(command)).outcome()

    async def _until_committed(self, write: Callable[[], Awaitable[T]]) -> T:
        """``write()``, again each time the database becomes available after it could not
        take it (the writer probes it with backoff; see writer.py)."""
        while True:
            try:
                return await write()
            except DatabaseUnavailableError:
                await trio.sleep(RETRY_MIN_S)
                await self._writer.wait_available()

    async def send(self, command: c.Command) -> Pending[Committed]:
        """Hand a provider update to the writer and return at once, its place in the commit
        order fixed (`WriterThread.send_batched`); for a session's stream of updates that
        should share transactions with each other, not only with other sessions'. With
        batching off it returns only once the update is done, as before batching."""
        if not isinstance(command, c.BATCHABLE):
            raise ValueError(f"{type(command).__name__} is a barrier, not a batchable update: use record")
        write = Write(command, None, self._clock())
        pending = await self._writer.send_batched(write, c.estimated_size(command), self._publish)
        if not self._batching:
            await pending.settled()
        return pending

    async def mark_effects_done(self, ids: list[int]) -> None:
        """Mark these outbox rows done; raises `DatabaseUnavailableError` when the database
        cannot take it (the effect worker keeps the ids and tries again later)."""
        now = self._clock()
        await self._bookkeeping(lambda conn: mark_effects_done(conn, ids, now))

    async def finish_effect(self, effect: ev.Effect) -> None:
        """Mark an effect of `DONE_WHEN_FINISHED` done: its work is finished. Waits while
        the database is unavailable, like `record`."""
        now, kind, payload = self._clock(), type(effect).__name__, orjson.dumps(converter.unstructure(effect))
        await self._until_committed(lambda: self._bookkeeping(lambda conn: finish_effect(conn, kind, payload, now)))

    async def _bookkeeping(self, write: Callable[[apsw.Connection], None]) -> None:
        """Run ``write`` alone, or in the open transaction of a batch of provider updates (it
        commits the batch: one COMMIT for both)."""
        await self._writer.run(write, item=Bookkeeping(write))

    @property
    def unavailable(self) -> DatabaseUnavailableError | None:
        """Why the database cannot take writes now, or None when it can."""
        return self._writer.unavailable

    async def maintain(self, job: Callable[[apsw.Connection], T]) -> T:
        """Run ``job`` (one short transaction, or a statement such as a vacuum step) on the
        writer, in turn with every other write; nothing is published. For retention and
        database maintenance (t3d/store/pruner.py, maintenance.py)."""
        return await self._writer.run(job)

    async def pending_effects(self) -> list[tuple[int, ev.Effect]]:
        def query(conn: apsw.Connection) -> list[tuple[int, str, bytes]]:
            return list(conn.execute("SELECT id, kind, payload FROM outbox WHERE done_at IS NULL ORDER BY id"))

        def decode(rows: list[tuple[int, str, bytes]]) -> list[tuple[int, ev.Effect]]:
            return [(i, converter.structure(orjson.loads(p), EFFECT_TYPES[k])) for i, k, p in rows]

        return await self._readers.read(query, decode, ReadClass.SMALL)

    async def read(
        self,
        query: Callable[[apsw.Connection], Raw],
        decode: Callable[[Raw], T],
        read_class: ReadClass = ReadClass.PAGE,
    ) -> T:
        """Run ``query`` in one read transaction on a reader thread, then ``decode`` its rows
        there too (after the transaction ends); the loop gets only the decoded value.
        ``read_class`` orders it among waiting reads (read_classes.py); the default, page,
        neither jumps ahead of small reads nor counts against history's share."""
        return await self._readers.read(query, decode, read_class)

    async def snapshot(self, thread_id: str, turn_limit: int = q.DEFAULT_TURN_LIMIT, before: int | None = None) -> dict[str, Any] | None:
        read_class = q.snapshot_read_class(turn_limit, before)
        return await self._readers.read(q.snapshot_query(thread_id, turn_limit, before), q.decode_snapshot, read_class)

    async def shell(self) -> dict[str, Any]:
        return await self._readers.read(q.shell_query, q.decode_shell, ReadClass.SMALL)

    async def pending_requests(self, thread_id: str | None = None) -> list[Any]:
        return await self._readers.read(q.pending_requests_query(thread_id), q.decode_list, ReadClass.SMALL)

    async def projects(self) -> list[Any]:
        return await self._readers.read(q.projects_query, q.decode_list, ReadClass.SMALL)

    async def thread(self, thread_id: str) -> dict[str, Any] | None:
        rows = await self._readers.read(q.thread_query(thread_id), q.decode_list, ReadClass.SMALL)
        return rows[0] if rows else None

    async def reattachable_sessions(self) -> dict[str, str]:
        """Session id -> thread id of the sessions a restarted daemon may take over."""
        return await self._readers.read(q.reattachable_sessions_query, q.decode_pairs, ReadClass.SMALL)

    async def reattach_context(self, thread_id: str) -> q.ReattachContext | None:
        return await self._readers.read(q.reattach_context_query(thread_id), q.decode_reattach_context, ReadClass.SMALL)

    async def recover_after_restart(self, live_sessions: frozenset[str] = frozenset()) -> None:
        """Close what the last run left open, except the turns, requests and effects of the
        threads whose agent is still alive (``live_sessions``: their session ids)."""
        now = self._clock()
        threads = await self.reattachable_sessions() if live_sessions else {}
        keep = sorted({threads[s] for s in live_sessions if s in threads})
        await self._writer.run(lambda conn: _supersede_outbox(conn, now, keep))
        recovered = await self.execute(c.RecoverAfterRestart(tuple(sorted(live_sessions))))
        if recovered.events:
            log.info(
                "restart recovery: %d thread(s) recovered, %d kept with their running agent, %d event(s)",
                recovered.result["threads"], len(keep), len(recovered.events),
            )

    async def thread_context(self, thread_id: str) -> tuple[Any, Any, str | None] | None:
        return await self._readers.read(q.thread_context_query(thread_id), q.decode_thread_context, ReadClass.SMALL)

    def statistics(self) -> StoreStatistics:
        readers = self._readers.statistics()
        writer = self._writer
        return StoreStatistics(
            writer_queue=self._writer.queued,
            writer_oldest_job_s=self._writer.oldest_job_age(),
            writer_jobs_done=self._writer.jobs_done,
            writer_batches_done=self._writer.batches_done,
            writer_largest_batch=self._writer.largest_batch,
            readers=self._readers.size,
            readers_busy=self._readers.busy,
            reads_waiting_small=readers.waiting_small,
            reads_waiting_page=readers.waiting_page,
            reads_waiting_history=readers.waiting_history,
            unavailable=None if writer.unavailable is None else str(writer.unavailable),
            unavailable_headline=None if writer.unavailable is None else writer.unavailable.headline,
            unavailable_s=0.0 if writer.unavailable is None else trio.current_time() - writer.unavailable_since,
            writes_held=writer.held_jobs,
            writes_failed_unavailable=writer.unavailable_failures,
            **self._checkpoint_statistics(),
        )

    def _checkpoint_statistics(self) -> dict[str, Any]:
        c = self._checkpointer
        if c is None:
            return {}
        return {
            "wal_checkpoints": c.checkpoints,
            "wal_checkpoint_s": c.thread_s,
            "wal_checkpoint_failures": c.failures,
            "wal_checkpoints_on_writer": c.on_writer,
            "wal_checkpoint_on_writer_s": c.writer_s,
        }


@asynccontextmanager
async def open_store(
    path: Path,
    *,
    readers: int = 4,
    batching: bool = True,
    commit_interval_s: float = 0.0,
    synchronous: str = "full",
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    on_writer_lost: Callable[[BaseException | None], None],
    clock: Callable[[], float] = time.time,
    recover: bool = True,
) -> AsyncIterator[Store]:
    """Open (creating and migrating) the database, then run restart recovery (the daemon
    passes ``recover=False`` and runs `Store.recover_after_restart` itself once it knows
    which agents are still alive). ``batching=False`` commits each provider update in its
    own transaction; ``commit_interval_s``: how long a batch of them may stay open for more
    to join, counted from the last batch's commit (`WriterThread`); ``synchronous`` is
    ``full`` or ``normal`` (schema.SYNCHRONOUS says what each costs); ``busy_timeout_ms``: how long a write waits for another process's
    lock before it counts as unavailable. A database that cannot take writes at start
    raises its `DatabaseUnavailableError` (the daemon exits 1 naming the cause)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    cache = EntityCache()
    checkpointer = Checkpointer(lambda: _connect_checkpointer(os.fspath(path), synchronous))
    writer = WriterThread(
        lambda: checkpointer.install(_connect_writer(os.fspath(path), synchronous, busy_timeout_ms)),
        capacity=WRITER_QUEUE,
        on_lost=on_writer_lost,
        transaction=BatchTransaction(cache),
        max_batch_jobs=BATCH_JOBS if batching else 1,
        max_batch_bytes=BATCH_BYTES,
        commit_interval_s=commit_interval_s if batching else 0.0,
        db_path=os.fspath(path),
        busy_timeout_ms=busy_timeout_ms,
    )
    await writer.start()
    checkpointer.start()
    pool = ReaderPool(os.fspath(path), readers)
    store = Store(path, writer, pool, clock, batching=batching, cache=cache, checkpointer=checkpointer)
    try:
        if recover:
            await store.recover_after_restart()
        yield store
    finally:
        await checkpointer.stop()  # first: the writer's connection closes last, checkpointing the rest
        await writer.close()
        pool.close()
