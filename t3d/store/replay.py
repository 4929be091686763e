"""Resume reads: what a subscriber missed since ``after``, or a fresh base when that is too much.

Each query runs in one read transaction on a reader thread, so the events it
replays and the sequence it reports (or the snapshot it falls back to) are
one consistent view. A gap is replayed only within the caller's bounds
(events and bytes); reading stops as soon as a bound is passed, so a huge gap
costs no more than a snapshot. A gap that reaches back past events retention
pruned (t3d/store/retention.py: the thread's, or for the shell the global,
pruned-through mark) gets a snapshot too, so a replay is always every event
the subscriber missed. Retention raises a thread's mark past each event it
compacts (its payload dropped: its body is its row), so a thread replay never
reaches one; should one be in a gap all the same, that gap gets a snapshot. The
shell replay sends only ``project.updated`` payloads (never compacted) and reads
the touched threads' rows.
"""

from __future__ import annotations

from collections.abc import Iterable

import apsw
import attrs

from t3d.store.commit import SHELL_KINDS, SHELL_SQL, ShellColumns
from t3d.store.queries import ShellRaw, SnapshotRaw, current_sequence, shell_query, snapshot_query
from t3d.store.retention import shell_pruned_through, thread_pruned_through
from t3d.store.retention_plan import COMPACTED


@attrs.frozen
class ThreadReplayRaw:
    sequence: int
    events: list[tuple[int, str, bytes]]  # (sequence, kind, payload) after ``after``, in order


def replay_window(
    rows: Iterable[tuple[int, str, bytes]], max_events: int, max_bytes: int
) -> list[tuple[int, str, bytes]] | None:
    """All of ``rows`` if they are at most ``max_events`` events and ``max_bytes`` payload
    bytes and none is compacted, else None; stops reading ``rows`` at the first one past a
    bound or compacted. Pure."""
    events: list[tuple[int, str, bytes]] = []
    size = 0
    for row in rows:
        size += len(row[2])
        events.append(row)
        if len(events) > max_events or size > max_bytes or row[2] == COMPACTED:
            return None
    return events


def thread_resume_query(thread_id: str, after: int, turn_limit: int, max_events: int, max_bytes: int):  # type: ignore[no-untyped-def]
    """The thread's events after ``after`` if within the bounds; otherwise its snapshot."""

    def query(conn: apsw.Connection) -> ThreadReplayRaw | SnapshotRaw:
        sequence = current_sequence(conn)
        exists = any(True for _ in conn.execute("SELECT 1 FROM threads WHERE id = ?", (thread_id,)))
        if exists and thread_pruned_through(conn, thread_id) <= after <= sequence:
            rows = conn.execute(
                "SELECT sequence, kind, payload FROM events WHERE thread_id = ? AND sequence > ? "
                "ORDER BY sequence LIMIT ?",
                (thread_id, after, max_events + 1),
            )
            events = replay_window(rows, max_events, max_bytes)
            if events is not None:
                return ThreadReplayRaw(sequence, events)
        return snapshot_query(thread_id, turn_limit, None)(conn)  # type: ignore[no-any-return]

    return query


@attrs.frozen
class ShellReplayRaw:
    sequence: int
    projects: list[tuple[int, bytes]]  # (sequence, payload) of each project.updated
    # (thread id, sequence of its last shell-moving event, its shell row or None if gone)
    threads: list[tuple[str, int, ShellColumns | None]]


_SHELL_EVENT_KINDS = tuple(sorted(SHELL_KINDS | {"project.updated"}))


def shell_resume_query(after: int, max_events: int, max_bytes: int, max_scan: int):  # type: ignore[no-untyped-def]
    """What moved the shell after ``after`` (projects, touched threads' rows), if within the
    bounds and within ``max_scan`` events of any kind; otherwise the whole shell."""

    def query(conn: apsw.Connection) -> ShellReplayRaw | ShellRaw:
        sequence = current_sequence(conn)
        # Sequences are never reused, so at most sequence - after events follow ``after``.
        if shell_pruned_through(conn) <= after <= sequence and sequence - after <= max_scan:
            projects: list[tuple[int, bytes]] = []
            touched: dict[str, int] = {}
            size = 0
            marks = ",".join("?" * len(_SHELL_EVENT_KINDS))
            rows = conn.execute(
                "SELECT sequence, kind, thread_id, length(payload), "
                "CASE WHEN kind = 'project.updated' THEN payload END "
                # +kind: walk the sequence range, never events_by_entity (all events of a kind)
                f"FROM events WHERE sequence > ? AND +kind IN ({marks}) ORDER BY sequence",
                (after, *_SHELL_EVENT_KINDS),
            )
            for count, (seq, kind, thread_id, length, payload) in enumerate(rows, 1):
                size += length
                if count > max_events or size > max_bytes:
                    return shell_query(conn)
                if kind == "project.updated":
                    projects.append((seq, payload))
                elif thread_id is not None:
                    touched[thread_id] = seq
            threads: list[tuple[str, int, ShellColumns | None]] = []
            for thread_id, seq in touched.items():
                row = None
                for body, turns, items, activity in conn.execute(SHELL_SQL + " WHERE t.id = ?", (thread_id,)):
                    row = (body, turns, items, activity)
                threads.append((thread_id, seq, row))
            return ShellReplayRaw(sequence, projects, threads)
        return shell_query(conn)

    return query
