"""Database maintenance: statistics, vacuum, integrity checks and online backups.

- `stats_query` is a read for the reader pool: sizes and pages from SQLite, events by
  kind and age from a covering scan of ``events_by_entity`` (no payload is read), the
  largest threads from their maintained counts.
- `run_vacuum` hands free pages back in writer jobs of `VACUUM_STEP_PAGES` (incremental
  auto-vacuum), or, with ``full`` or on a database that predates incremental auto-vacuum,
  runs one VACUUM on the writer: it rewrites the file and every write waits meanwhile.
- `run_check` and `run_backup` use a connection of their own in a worker thread (never
  the loop, never a reader of the pool for minutes), in steps with progress between
  them: a check per table (``integrity_check(T)``: the table and its indexes), then
  ``foreign_key_check`` and the projections' own invariants (no orphans, maintained
  counts that match); a backup through SQLite's backup API in steps of `BACKUP_STEP_PAGES`
  inside one read transaction, so the copy is the database as of one commit (its
  ``sequence``) however long it takes while the daemon writes on. The copy is written
  beside its target with mode 0600 and renamed into place once whole.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import trio

from t3d.errors import StoreError
from t3d.store.queries import current_sequence
from t3d.store.retention import (
    COMPACTED_COUNT,
    checkpoint_wal,
    cursor_name,
    first_from,
    free_pages,
    retention_value,
    shell_pruned_through,
)
from t3d.store.retention_plan import CLASSES, last_before
from t3d.store.schema import AUTO_VACUUM_INCREMENTAL, auto_vacuum
from t3d.store.store import Store

VACUUM_STEP_PAGES = 256  # 1 MiB of 4 KiB pages per writer job (~10 ms)
BACKUP_STEP_PAGES = 1024
AGES = (("1h", 3600.0), ("1d", 86400.0), ("7d", 7 * 86400.0), ("30d", 30 * 86400.0))
LARGEST_THREADS = 10

Progress = Callable[[str, int, int], None]  # (phase, done, total)


# --- stats ---------------------------------------------------------------------------


def stats_query(path: Path, now: float) -> Callable[[apsw.Connection], dict[str, Any]]:
    def query(conn: apsw.Connection) -> dict[str, Any]:
        page_size = int(conn.execute("PRAGMA page_size").get)
        pages = int(conn.execute("PRAGMA page_count").get)
        top = current_sequence(conn)
        first = first_from(conn)
        bounds = [(name, last_before(first, 0, top, now - age)) for name, age in AGES]
        ages = ["<1h", "1h-1d", "1d-7d", "7d-30d", ">30d"]
        sums = ", ".join(f"sum(sequence > {int(b)})" for _, b in bounds)
        by_kind = {}
        for kind, count, *younger in conn.execute(
            f"SELECT kind, count(*), {sums} FROM events INDEXED BY events_by_entity GROUP BY kind"
        ):
            buckets = _buckets(int(count), [int(y or 0) for y in younger])
            by_kind[kind] = {"total": int(count), "by_age": dict(zip(ages, buckets, strict=True))}
        largest = [
            {
                "thread_id": thread_id,
                "title": title,
                "turns": int(turns),
                "items": int(items),
                "events": _thread_events(conn, thread_id),
            }
            for thread_id, turns, items, title in conn.execute(
                "SELECT n.thread_id, n.turns, n.items, json_extract(t.body, '$.title') FROM thread_counts n "
                "LEFT JOIN threads t ON t.id = n.thread_id ORDER BY n.items DESC LIMIT ?",
                (LARGEST_THREADS,),
            )
        ]
        totals: Any = conn.execute(
            "SELECT (SELECT count(*) FROM threads), coalesce(sum(turns), 0), coalesce(sum(items), 0) FROM thread_counts"
        ).fetchall()[0]
        return {
            "path": str(path),
            "file_bytes": _size(path),
            "wal_bytes": _size(Path(f"{path}-wal")),
            "page_size": page_size,
            "pages": pages,
            "free_pages": free_pages(conn),
            "auto_vacuum": {0: "none", 1: "full", 2: "incremental"}.get(
                auto_vacuum(conn), "unknown"
            ),
            "sequence": top,
            "events": sum(k["total"] for k in by_kind.values()),
            "events_by_kind": by_kind,
            "threads": int(totals[0]),
            "turns": int(totals[1]),
            "items": int(totals[2]),
            "largest_threads": largest,
            "retention": {
                "cursors": {cls: retention_value(conn, cursor_name(cls)) for cls in CLASSES},
                "shell_pruned_through": shell_pruned_through(conn),
                "compacted": retention_value(conn, COMPACTED_COUNT),
                "threads_to_purge": int(conn.execute("SELECT count(*) FROM purge_threads").get),
            },
        }

    return query


def _buckets(total: int, younger: list[int]) -> list[int]:
    """Counts per age bucket from the counts younger than each bound (1h, 1d, 7d, 30d). Pure."""
    edges = [*younger, total]
    return [edges[0]] + [edges[i] - edges[i - 1] for i in range(1, len(edges))]


def _thread_events(conn: apsw.Connection, thread_id: str) -> int:
    return int(conn.execute("SELECT count(*) FROM events WHERE thread_id = ?", (thread_id,)).get)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# --- vacuum --------------------------------------------------------------------------


def _vacuum_step(pages: int) -> Callable[[apsw.Connection], tuple[int, float]]:
    def step(conn: apsw.Connection) -> tuple[int, float]:
        started = time.perf_counter()
        try:
            conn.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
            return free_pages(conn), time.perf_counter() - started
        except apsw.Error as exc:
            raise StoreError(f"the vacuum step failed: {exc}") from exc

    return step


def _full_vacuum(conn: apsw.Connection) -> dict[str, Any]:
    before = int(conn.execute("PRAGMA page_count").get)
    try:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
        checkpoint_wal(conn)
    except apsw.Error as exc:
        raise StoreError(f"VACUUM failed: {exc}; the database is unchanged") from exc
    return {"pages_before": before, "pages_after": int(conn.execute("PRAGMA page_count").get)}


def _vacuum_state(conn: apsw.Connection) -> tuple[int, int, int]:
    return auto_vacuum(conn), free_pages(conn), int(conn.execute("PRAGMA page_count").get)


async def run_vacuum(store: Store, *, full: bool, progress: Progress) -> dict[str, Any]:
    """Give free pages back to the file system (see the module docstring)."""
    mode, free, pages = await store.maintain(_vacuum_state)
    if full or mode != AUTO_VACUUM_INCREMENTAL:
        progress("rewriting the whole file (VACUUM)", 0, 0)
        started = time.monotonic()
        result = await store.maintain(_full_vacuum)
        return {
            "mode": "full",
            "elapsed_s": time.monotonic() - started,
            "freed_pages": pages - result["pages_after"],
            **result,
        }
    started, left = time.monotonic(), free
    progress("incremental vacuum", 0, free)
    while left > 0:
        now_free, elapsed = await store.maintain(_vacuum_step(VACUUM_STEP_PAGES))
        if now_free >= left:  # nothing moved (others reused the pages meanwhile): done
            break
        left = now_free
        progress("incremental vacuum", free - left, free)
        await trio.sleep(elapsed)  # the writer is as much others' as this vacuum's
    await store.maintain(checkpoint_wal)
    return {
        "mode": "incremental",
        "elapsed_s": time.monotonic() - started,
        "pages_before": pages,
        "freed_pages": free - left,
        "free_pages": left,
    }


# --- check ---------------------------------------------------------------------------

LOGICAL_CHECKS = (
    (
        "rows whose thread does not exist",
        "SELECT '{t}', count(*) FROM {t} WHERE thread_id NOT IN (SELECT id FROM threads)",
        ("turns", "items", "requests", "sessions", "checkpoints"),
    ),
    (
        "threads whose maintained counts do not match their rows",
        "SELECT n.thread_id, n.turns, n.items FROM thread_counts n WHERE "
        "n.turns != (SELECT count(*) FROM turns WHERE thread_id = n.thread_id) OR "
        "n.items != (SELECT count(*) FROM items WHERE thread_id = n.thread_id) LIMIT 20",
        (),
    ),
)


def _open_reader(path: Path) -> apsw.Connection:
    try:
        conn = apsw.Connection(os.fspath(path), flags=apsw.SQLITE_OPEN_READONLY)
        conn.execute("PRAGMA busy_timeout=5000")
        return conn
    except apsw.Error as exc:
        raise StoreError(f"could not open {path} to read it: {exc}") from exc


def _tables(conn: apsw.Connection) -> list[str]:
    return [
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name"
        )
    ]


def _check_table(conn: apsw.Connection, table: str) -> list[str]:
    rows = [str(r) for (r,) in conn.execute(f'PRAGMA integrity_check("{table}")')]
    return [] if rows == ["ok"] else [f"{table}: {r}" for r in rows]


def _check_logical(conn: apsw.Connection) -> list[str]:
    problems = [f"foreign key: {row}" for row in conn.execute("PRAGMA foreign_key_check")]
    what, sql, tables = LOGICAL_CHECKS[0]
    for table in tables:
        for name, count in conn.execute(sql.format(t=table)):
            if count:
                problems.append(f"{name}: {count} {what}")
    what, sql, _ = LOGICAL_CHECKS[1]
    for thread_id, turns, items in conn.execute(sql):
        problems.append(f"thread {thread_id}: {what} (turns {turns}, items {items})")
    return problems


async def run_check(path: Path, *, progress: Progress) -> dict[str, Any]:
    """``integrity_check`` of every table and its indexes, then the logical checks."""
    started = time.monotonic()
    conn = await trio.to_thread.run_sync(_open_reader, path)
    try:
        tables = await trio.to_thread.run_sync(_tables, conn)
        problems: list[str] = []
        for done, table in enumerate(tables):
            progress(f"checking {table}", done, len(tables) + 1)
            problems += await trio.to_thread.run_sync(_in_read(_check_table), conn, table)
        progress("checking the projections", len(tables), len(tables) + 1)
        problems += await trio.to_thread.run_sync(_in_read(_check_logical), conn)
        progress("done", len(tables) + 1, len(tables) + 1)
    except apsw.Error as exc:
        raise StoreError(f"the check could not read the database: {exc}") from exc
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(conn.close)
    return {
        "ok": not problems,
        "problems": problems[:200],
        "tables": len(tables),
        "elapsed_s": time.monotonic() - started,
    }


def _in_read(fn: Callable[..., list[str]]) -> Callable[..., list[str]]:
    def run(conn: apsw.Connection, *args: Any) -> list[str]:
        with conn:
            found = fn(conn, *args)
        return found

    return run


# --- backup --------------------------------------------------------------------------


class _Backup:
    """The backup's own connections; every method runs in a worker thread, one at a time."""

    def __init__(self, source: Path, target: Path) -> None:
        self.target = target
        self.partial = target.with_name(target.name + ".partial")
        self.src = _open_reader(source)
        self.dest: apsw.Connection | None = None
        self.backup: Any = None
        self.sequence = 0

    def begin(self) -> None:
        try:
            fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise StoreError(
                f"{self.partial} exists (another backup, or one that was cut short); remove it and try again"
            ) from None
        except OSError as exc:
            raise StoreError(f"cannot create {self.partial}: {exc.strerror}") from None
        os.close(fd)
        self.src.execute("BEGIN")
        self.sequence = current_sequence(
            self.src
        )  # the read transaction, and so the snapshot, starts here
        self.dest = apsw.Connection(os.fspath(self.partial))
        self.backup = self.dest.backup("main", self.src, "main")

    def step(self) -> tuple[int, int]:
        self.backup.step(BACKUP_STEP_PAGES)
        return self.backup.pagecount - self.backup.remaining, self.backup.pagecount

    @property
    def done(self) -> bool:
        return bool(self.backup.done)

    def finish(self) -> int:
        self.backup.finish()
        self.backup = None
        assert self.dest is not None
        self.dest.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        self.dest.close()
        self.dest = None
        with open(self.partial, "rb") as f:
            os.fsync(f.fileno())
        os.replace(self.partial, self.target)
        return self.target.stat().st_size

    def close(self, *, keep: bool) -> None:
        if self.backup is not None:
            self.backup.close()
        if self.dest is not None:
            self.dest.close()
        if not self.src.get_autocommit():
            self.src.execute("COMMIT")
        self.src.close()
        if not keep:
            self.partial.unlink(missing_ok=True)


