"""Read queries: a ``query(conn) -> raw rows`` and a ``decode(raw) -> value`` each.

Queries run inside a read transaction on a reader thread and return bytes;
decoding happens after the transaction ends. Every query uses an index (see
schema.py); none counts or scans a whole table on a per-thread path.
"""

from __future__ import annotations

from typing import Any

import apsw
import attrs
import orjson

from t3d.domain.codec import converter
from t3d.domain.model import RuntimeRequest, Turn, TurnItem
from t3d.store.commit import SHELL_SQL, ShellColumns, shell_payload
from t3d.store.packing import unpack
from t3d.store.read_classes import ReadClass
from t3d.store.schema import TERMINAL

DEFAULT_TURN_LIMIT = 10
MAX_TURN_LIMIT = 1000
# A snapshot stops taking older finished turns once their stored bytes pass this (at
# least one turn is always taken, and every open turn): a huge thread is paged with
# ``before`` instead of being held whole in memory (`has_more` says there is more).
SNAPSHOT_BYTES = 16 * 1024 * 1024
# A snapshot with ``children`` lists at most this many child threads (the oldest).
MAX_SNAPSHOT_CHILDREN = 500


def snapshot_read_class(turn_limit: int, before: int | None) -> ReadClass:
    """A snapshot of the latest turns, no more than a client sees by default, is a page;
    one that reaches further back (``before``, or a larger ``turn_limit``) is history."""
    if before is None and turn_limit <= DEFAULT_TURN_LIMIT:
        return ReadClass.PAGE
    return ReadClass.HISTORY


def current_sequence(conn: apsw.Connection) -> int:
    """The sequence of the last committed event (0 before the first)."""
    for (seq,) in conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'"):
        return int(seq)
    return 0


def _bodies(conn: apsw.Connection, sql: str, args: tuple[Any, ...]) -> list[bytes]:
    """The rows' bodies as JSON (an item's may be stored packed: packing.py)."""
    return [unpack(body) for (body,) in conn.execute(sql, args)]


def _loads(bodies: list[bytes]) -> list[Any]:
    return [orjson.loads(b) for b in bodies]


# --- thread snapshot -------------------------------------------------------------


@attrs.frozen
class SnapshotRaw:
    sequence: int
    thread: bytes | None
    turns: list[bytes]
    items: list[bytes]  # grouped by turn, in the order of ``turns``
    requests: list[bytes]
    has_more: bool
    # How many of ``items`` belong to each turn (parallel to ``turns``).
    turn_items: tuple[int, ...]
    # The thread's background tasks still running (items of any of its turns).
    tasks: list[bytes] = attrs.Factory(list)
    # Its child threads (subagents), oldest first, at most `MAX_SNAPSHOT_CHILDREN`: only when
    # asked for (None: not asked).
    children: list[bytes] | None = None


