"""Retention's SQL: the survey of a pass and each bounded step (retention_plan.py says which).

Every function takes a connection and runs on the thread that owns it: `survey` and dry
steps on a reader (they only read), `run_step` on the writer, each step in one short
``BEGIN IMMEDIATE`` transaction that also moves the cursors and marks, so a step is done
whole or not at all. SQLite errors become `StoreError` here.

Marks (migration 5): ``pruned_threads`` holds, per thread, the highest sequence of an
event of the thread that was deleted or compacted; the ``retention`` row ``shell`` the
highest sequence of a deleted ``thread.deleted`` event. A resume from before a mark gets
a snapshot (replay.py), so a replay never lacks an event nor meets a compacted one (the
shell's replay reads no compacted kind's payload: it reads the threads' rows). The
``retention`` row ``compacted`` counts the compacted events stored (for ``db.stats``).

Packing: when a window compacts an item's newest event, the item's row is its only record
and cold, so the same step stores its body packed (packing.py), in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import apsw
import attrs

from t3d.errors import StoreError
from t3d.store.packing import pack
from t3d.store.queries import current_sequence
from t3d.store.retention_plan import (
    CLASSES,
    COMPACTED,
    KINDS,
    STATE,
    Checkpoint,
    Outbox,
    Policy,
    Purge,
    Step,
    StepResult,
    Survey,
    Vacuum,
    Window,
    cutoff_time,
    last_before,
)
from t3d.store.schema import AUTO_VACUUM_INCREMENTAL, auto_vacuum

SHELL_MARK = "shell"
COMPACTED_COUNT = "compacted"
# Deleted threads a pass takes on (more wait for the next pass, which comes at once).
PURGES_PER_PASS = 64
PACK_BATCH = 500  # item ids per query when a window packs its items' rows


def cursor_name(cls: str) -> str:
    return f"cursor.{cls}"


def retention_value(conn: apsw.Connection, name: str) -> int:
    for (value,) in conn.execute("SELECT value FROM retention WHERE name = ?", (name,)):
        return int(value)
    return 0


def thread_pruned_through(conn: apsw.Connection, thread_id: str) -> int:
    """The highest sequence of the thread's events that retention deleted (0: none)."""
    for (through,) in conn.execute(
        "SELECT through FROM pruned_threads WHERE thread_id = ?", (thread_id,)
    ):
        return int(through)
    return 0


def shell_pruned_through(conn: apsw.Connection) -> int:
    """The highest sequence of a ``thread.deleted`` event that retention deleted (0: none)."""
    return retention_value(conn, SHELL_MARK)


def free_pages(conn: apsw.Connection) -> int:
    return int(conn.execute("PRAGMA freelist_count").get)


def first_from(conn: apsw.Connection) -> Callable[[int], tuple[int, float] | None]:
    """A probe for `last_before`: the first event at or after a sequence, with its time."""

    def probe(sequence: int) -> tuple[int, float] | None:
        for seq, at in conn.execute(
            "SELECT sequence, created_at FROM events WHERE sequence >= ? ORDER BY sequence LIMIT 1",
            (sequence,),
        ):
            return int(seq), float(at)
        return None

    return probe


def survey(conn: apsw.Connection, now: float, policy: Policy) -> Survey:
    """Cursors, cutoffs, deleted threads still to purge, and the free pages: what a pass
    starts from. Call inside one read transaction."""
    try:
        top = current_sequence(conn)
        cursors = {cls: retention_value(conn, cursor_name(cls)) for cls in CLASSES}
        cutoffs = {}
        for cls in CLASSES:
            before = cutoff_time(now, policy.age(cls))
            lo = cursors[cls]
            cutoffs[cls] = (
                lo
                if before is None or lo >= top
                else last_before(first_from(conn), lo, top, before)
            )
        purges = tuple(
            (thread_id, int(through), _events_below(conn, thread_id, int(through)))
            for thread_id, through in conn.execute(
                "SELECT thread_id, through FROM purge_threads ORDER BY through LIMIT ?",
                (PURGES_PER_PASS,),
            )
        )
        return Survey(
            now,
            cursors,
            cutoffs,
            purges,
            auto_vacuum(conn) == AUTO_VACUUM_INCREMENTAL,
            free_pages(conn),
        )
    except apsw.Error as exc:
        raise StoreError(f"retention could not read the database: {exc}") from exc


