"""WAL checkpoints on the writer while they are quick, on their own thread while they are
slow (t3d/store/checkpointer.py), on real SQLite files.

Pins: while checkpoints are slow, commits leave them to the thread (and the WAL stays near
its mark); while they are quick, commits run them and the thread stays idle; with the
thread not running, commits checkpoint themselves at the bound, so the WAL never grows
without one; a reader's snapshot holds the WAL back but no commit waits for it; and the
store closes with the WAL folded in (the writer's connection is the last one)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import apsw
import trio
from harness import wait_until

from t3d.store.checkpointer import Checkpointer
from t3d.store.store import Store, open_store

PAGE = 4096


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


def _wal_bytes(tmp_path: Path) -> int:
    return os.path.getsize(tmp_path / "db-wal")


def _scratch(conn: apsw.Connection) -> None:
    conn.execute("CREATE TABLE scratch(x BLOB)")


def _write_pages(conn: apsw.Connection, pages: int) -> None:
    with conn:
        for _ in range(pages):
            conn.execute("INSERT INTO scratch VALUES (randomblob(3900))")


def _snapshot_held(path: Path) -> apsw.Connection:
    reader = apsw.Connection(os.fspath(path), flags=apsw.SQLITE_OPEN_READONLY)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM scratch").get == 0  # the snapshot is taken
    return reader


def _released(reader: apsw.Connection) -> None:
    reader.execute("COMMIT")
    reader.close()


def _checkpointed(tmp_path: Path, *, reads_the_file: bool = True, **options: Any) -> tuple[apsw.Connection, Checkpointer]:
    """A writer connection hooked by a checkpointer whose connection (as the store's does)
    reads the file when it opens, or (``reads_the_file=False``) does not."""
    conn = apsw.Connection(os.fspath(tmp_path / "db"))
    conn.execute("PRAGMA journal_mode=WAL")
    _scratch(conn)

    def connect() -> apsw.Connection:
        other = apsw.Connection(os.fspath(tmp_path / "db"))
        if reads_the_file:
            other.execute("PRAGMA journal_mode").fetchall()
        return other

    checkpointer = Checkpointer(connect, **options)
    checkpointer.install(conn)
    return conn, checkpointer


def test_while_checkpoints_are_slow_the_thread_runs_them_and_no_commit_does(tmp_path: Path) -> None:
    conn, checkpointer = _checkpointed(tmp_path, pages=100, slow_s=0.0)  # every checkpoint counts as slow
    checkpointer.start()
    try:
        for _ in range(100):
            _write_pages(conn, 10)  # 1,000 pages: ten marks
        assert checkpointer.on_writer == 1  # the first, whose cost was not known yet
        assert checkpointer.checkpoints >= 3 and checkpointer.thread_s > 0
        assert checkpointer.failures == 0
        assert _wal_bytes(tmp_path) < 500 * PAGE  # the thread kept up
        # Quick again (here: the mark moved): the next round on the thread hands the
        # checkpoints back to the commits.
        checkpointer._slow_s = 60.0
        before = checkpointer.checkpoints
        for _ in range(40):
            _write_pages(conn, 10)
        assert checkpointer.on_writer >= 2
        assert checkpointer.checkpoints <= before + 2
    finally:
        trio.run(checkpointer.stop)
        conn.close()


def test_while_checkpoints_are_quick_commits_run_them_and_the_thread_stays_idle(tmp_path: Path) -> None:
    conn, checkpointer = _checkpointed(tmp_path, pages=100, slow_s=60.0)
    checkpointer.start()
    try:
        for _ in range(100):
            _write_pages(conn, 10)
        assert checkpointer.on_writer >= 8 and checkpointer.writer_s > 0
        assert checkpointer.checkpoints == 0
        assert _wal_bytes(tmp_path) < 130 * PAGE  # each completes, so the WAL starts again
    finally:
        trio.run(checkpointer.stop)
        conn.close()


async def test_in_the_store_the_wal_stays_near_its_mark_and_is_folded_in_at_close(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        await store.maintain(_scratch)
        for _ in range(600):  # ~6,000 pages: six times the mark
            await store.maintain(lambda conn: _write_pages(conn, 10))
        stats = store.statistics()
        assert stats.wal_checkpoints + stats.wal_checkpoints_on_writer >= 5  # on whichever side was quick
        assert stats.wal_checkpoint_failures == 0
        assert _wal_bytes(tmp_path) < 5000 * PAGE  # never near the bound (10,000 pages)
    assert not (tmp_path / "db-wal").exists()  # the writer closed last and folded the WAL in


def test_with_the_thread_not_running_a_commit_checkpoints_at_the_mark(tmp_path: Path) -> None:
    conn, checkpointer = _checkpointed(tmp_path, pages=50, slow_s=0.0)  # slow, but no thread to take them
    for _ in range(40):
        _write_pages(conn, 10)  # 400 pages, a transaction at a time
    assert checkpointer.on_writer >= 6
    assert checkpointer.checkpoints == 0
    # Each checkpoint completes (no reader), so the WAL starts again: it stays near 50 pages.
    assert _wal_bytes(tmp_path) < 80 * PAGE
    conn.close()


def test_a_connection_that_cannot_checkpoint_is_counted_and_commits_keep_the_wal_bounded(tmp_path: Path) -> None:
    """A connection that has not read the file checkpoints nothing (SQLite answers -1): each
    round counts as failed, and the commits' backstop keeps the WAL near its bound."""
    conn, checkpointer = _checkpointed(tmp_path, reads_the_file=False, pages=50, backstop_pages=300, slow_s=0.0)
    checkpointer.start()
    try:
        for _ in range(200):
            _write_pages(conn, 10)  # 2,000 pages
        assert checkpointer.failures >= 1 and checkpointer.checkpoints == 0
        assert checkpointer.on_writer >= 1
        assert _wal_bytes(tmp_path) < 400 * PAGE
    finally:
        trio.run(checkpointer.stop)
        conn.close()


async def test_a_reader_holding_a_snapshot_holds_the_wal_back_but_nothing_waits(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        await store.maintain(_scratch)
        reader = await trio.to_thread.run_sync(_snapshot_held, tmp_path / "db")
        for _ in range(300):
            with trio.fail_after(10):  # a commit never waits for the reader
                await store.maintain(lambda conn: _write_pages(conn, 10))
        grown = _wal_bytes(tmp_path)
        assert grown > 2500 * PAGE  # the checkpoints could not pass the reader's snapshot
        # And nothing spun on it: a few checkpoints per 1,000 pages, not one per commit.
        assert _checkpoints(store) < 30
        await trio.to_thread.run_sync(_released, reader)
        before = _checkpoints(store)
        for _ in range(300):
            await store.maintain(lambda conn: _write_pages(conn, 10))
        with trio.fail_after(10):
            await wait_until(lambda: _checkpoints(store) > before)
        # Released, the WAL was folded in at the next mark (at most 1,000 pages on) and
        # started again from its beginning: 3,000 more pages grew the file by less.
        assert _wal_bytes(tmp_path) < grown + 1500 * PAGE


def _checkpoints(store: Store) -> int:
    stats = store.statistics()
    return stats.wal_checkpoints + stats.wal_checkpoints_on_writer