def snapshot_query(thread_id: str, turn_limit: int, before: int | None, children: bool = False):  # type: ignore[no-untyped-def]
    """The last ``turn_limit`` turns and every open turn; with ``before``, the ``turn_limit``
    turns before that ordinal only (a page of history). Older finished turns past
    `SNAPSHOT_BYTES` are left to the next page. With ``children``, the thread's child threads
    too (the oldest `MAX_SNAPSHOT_CHILDREN`)."""

    def query(conn: apsw.Connection) -> SnapshotRaw:
        sequence = current_sequence(conn)
        thread = _bodies(conn, "SELECT body FROM threads WHERE id = ?", (thread_id,))
        if not thread:
            return SnapshotRaw(sequence, None, [], [], [], False, ())
        bound = before if before is not None else 1 << 62
        recent = list(
            conn.execute(
                "SELECT id, ordinal, body FROM turns WHERE thread_id = ? AND ordinal < ? "
                "ORDER BY ordinal DESC LIMIT ?",
                (thread_id, bound, turn_limit),
            )
        )
        chosen = {turn_id: (ordinal, body) for turn_id, ordinal, body in recent}
        open_turns: set[str] = set()
        if before is None:
            for turn_id, ordinal, body in conn.execute(
                f"SELECT id, ordinal, body FROM turns WHERE thread_id = ? AND status NOT IN {TERMINAL}",
                (thread_id,),
            ):
                chosen[turn_id] = (ordinal, body)
                open_turns.add(turn_id)
        # Newest first, so the byte bound cuts the oldest finished turns (open turns are the
        # newest anyway).
        newest_first = sorted(chosen.items(), key=lambda kv: kv[1][0], reverse=True)
        taken: list[tuple[str, tuple[int, bytes], list[bytes]]] = []
        size = 0
        for turn_id, (ordinal, body) in newest_first:
            if taken and size > SNAPSHOT_BYTES and turn_id not in open_turns:
                break
            of_turn = _bodies(conn, "SELECT body FROM items WHERE turn_id = ? ORDER BY ordinal", (turn_id,))
            size += len(body) + sum(len(item) for item in of_turn)
            taken.append((turn_id, (ordinal, body), of_turn))
        taken.reverse()
        ordered = [(turn_id, turn) for turn_id, turn, _ in taken]
        items = [item for _, _, of_turn in taken for item in of_turn]
        counts = [len(of_turn) for _, _, of_turn in taken]
        requests = _bodies(
            conn, "SELECT body FROM requests WHERE thread_id = ? AND status = 'pending'", (thread_id,)
        )
        lowest = min((o for _, (o, _) in ordered), default=1)
        return SnapshotRaw(
            sequence,
            thread[0],
            [b for _, (_, b) in ordered],
            items,
            requests,
            lowest > 1,
            tuple(counts),
            running_task_bodies(conn, thread[0]),
            child_thread_bodies(conn, thread_id) if children else None,
        )

    return query


def subagent_turn_ids(conn: apsw.Connection, thread_id: str, turn_id: str, depth: int = 8) -> list[str]:
    """The turns of the subagents ``turn_id`` started, and of theirs (by the parent index):
    their prompts are the turn's agent's to answer."""
    found: list[str] = []
    for body in child_thread_bodies(conn, thread_id):
        child = orjson.loads(body)
        if (child.get("subagent") or {}).get("parent_turn_id") != turn_id:
            continue
        for (child_turn,) in conn.execute("SELECT id FROM turns WHERE thread_id = ? ORDER BY ordinal", (child["id"],)):
            found.append(child_turn)
            if depth > 1:
                found += subagent_turn_ids(conn, child["id"], child_turn, depth - 1)
    return found


def child_thread_bodies(conn: apsw.Connection, thread_id: str) -> list[bytes]:
    """The thread's child threads (its subagents), oldest first, by the parent index."""
    return _bodies(
        conn,
        "SELECT body FROM threads WHERE parent_thread_id = ? ORDER BY rowid LIMIT ?",
        (thread_id, MAX_SNAPSHOT_CHILDREN),
    )


def running_task_bodies(conn: apsw.Connection, thread_body: bytes) -> list[bytes]:
    """The items the thread lists as background tasks still running (point reads by id)."""
    task_ids = orjson.loads(thread_body).get("running_tasks") or []
    found = []
    for item_id in task_ids:
        found += _bodies(conn, "SELECT body FROM items WHERE id = ?", (item_id,))
    return found


def decode_snapshot(raw: SnapshotRaw) -> dict[str, Any] | None:
    if raw.thread is None:
        return None
    turns = _loads(raw.turns)
    snapshot = {
        "sequence": raw.sequence,
        "thread": orjson.loads(raw.thread),
        "turns": turns,
        "items": _loads(raw.items),
        "requests": _loads(raw.requests),
        "tasks": _loads(raw.tasks),
        "has_more": raw.has_more,
        "before": turns[0]["ordinal"] if raw.has_more and turns else None,
    }
    if raw.children is not None:
        snapshot["children"] = _loads(raw.children)
    return snapshot


# --- shell -----------------------------------------------------------------------


@attrs.frozen
class ShellRaw:
    sequence: int
    projects: list[bytes]
    threads: list[ShellColumns]
    thread_ids: list[str] = attrs.Factory(list)  # in the order of ``threads``


_SHELL_WITH_IDS = SHELL_SQL.replace("SELECT ", "SELECT t.id, ", 1)


