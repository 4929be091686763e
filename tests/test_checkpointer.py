"""WAL checkpoints off the writer (t3d/store/checkpointer.py), on real SQLite files.

Pins: in the daemon's store, commits never checkpoint while the checkpointer runs (its
thread does, and the WAL stays near its mark); with the thread not running, commits
checkpoint themselves at the bound, so the WAL never grows without one; and the store
closes with the WAL folded in (the writer's connection is the last one)."""

from __future__ import annotations

import os
from pathlib import Path

import apsw
import trio
from harness import wait_until

from t3d.store.checkpointer import Checkpointer
from t3d.store.store import open_store

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


async def test_the_checkpointer_thread_runs_the_checkpoints_and_no_commit_does(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        await store.maintain(_scratch)
        for _ in range(600):  # ~6,000 pages: six times SQLite's auto-checkpoint mark
            await store.maintain(lambda conn: _write_pages(conn, 10))
        with trio.fail_after(10):
            await wait_until(lambda: store.statistics().wal_checkpoints >= 3)
        stats = store.statistics()
        assert stats.wal_checkpoints_on_writer == 0
        assert stats.wal_checkpoint_failures == 0
        assert stats.wal_checkpoint_s > 0
        # Never near the backstop (10,000 pages): the thread kept up.
        assert _wal_bytes(tmp_path) < 5000 * PAGE
    assert not (tmp_path / "db-wal").exists()  # the writer closed last and folded the WAL in


def test_with_the_thread_not_running_a_commit_checkpoints_at_the_mark(tmp_path: Path) -> None:
    conn = apsw.Connection(os.fspath(tmp_path / "db"))
    conn.execute("PRAGMA journal_mode=WAL")
    _scratch(conn)
    checkpointer = Checkpointer(lambda: apsw.Connection(os.fspath(tmp_path / "db")), pages=50)
    checkpointer.install(conn)
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
    conn = apsw.Connection(os.fspath(tmp_path / "db"))
    conn.execute("PRAGMA journal_mode=WAL")
    _scratch(conn)
    checkpointer = Checkpointer(lambda: apsw.Connection(os.fspath(tmp_path / "db")), pages=50, backstop_pages=300)
    checkpointer.install(conn)
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
        # And the thread did not spin on it: a few rounds per 1,000 pages, not one per commit.
        assert store.statistics().wal_checkpoints < 30
        await trio.to_thread.run_sync(_released, reader)
        before = store.statistics().wal_checkpoints
        for _ in range(150):
            await store.maintain(lambda conn: _write_pages(conn, 10))
        with trio.fail_after(10):
            await wait_until(lambda: store.statistics().wal_checkpoints > before)
        assert store.statistics().wal_checkpoints_on_writer == 0