def _events_below(conn: apsw.Connection, thread_id: str, through: int) -> int:
    return int(
        conn.execute(
            "SELECT count(*) FROM events WHERE thread_id = ? AND sequence < ?", (thread_id, through)
        ).get
    )


def purges_pending(conn: apsw.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM purge_threads").get)


# --- steps -----------------------------------------------------------------------------


def _marks(kinds: tuple[str, ...]) -> str:
    return ",".join("?" * len(kinds))


def _superseded_sql(kinds: tuple[str, ...], dry: bool) -> str:
    """Every earlier event of each entity that has events of ``kinds`` in the window
    ``(lo, hi]`` (bound as lo, hi, *kinds, then lo again when dry). A dry run deletes
    nothing, so it leaves out what an earlier window of the same run would have deleted:
    an event at or below ``lo`` that an event at or below ``lo`` supersedes."""
    # +kind: the window walks the sequence range, never events_by_entity (all of a kind).
    sql = (
        "SELECT o.sequence, o.thread_id, length(o.payload) FROM "
        "(SELECT kind, entity_id, max(sequence) AS last FROM events "
        f"WHERE sequence > ? AND sequence <= ? AND +kind IN ({_marks(kinds)}) GROUP BY kind, entity_id) AS w "
        "JOIN events AS o INDEXED BY events_by_entity "
        "ON o.kind = w.kind AND o.entity_id = w.entity_id AND o.sequence < w.last"
    )
    if dry:
        sql += (
            " WHERE o.sequence > ? OR NOT EXISTS (SELECT 1 FROM events AS x INDEXED BY events_by_entity "
            "WHERE x.kind = o.kind AND x.entity_id = o.entity_id AND x.sequence > o.sequence AND x.sequence <= ?)"
        )
    return sql


_DELETED_IN_WINDOW = (
    "SELECT sequence, entity_id, length(payload) FROM events "
    "WHERE sequence > ? AND sequence <= ? AND +kind = 'thread.deleted'"
)


@attrs.frozen
class _Compactable:
    sequence: int
    kind: str
    thread_id: str | None
    entity_id: str
    created_at: float
    size: int  # payload bytes


def _compactable_sql(kinds: tuple[str, ...]) -> str:
    """The newest event in the window ``(lo, hi]`` (bound as lo, hi, *kinds) of each entity
    of ``kinds`` whose newest event of all it is, if not compacted yet. A dry run asks the
    same: deleting older events changes no entity's newest."""
    return (
        "SELECT e.sequence, e.kind, e.thread_id, e.entity_id, e.created_at, length(e.payload) FROM "
        "(SELECT kind, entity_id, max(sequence) AS last FROM events "
        f"WHERE sequence > ? AND sequence <= ? AND +kind IN ({_marks(kinds)}) AND +kind != 'thread.deleted' "
        "GROUP BY kind, entity_id) AS w "
        "JOIN events AS e ON e.sequence = w.last "
        "WHERE length(e.payload) > 0 AND NOT EXISTS (SELECT 1 FROM events AS x INDEXED BY events_by_entity "
        "WHERE x.kind = w.kind AND x.entity_id = w.entity_id AND x.sequence > w.last)"
    )


def _compactable(conn: apsw.Connection, step: Window) -> list[_Compactable]:
    kinds = KINDS[step.cls]
    return [
        _Compactable(int(s), k, t, e, float(at), int(n or 0))
        for s, k, t, e, at, n in conn.execute(_compactable_sql(kinds), (step.lo, step.hi, *kinds))
    ]


def _compact(conn: apsw.Connection, rows: list[_Compactable]) -> None:
    """Store each event again with the `COMPACTED` payload, as it was otherwise. Deleted and
    inserted, not updated: SQLite merges a table page that a delete leaves under a third
    full with its neighbours, never one an update shrinks, so the space goes back to the
    free list (and the file) instead of staying scattered in the log's old pages, where
    nothing new is ever written (events are appended at the log's end)."""
    conn.executemany("DELETE FROM events WHERE sequence = ?", [(r.sequence,) for r in rows])
    conn.executemany(
        "INSERT INTO events(sequence, kind, thread_id, entity_id, payload, created_at) VALUES (?,?,?,?,?,?)",
        [(r.sequence, r.kind, r.thread_id, r.entity_id, COMPACTED, r.created_at) for r in rows],
    )
    _add_value(conn, COMPACTED_COUNT, len(rows))


def _packable(conn: apsw.Connection, compact: list[_Compactable]) -> list[tuple[int, str, str, str, int, bytes, int]]:
    """The rows of the items whose newest event ``compact`` compacts, packed (`packing.pack`),
    with the bytes each saves; the items packing would not pay for are left out."""
    ids = [r.entity_id for r in compact if r.kind == "item.updated"]
    out = []
    for start in range(0, len(ids), PACK_BATCH):
        chunk = ids[start : start + PACK_BATCH]
        sql = f"SELECT rowid, id, thread_id, turn_id, ordinal, body FROM items WHERE id IN ({_marks(tuple(chunk))})"
        for rowid, item_id, thread_id, turn_id, ordinal, body in conn.execute(sql, chunk):
            packed = pack(body)
            if packed is not None:
                out.append((rowid, item_id, thread_id, turn_id, ordinal, packed, len(body) - len(packed)))
    return out


def _pack(conn: apsw.Connection, rows: list[tuple[int, str, str, str, int, bytes, int]]) -> None:
    """Store each item's row again with its packed body, as it was otherwise (its rowid
    too). Deleted and inserted, not updated, for the same reason as `_compact`."""
    conn.executemany("DELETE FROM items WHERE rowid = ?", [(r[0],) for r in rows])
    conn.executemany(
        "INSERT INTO items(rowid, id, thread_id, turn_id, ordinal, body) VALUES (?,?,?,?,?,?)",
        [r[:6] for r in rows],
    )


def _window_rows(
    conn: apsw.Connection, step: Window, dry: bool
) -> tuple[list[tuple[int, str | None, int]], list[tuple[int, str, int]]]:
    kinds = KINDS[step.cls]
    args: tuple[Any, ...] = (step.lo, step.hi, *kinds) + ((step.lo, step.lo) if dry else ())
    superseded = [
        (int(s), t, int(n or 0)) for s, t, n in conn.execute(_superseded_sql(kinds, dry), args)
    ]
    deleted = []
    if step.cls == STATE:
        deleted = [
            (int(s), e, int(n or 0))
            for s, e, n in conn.execute(_DELETED_IN_WINDOW, (step.lo, step.hi))
        ]
    return superseded, deleted


def _raise_marks(conn: apsw.Connection, marks: dict[str, int]) -> None:
    conn.executemany(
        "INSERT INTO pruned_threads(thread_id, through) VALUES (?, ?) "
        "ON CONFLICT(thread_id) DO UPDATE SET through = max(through, excluded.through)",
        list(marks.items()),
    )


def _set_value(conn: apsw.Connection, name: str, value: int) -> None:
    conn.execute(
        "INSERT INTO retention(name, value) VALUES (?, ?) "
        "ON CONFLICT(name) DO UPDATE SET value = max(value, excluded.value)",
        (name, value),
    )


def _add_value(conn: apsw.Connection, name: str, delta: int) -> None:
    if delta:
        conn.execute(
            "INSERT INTO retention(name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (name, delta),
        )


def _delete_events(conn: apsw.Connection, rows: list[tuple[int, int]]) -> None:
    """Delete the events ``(sequence, payload bytes)``; those compacted leave the count."""
    conn.executemany("DELETE FROM events WHERE sequence = ?", [(s,) for s, _ in rows])
    _add_value(conn, COMPACTED_COUNT, -sum(1 for _, n in rows if n == 0))


def _window(conn: apsw.Connection, step: Window) -> StepResult:
    superseded, deleted = _window_rows(conn, step, dry=False)
    compact = _compactable(conn, step)
    marks: dict[str, int] = {}
    for sequence, thread_id in [(s, t) for s, t, _ in superseded] + [(r.sequence, r.thread_id) for r in compact]:
        if thread_id is not None:
            marks[thread_id] = max(marks.get(thread_id, 0), sequence)
    for sequence, thread_id, _ in deleted:
        marks[thread_id] = max(marks.get(thread_id, 0), sequence)
        _set_value(conn, SHELL_MARK, sequence)
    _delete_events(conn, [(s, n) for s, _, n in superseded + deleted])
    packable = _packable(conn, compact)
    _compact(conn, compact)
    _pack(conn, packable)
    _raise_marks(conn, marks)
    _set_value(conn, cursor_name(step.cls), step.hi)
    return StepResult(
        rows=len(superseded) + len(deleted),
        bytes=sum(n for *_, n in superseded + deleted),
        compacted=len(compact),
        compacted_bytes=sum(r.size for r in compact),
        packed=len(packable),
        packed_bytes=sum(r[6] for r in packable),
    )


def _purge(conn: apsw.Connection, step: Purge) -> tuple[int, int]:
    rows = list(
        conn.execute(
            "SELECT sequence, length(payload) FROM events WHERE thread_id = ? AND sequence < ? ORDER BY sequence LIMIT ?",
            (step.thread_id, step.through, step.limit),
        )
    )
    _delete_events(conn, [(s, int(n or 0)) for s, n in rows])
    if rows:
        _raise_marks(conn, {step.thread_id: max(s for s, _ in rows)})
    if len(rows) < step.limit:
        conn.execute(
            "DELETE FROM purge_threads WHERE thread_id = ? AND through = ?",
            (step.thread_id, step.through),
        )
    return len(rows), sum(int(n or 0) for _, n in rows)


def _outbox(conn: apsw.Connection, step: Outbox) -> int:
    """Done rows older than ``before`` among the first ``limit`` rows (by id, so about by
    age): a row still open at the head does not hold back the rows behind it. The newest
    row always stays: outbox ids are rowids, and the effect worker takes each new id to be
    higher than every earlier one (a deleted highest id would be handed out again)."""
    rows = conn.execute(
        "SELECT id, done_at FROM outbox WHERE id < (SELECT max(id) FROM outbox) ORDER BY id LIMIT ?",
        (step.limit,),
    )
    old = [(i,) for i, done_at in rows if done_at is not None and done_at < step.before]
    conn.executemany("DELETE FROM outbox WHERE id = ?", old)
    return len(old)


def run_step(conn: apsw.Connection, step: Step) -> StepResult:
    """Run one step on the writer connection: one short transaction (vacuum and checkpoint
    are their own statements)."""
    started = time.perf_counter()
    did = StepResult()
    try:
        if isinstance(step, Vacuum):
            conn.execute(f"PRAGMA incremental_vacuum({int(step.pages)})").fetchall()
        elif isinstance(step, Checkpoint):
            checkpoint_wal(conn)
        else:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if isinstance(step, Window):
                    did = _window(conn, step)
                elif isinstance(step, Purge):
                    did = StepResult(*_purge(conn, step))
                else:
                    did = StepResult(rows=_outbox(conn, step))
                conn.execute("COMMIT")
            except BaseException:
                if not conn.get_autocommit():
                    conn.execute("ROLLBACK")
                raise
        free = free_pages(conn)
    except apsw.Error as exc:
        raise StoreError(f"a retention step ({type(step).__name__.lower()}) failed: {exc}") from exc
    return attrs.evolve(did, free_pages=free, elapsed_s=time.perf_counter() - started)


def count_step(conn: apsw.Connection, step: Step) -> StepResult:
    """A dry run's step: what `run_step` would delete, counted in a read transaction."""
    started = time.perf_counter()
    try:
        if isinstance(step, Window):
            superseded, deleted = _window_rows(conn, step, dry=True)
            compact = _compactable(conn, step)
            packable = _packable(conn, compact)
            did = StepResult(
                rows=len(superseded) + len(deleted),
                bytes=sum(n for *_, n in superseded + deleted),
                compacted=len(compact),
                compacted_bytes=sum(r.size for r in compact),
                packed=len(packable),
                packed_bytes=sum(r[6] for r in packable),
            )
        elif isinstance(step, Outbox):
            did = StepResult(
                rows=int(
                    conn.execute(
                        "SELECT count(*) FROM outbox WHERE done_at < ?", (step.before,)
                    ).get
                )
            )
        else:
            raise ValueError(f"a dry run has no {type(step).__name__} step")
    except apsw.Error as exc:
        raise StoreError(f"retention could not read the database: {exc}") from exc
    return attrs.evolve(did, elapsed_s=time.perf_counter() - started)


def checkpoint_wal(conn: apsw.Connection) -> tuple[int, int, int]:
    """Copy the WAL into the database and truncate it, never waiting for a reader: a reader
    that holds an old snapshot leaves the rest for the next time (busy, log, checkpointed)."""
    previous = int(conn.execute("PRAGMA busy_timeout").get)
    conn.set_busy_timeout(0)
    try:
        row: Any = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0]
    finally:
        conn.set_busy_timeout(previous)
    return int(row[0]), int(row[1]), int(row[2])