def check_backup_target(raw: str, database: Path) -> Path:
    """The backup's target: an absolute path in an existing directory, not a file yet (and
    not the database's own); raises StoreError naming the fix. It looks at the disk."""
    path = Path(raw)
    if not path.is_absolute():
        raise StoreError(
            f"backup path {raw!r} is not absolute; give the full path of the file to write"
        )
    if not path.parent.is_dir():
        raise StoreError(f"the directory {path.parent} does not exist; create it first")
    if path.exists() or path.is_symlink():
        raise StoreError(f"{path} exists; choose a new file name (a backup never overwrites)")
    own = {Path(f"{database}{suffix}").resolve() for suffix in ("", "-wal", "-shm", "-journal")}
    if path.resolve() in own:
        raise StoreError(f"{path} is the database itself; back it up to another file")
    return path


async def run_backup(source: Path, target: Path, *, progress: Progress) -> dict[str, Any]:
    """Copy the database to ``target`` online (see the module docstring)."""
    started = time.monotonic()
    backup = await trio.to_thread.run_sync(_Backup, source, target)
    finished = False
    try:
        await trio.to_thread.run_sync(backup.begin)
        while not backup.done:
            done, total = await trio.to_thread.run_sync(backup.step)
            progress("copying pages", done, total)
        size = await trio.to_thread.run_sync(backup.finish)
        finished = True
    except apsw.Error as exc:
        raise StoreError(f"the backup failed: {exc}") from exc
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: backup.close(keep=finished))
    return {
        "path": str(target),
        "bytes": size,
        "sequence": backup.sequence,
        "elapsed_s": time.monotonic() - started,
    }
