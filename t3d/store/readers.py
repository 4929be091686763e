"""The reader pool: read-only connections used from worker threads.

Rules:
- At most ``size`` reads run at once (a `trio.CapacityLimiter`); each takes a
  free connection, runs its query in one read transaction on a worker thread,
  ends the transaction, then decodes the rows on that thread. The loop only
  ever sees decoded values.
- Connections are opened lazily. One that fails to open fails only the read
  that asked for it; the next read tries again (a reader never stays off).
- A connection whose query raised an SQLite error is closed, not reused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import apsw
import trio

from t3d.errors import StoreError
from t3d.store.schema import READER_PRAGMAS

Raw = TypeVar("Raw")
T = TypeVar("T")


def open_reader_connection(path: str) -> apsw.Connection:
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    for pragma in READER_PRAGMAS:
        conn.execute(pragma)
    return conn


class ReaderPool:
    def __init__(self, path: str, size: int) -> None:
        self._path = path
        self._limiter = trio.CapacityLimiter(size)
        self._idle: list[apsw.Connection] = []
        self.size = size

    @property
    def busy(self) -> int:
        return int(self._limiter.borrowed_tokens)

    async def read(self, query: Callable[[apsw.Connection], Raw], decode: Callable[[Raw], T]) -> T:
        async with self._limiter:
            return await trio.to_thread.run_sync(self._run, query, decode)

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