def shell_query(conn: apsw.Connection) -> ShellRaw:
    threads: list[ShellColumns] = []
    ids: list[str] = []
    for thread_id, body, turns, items, activity in conn.execute(_SHELL_WITH_IDS + " ORDER BY t.rowid"):
        ids.append(thread_id)
        threads.append((body, turns, items, activity))
    return ShellRaw(current_sequence(conn), _bodies(conn, "SELECT body FROM projects ORDER BY rowid", ()), threads, ids)


def decode_shell(raw: ShellRaw) -> dict[str, Any]:
    return {
        "sequence": raw.sequence,
        "projects": _loads(raw.projects),
        "threads": [orjson.loads(shell_payload(*row)) for row in raw.threads],
    }


# --- requests, projects ------------------------------------------------------------


def pending_requests_query(thread_id: str | None):  # type: ignore[no-untyped-def]
    def query(conn: apsw.Connection) -> list[bytes]:
        if thread_id is None:
            return _bodies(conn, "SELECT body FROM requests WHERE status = 'pending' ORDER BY rowid", ())
        return _bodies(
            conn,
            "SELECT body FROM requests WHERE thread_id = ? AND status = 'pending' ORDER BY rowid",
            (thread_id,),
        )

    return query


PendingSequences = tuple[list[tuple[str, str, int]], int]


def pending_request_sequences_query(limit: int):  # type: ignore[no-untyped-def]
    """(id, thread id, opening sequence) of at most ``limit`` pending requests, and the last
    committed sequence. A pending request's opening event is its latest ``request.updated``,
    found through events_by_entity (an entity's newest event is never pruned; were it gone,
    it would read 0)."""

    def query(conn: apsw.Connection) -> PendingSequences:
        rows = conn.execute(
            "SELECT r.id, r.thread_id, (SELECT e.sequence FROM events e WHERE e.thread_id = r.thread_id "
            "AND e.entity_id = r.id AND e.kind = 'request.updated' ORDER BY e.sequence DESC LIMIT 1) "
            "FROM requests r WHERE r.status = 'pending' LIMIT ?",
            (limit,),
        )
        found = [(str(i), str(t), int(s or 0)) for i, t, s in rows]
        return found, current_sequence(conn)

    return query


def pending_requests_by_id_query(request_ids: list[str]):  # type: ignore[no-untyped-def]
    """(id, body) of those of ``request_ids`` that are still pending."""

    def query(conn: apsw.Connection) -> list[tuple[str, bytes]]:
        marks = ",".join("?" * len(request_ids))
        sql = f"SELECT id, body FROM requests WHERE status = 'pending' AND id IN ({marks})"
        return [(str(i), bytes(b)) for i, b in conn.execute(sql, tuple(request_ids))]

    return query


def projects_query(conn: apsw.Connection) -> list[bytes]:
    return _bodies(conn, "SELECT body FROM projects ORDER BY rowid", ())


def body_query(table: str, entity_id: str):  # type: ignore[no-untyped-def]
    """The stored JSON of one item or request (``table`` is ``items`` or ``requests``), or None."""
    assert table in ("items", "requests")

    def query(conn: apsw.Connection) -> bytes | None:
        for (body,) in conn.execute(f"SELECT body FROM {table} WHERE id = ?", (entity_id,)):
            return unpack(bytes(body))
        return None

    return query


def decode_list(bodies: list[bytes]) -> list[Any]:
    return _loads(bodies)


def thread_query(thread_id: str):  # type: ignore[no-untyped-def]
    def query(conn: apsw.Connection) -> list[bytes]:
        return _bodies(conn, "SELECT body FROM threads WHERE id = ?", (thread_id,))

    return query


def thread_context_query(thread_id: str):  # type: ignore[no-untyped-def]
    """The thread, its project, and the native session id to resume (if any)."""

    def query(conn: apsw.Connection) -> tuple[bytes, bytes, str | None] | None:
        for thread_body, project_body in conn.execute(
            "SELECT t.body, p.body FROM threads t JOIN projects p ON p.id = t.project_id WHERE t.id = ?",
            (thread_id,),
        ):
            resume = None
            for (value,) in conn.execute(
                "SELECT json_extract(body, '$.native_session_id') FROM sessions "
                "WHERE thread_id = ? AND json_extract(body, '$.native_session_id') IS NOT NULL "
                "ORDER BY rowid DESC LIMIT 1",
                (thread_id,),
            ):
                resume = value
            return thread_body, project_body, resume
        return None

    return query


