"""The reader pool: read-only connections used from worker threads, scheduled by class.

Rules:
- At most ``size`` reads run at once. Which waiting read runs next is decided by
  `ReadScheduler` (read_classes.py): by class (small, page, history) with aging, and
  history reads never hold the last reader.
- A running read takes a free connection, runs its query in one read transaction on a
  worker thread, ends the transaction, then decodes the rows on that thread. The loop
  only ever sees decoded values, and no transaction stays open while rows are decoded.
- Connections are opened lazily. One that fails to open fails only the read that asked
  for it; the next read tries again (a reader never stays off).
- A connection whose query raised an SQLite error is closed, not reused.
- A read cancelled while it waits leaves the queue; once its query runs it finishes
  (the thread is not abandoned), so connections and threads stay within ``size``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import apsw
import attrs
import outcome
import trio

from t3d.errors import StoreError
from t3d.store.read_classes import ReadClass, ReadScheduler, Ticket
from t3d.store.schema import READER_PRAGMAS

Raw = TypeVar("Raw")
T = TypeVar("T")


async def _in_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a worker thread (trio's cache); the caller wakes once, with its outcome.
    Not cancellable once started, like a read that runs. The scheduler already bounds reads
    at the pool's size, so no limiter: `trio.to_thread.run_sync` would add two trips through
    the scheduler (its limiter and a checkpoint) to every read (see t3d/waits.py)."""
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def deliver(result: outcome.Outcome[T]) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    trio.lowlevel.start_thread_soon(fn, deliver)
    return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)  # type: ignore[no-any-return]


def open_reader_connection(path: str) -> apsw.Connection:
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    for pragma in READER_PRAGMAS:
        conn.execute(pragma)
    return conn


@attrs.frozen
class ReaderStatistics:
    size: int
    busy: int
    # Reads waiting for a reader, per class.
    waiting_small: int
    waiting_page: int
    waiting_history: int


class ReaderPool:
    def __init__(self, path: str, size: int) -> None:
        self._path = path
        self._scheduler = ReadScheduler(size)
        self._wakeups: dict[Ticket, trio.Event] = {}
        self._idle: list[apsw.Connection] = []
        self.size = size

    @property
    def busy(self) -> int:
        return self._scheduler.running()

    def statistics(self) -> ReaderStatistics:
        waiting = self._scheduler.waiting
        return ReaderStatistics(
            size=self.size,
            busy=self.busy,
            waiting_small=waiting(ReadClass.SMALL),
            waiting_page=waiting(ReadClass.PAGE),
            waiting_history=waiting(ReadClass.HISTORY),
        )

    async def read(
        self,
        query: Callable[[apsw.Connection], Raw],
        decode: Callable[[Raw], T],
        read_class: ReadClass = ReadClass.PAGE,
    ) -> T:
        ticket = self._scheduler.arrive(read_class)
        wakeup = self._wakeups[ticket] = trio.Event()
        self._dispatch()
        try:
            if not wakeup.is_set():  # granted at once: no trip through the scheduler
                await wakeup.wait()
        except BaseException:
            self._leave(ticket)
            raise
        try:
            return await _in_thread(lambda: self._run(query, decode))
        finally:
            self._leave(ticket)

    def _leave(self, ticket: Ticket) -> None:
        del self._wakeups[ticket]
        self._scheduler.leave(ticket)
        self._dispatch()

    def _dispatch(self) -> None:
        while (ticket := self._scheduler.grant()) is not None:
            self._wakeups[ticket].set()

    def _run(self, query: Callable[[apsw.Connection], Raw], decode: Callable[[Raw], T]) -> T:
        conn = self._idle.pop() if self._idle else self._open()
        try:
            with conn:  # one read transaction: a consistent view across statements
                raw = query(conn)
        except apsw.Error as exc:
            conn.close()
            raise StoreError(f"database read failed: {exc}") from exc
        self._idle.append(conn)
        return decode(raw)

    def _open(self) -> apsw.Connection:
        try:
            return open_reader_connection(self._path)
        except apsw.Error as exc:
            raise StoreError(f"could not open a database reader on {self._path}: {exc}") from exc

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