def decode_thread_context(raw: tuple[bytes, bytes, str | None] | None) -> tuple[Any, Any, str | None] | None:
    if raw is None:
        return None
    return orjson.loads(raw[0]), orjson.loads(raw[1]), raw[2]


# --- restart: agents that outlived the last daemon -------------------------------------


def reattachable_sessions_query(conn: apsw.Connection) -> list[tuple[str, str]]:
    """(session id, thread id) of every session not recorded exited whose thread still
    exists and is not archived: the only agents a restarted daemon takes over."""
    return [
        (session_id, thread_id)
        for session_id, thread_id in conn.execute(
            "SELECT s.id, s.thread_id FROM sessions s JOIN threads t ON t.id = s.thread_id "
            "WHERE s.status != 'exited' AND json_extract(t.body, '$.archived_at') IS NULL"
        )
    ]


def decode_pairs(rows: list[tuple[str, str]]) -> dict[str, str]:
    return dict(rows)


@attrs.frozen
class ReattachRaw:
    context: tuple[bytes, bytes, str | None] | None
    turn: bytes | None
    user: bytes | None
    requests: list[bytes]
    items: list[bytes]
    tasks: list[bytes] = attrs.Factory(list)


def reattach_context_query(thread_id: str):  # type: ignore[no-untyped-def]
    """A thread's context (as `thread_context_query`) and its active turn, if any, with
    that turn's prompt, requests (any status) and items."""
    context_query = thread_context_query(thread_id)

    def query(conn: apsw.Connection) -> ReattachRaw:
        context = context_query(conn)
        tasks = running_task_bodies(conn, context[0]) if context is not None else []
        turns = _bodies(
            conn,
            "SELECT body FROM turns WHERE thread_id = ? AND status IN ('starting', 'running', 'waiting') "
            "ORDER BY ordinal LIMIT 1",
            (thread_id,),
        )
        if not turns:
            return ReattachRaw(context, None, None, [], [], tasks)
        turn_id = orjson.loads(turns[0])["id"]
        user = _bodies(conn, "SELECT body FROM items WHERE id = ?", (f"{turn_id}:user",))
        requests: list[bytes] = []
        for of_turn in (turn_id, *subagent_turn_ids(conn, thread_id, turn_id)):
            requests += _bodies(conn, "SELECT body FROM requests WHERE turn_id = ?", (of_turn,))
        return ReattachRaw(
            context,
            turns[0],
            user[0] if user else None,
            requests,
            _bodies(conn, "SELECT body FROM items WHERE turn_id = ? ORDER BY ordinal", (turn_id,)),
            tasks,
        )

    return query


@attrs.frozen
class ReattachContext:
    thread: Any
    project: Any
    resume: str | None
    turn: Turn | None
    user_text: str
    requests: tuple[RuntimeRequest, ...]
    items: tuple[TurnItem, ...]
    # The thread's background tasks still running (their items), whatever turn they are in.
    tasks: tuple[TurnItem, ...] = ()


def decode_reattach_context(raw: ReattachRaw) -> ReattachContext | None:
    context = decode_thread_context(raw.context)
    if context is None:
        return None
    user = orjson.loads(raw.user) if raw.user is not None else {}
    return ReattachContext(
        thread=context[0],
        project=context[1],
        resume=context[2],
        turn=None if raw.turn is None else converter.structure(orjson.loads(raw.turn), Turn),
        user_text=user.get("text") or "",
        requests=tuple(converter.structure(orjson.loads(b), RuntimeRequest) for b in raw.requests),
        items=tuple(converter.structure(orjson.loads(b), TurnItem) for b in raw.items),
        tasks=tuple(converter.structure(orjson.loads(b), TurnItem) for b in raw.tasks),
    )
