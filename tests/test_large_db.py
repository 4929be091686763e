"""Large databases: the generator's output is the daemon's own, and the hot paths read
only what they need.

Every query plan here is taken from the statements the code actually runs: each path
runs for real on a generated database with an execution tracer that records its SQL and
bindings, then ``EXPLAIN QUERY PLAN`` is asked for each recorded statement. A plan that
scans a table (or walks a whole index that is not partial) fails the test, except where
reading every row is the point of the read (the shell lists every thread and project).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import attrs
import pytest
import trio

from bench.gen_db import Generated, Shape, generate
from t3d.domain import commands as c
from t3d.domain.model import TurnItem
from t3d.live.reads import REPLAY_MAX_BYTES, REPLAY_MAX_EVENTS, SHELL_SCAN_MAX
from t3d.store import maintenance, retention, retention_plan
from t3d.store import queries as q
from t3d.store.commit import execute
from t3d.store.readers import open_reader_connection
from t3d.store.replay import shell_resume_query, thread_resume_query
from t3d.store.schema import MIGRATIONS, WRITER_PRAGMAS, migrate
from t3d.store.store import open_store

NOW = 1_900_000_000.0
SHAPE = Shape.for_events(30_000, threads=60, big_items=3_000)

# (path, table) pairs where reading every row is what the read is for.
WHOLE_TABLE_READS = {("shell", "threads"), ("shell", "projects"), ("projects", "projects")}
# Tables of a few rows whatever the database's size (one row per AUTOINCREMENT table).
TINY_TABLES = {"sqlite_sequence"}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    return generate(tmp_path_factory.mktemp("large") / "host.sqlite", SHAPE)


@pytest.fixture
def db(generated: Generated, tmp_path: Path) -> Path:
    """A private copy of the generated database (tests that write change only theirs)."""
    copy = tmp_path / "t3d.sqlite"
    shutil.copyfile(generated.path, copy)
    return copy


def _writer(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path))
    for pragma in WRITER_PRAGMAS:
        conn.execute(pragma)
    migrate(conn)
    return conn


# --- recording what runs, and its plan -----------------------------------------------------


@attrs.frozen
class Ran:
    sql: str
    bindings: Any


def recorded(conn: apsw.Connection, run: Callable[[apsw.Connection], object]) -> list[Ran]:
    """Every data statement ``run`` executes on ``conn`` (not BEGIN, PRAGMA, SAVEPOINT...)."""
    ran: list[Ran] = []

    def trace(cursor: Any, sql: str, bindings: Any) -> bool:
        if sql.lstrip().split(None, 1)[0].upper() in (
            "SELECT",
            "INSERT",
            "UPDATE",
            "DELETE",
            "WITH",
        ):
            ran.append(Ran(sql, bindings))
        return True

    previous = conn.exec_trace
    conn.exec_trace = trace
    try:
        run(conn)
    finally:
        conn.exec_trace = previous
    return ran


def full_reads(conn: apsw.Connection, path: str, ran: list[Ran]) -> list[str]:
    """Plan steps of ``ran`` that read a whole table, or a whole non-partial index."""
    tables = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    partial = {
        name
        for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        )
        if " WHERE " in sql.upper()
    }
    found = []
    for statement in ran:
        for *_, detail in conn.execute("EXPLAIN QUERY PLAN " + statement.sql, statement.bindings):
            words = detail.split()
            if (
                words[0] != "SCAN"
                or words[1] not in tables - TINY_TABLES
                or (path, words[1]) in WHOLE_TABLE_READS
            ):
                continue
            index = words[-1] if "INDEX" in words else None
            if index not in partial:
                found.append(f"{detail!r} in {' '.join(statement.sql.split())[:160]!r}")
    return found


def assert_reads_only_what_it_needs(
    conn: apsw.Connection, path: str, run: Callable[[apsw.Connection], object]
) -> int:
    ran = recorded(conn, run)
    assert ran, f"{path}: no statement was recorded"
    found = full_reads(conn, path, ran)
    assert not found, f"{path} reads whole tables:\n" + "\n".join(found)
    return len(ran)


def _executing(command: c.Command, command_id: str) -> Callable[[apsw.Connection], object]:
    def run(conn: apsw.Connection) -> object:
        return execute(conn, command, command_id, NOW)

    return run


def _in_transaction(
    query: Callable[[apsw.Connection], object],
) -> Callable[[apsw.Connection], object]:
    def run(conn: apsw.Connection) -> object:
        with conn:
            result = query(conn)
        return result

    return run


# --- the generator ---------------------------------------------------------------------------


def test_the_generated_database_is_shaped_as_asked_and_consistent(generated: Generated) -> None:
    """Events as asked (within a turn), the big thread holds its items, counts match the rows,
    every projection row is the payload of its entity's last event, and the schema is current."""
    conn = apsw.Connection(str(generated.path), flags=apsw.SQLITE_OPEN_READONLY)
    assert SHAPE.events * 0.99 <= generated.events <= SHAPE.events * 1.01
    assert conn.execute("SELECT count(*) FROM events").get == generated.events
    assert (
        conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").get
        == generated.events
    )
    assert conn.execute("PRAGMA user_version").get == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").get == "wal"
    assert conn.execute("SELECT count(*) FROM threads").get == SHAPE.threads
    big = conn.execute(
        "SELECT items FROM thread_counts WHERE thread_id = ?", (generated.big_thread_id,)
    ).get
    assert SHAPE.big_items <= big <= SHAPE.big_items + 1  # a turn holds at least one item
    mismatched = conn.execute(
        "SELECT count(*) FROM thread_counts n WHERE n.items != (SELECT count(*) FROM items i WHERE i.thread_id = n.thread_id)"
        " OR n.turns != (SELECT count(*) FROM turns t WHERE t.thread_id = n.thread_id)"
    ).get
    assert mismatched == 0
    last = dict(conn.execute("SELECT entity_id, payload FROM events ORDER BY sequence"))
    for table in ("projects", "threads", "turns", "items", "requests", "sessions"):
        stale = [
            i for i, body in conn.execute(f"SELECT id, body FROM {table}") if last.get(i) != body
        ]
        assert not stale, f"{len(stale)} {table} rows differ from their last event, e.g. {stale[0]}"
    assert (
        conn.execute("SELECT count(*) FROM turns WHERE status IN ('running', 'waiting')").get >= 1
    )
    parent = conn.execute(
        "SELECT json_extract(body, '$.parent_thread_id') FROM threads WHERE id = ?",
        (generated.child_thread_id,),
    ).get
    assert parent is not None
    conn.close()


def test_the_generator_refuses_to_overwrite_and_too_small_a_shape(tmp_path: Path) -> None:
    existing = tmp_path / "there.sqlite"
    existing.write_bytes(b"")
    with pytest.raises(FileExistsError, match="remove it or choose another --out"):
        generate(existing, SHAPE)
    with pytest.raises(ValueError, match="too few"):
        Shape.for_events(10)
    with pytest.raises(ValueError, match="--threads 20 is too few: the shape needs 21"):
        Shape.for_events(20_000, threads=20)


async def test_the_daemon_opens_the_generated_database_as_its_own(
    db: Path, generated: Generated
) -> None:
    """open_store migrates nothing, recovers the turns a crash left open, and serves the
    shell and the big thread's bounded snapshot from it."""

    def lost(error: BaseException | None) -> None:
        raise AssertionError(f"writer lost: {error!r}")

    with trio.fail_after(60):
        async with open_store(db, on_writer_lost=lost, clock=lambda: NOW) as store:
            shell = await store.shell()
            assert len(shell["threads"]) == SHAPE.threads
            assert all(
                t["status"] == "idle" for t in shell["threads"]
            )  # recovery closed the open turns
            assert await store.pending_requests() == []
            snapshot = await store.snapshot(generated.big_thread_id)
            assert snapshot is not None and snapshot["has_more"]
            assert len(snapshot["turns"]) == q.DEFAULT_TURN_LIMIT
            assert (
                (q.DEFAULT_TURN_LIMIT - 1) * 201
                < len(snapshot["items"])
                <= q.DEFAULT_TURN_LIMIT * 201
            )


# --- plans ----------------------------------------------------------------------------------


@pytest.fixture
def reader(db: Path) -> Iterator[apsw.Connection]:
    conn = open_reader_connection(str(db))
    yield conn
    conn.close()


def _open_turn(conn: apsw.Connection, status: str) -> tuple[str, str]:
    """(turn id, thread id) of a turn the generator left ``status``."""
    row = conn.execute(
        "SELECT id, thread_id FROM turns WHERE status = ? LIMIT 1", (status,)
    ).fetchone()
    assert row is not None, f"the generated database has no {status} turn"
    return row[0], row[1]


def test_reads_use_indexes(reader: apsw.Connection, generated: Generated) -> None:
    """The shell, a thread's bounded snapshot and a history page, both resumes, pending
    requests, a thread's row and context, and an item's body: no whole-table reads."""
    big = generated.big_thread_id
    sequence = q.current_sequence(reader)
    oldest = reader.execute("SELECT max(ordinal) - 20 FROM turns WHERE thread_id = ?", (big,)).get
    item = reader.execute("SELECT id FROM items WHERE thread_id = ? LIMIT 1", (big,)).get
    paths: dict[str, Callable[[apsw.Connection], object]] = {
        "shell": q.shell_query,
        "snapshot": q.snapshot_query(big, q.DEFAULT_TURN_LIMIT, None),
        "history page": q.snapshot_query(big, q.DEFAULT_TURN_LIMIT, oldest),
        "thread resume": thread_resume_query(
            big, sequence - 40, 10, REPLAY_MAX_EVENTS, REPLAY_MAX_BYTES
        ),
        "thread resume, gap too large": thread_resume_query(
            big, 1, 10, REPLAY_MAX_EVENTS, REPLAY_MAX_BYTES
        ),
        "shell resume": shell_resume_query(
            sequence - 200, REPLAY_MAX_EVENTS, REPLAY_MAX_BYTES, SHELL_SCAN_MAX
        ),
        "pending requests": q.pending_requests_query(None),
        "pending requests of a thread": q.pending_requests_query(big),
        "projects": q.projects_query,
        "thread": q.thread_query(big),
        "thread context": q.thread_context_query(generated.child_thread_id),
        "item detail": q.body_query("items", item),
    }
    for path, query in paths.items():
        assert_reads_only_what_it_needs(reader, path, _in_transaction(query))


def test_ordinal_lookups_and_finalizing_a_subagent_use_indexes(
    db: Path, generated: Generated
) -> None:
    """The writer's statements for a turn start on the big thread (its turn ordinal), items
    recorded into an open turn (their item ordinals), a request answered, and a subagent
    thread's turn run to its end (finalizing it): no whole-table reads."""
    conn = _writer(db)
    running, _ = _open_turn(conn, "running")
    waiting, _ = _open_turn(conn, "waiting")
    request = conn.execute(
        "SELECT id FROM requests WHERE turn_id = ? AND status = 'pending'", (waiting,)
    ).get
    child = conn.execute(
        "SELECT id FROM threads WHERE json_extract(body, '$.parent_thread_id') IS NOT NULL "
        "AND json_extract(body, '$.status') = 'idle' LIMIT 1"
    ).get

    def item(turn_id: str, thread_id: str, n: int) -> TurnItem:
        return TurnItem(
            f"{turn_id}:new{n}",
            thread_id,
            turn_id,
            0,
            "assistant_message",
            "streaming",
            None,
            "hi",
            None,
            NOW,
        )

    steps: list[tuple[str, c.Command]] = [
        ("turn start (turn ordinal)", c.StartTurn(generated.big_thread_id, "big-turn", "go on")),
        (
            "items recorded (item ordinals)",
            c.RecordItems(running, (item(running, "", 1), item(running, "", 2))),
        ),
        ("request answered", c.RespondToRequest(request, "allow")),
        ("subagent turn start", c.StartTurn(child, "child-turn", "look into it")),
        ("subagent turn running", c.MarkTurnRunning("child-turn")),
        ("subagent items", c.RecordItems("child-turn", (item("child-turn", child, 1),))),
        (
            "finalizing the subagent",
            c.FinishTurn("child-turn", "completed", usage={"output_tokens": 3}),
        ),
    ]
    for path, command in steps:
        assert_reads_only_what_it_needs(conn, path, _executing(command, f"id-{path}"))
    conn.close()


def test_a_claude_subagent_thread_opened_run_and_finalized_uses_indexes(
    db: Path, generated: Generated
) -> None:
    """A subagent the agent of a running turn starts (OpenSubagent: a child thread and its
    turn), its items, its prompt answered, its end (finalizing it reads only the child's
    records), the parent's end (which looks its children up by the parent index), and the
    parent's snapshot with its children: no whole-table reads."""
    conn = _writer(db)
    running, _ = _open_turn(conn, "running")

    def item(turn_id: str, n: int, kind: Any = "tool_call") -> TurnItem:
        return TurnItem(f"{turn_id}:k{n}", "", turn_id, 0, kind, "running", "Read", None, None, NOW)

    steps: list[tuple[str, c.Command]] = [
        ("subagent opened", c.OpenSubagent(running, "toolu_x", "sub-x", "sub-x:1", "general-purpose", "Read it", "read notes.txt")),
        ("subagent items", c.RecordItems("sub-x:1", (item("sub-x:1", 1), item("sub-x:1", 2)))),
        ("subagent prompt", c.OpenRequest("sub-x:1", "sub-x:req", "permission", item("sub-x:1", 3, "approval_request"))),
        ("subagent prompt answered", c.RespondToRequest("sub-x:req", "allow")),
        ("finalizing the subagent", c.FinishTurn("sub-x:1", "completed")),
        ("an open subagent", c.OpenSubagent(running, "toolu_y", "sub-y", "sub-y:1", "general-purpose", "Look", "look")),
        ("the parent's end closes it", c.FinishTurn(running, "interrupted", "stopped", "interrupt")),
    ]
    for path, command in steps:
        assert_reads_only_what_it_needs(conn, path, _executing(command, f"id-{path}"))
    assert conn.execute("SELECT status FROM turns WHERE id = 'sub-y:1'").get == "interrupted"
    parent = conn.execute("SELECT thread_id FROM turns WHERE id = ?", (running,)).get
    conn.close()
    reader = open_reader_connection(str(db))
    query = q.snapshot_query(parent, q.DEFAULT_TURN_LIMIT, None, children=True)
    assert_reads_only_what_it_needs(reader, "snapshot with children", _in_transaction(query))
    assert len(query(reader).children or []) == 2
    reader.close()


async def test_start_up_uses_indexes(db: Path) -> None:
    """Everything open_store runs before it serves (migrations, superseding the outbox,
    restart recovery), recorded on its own connections: no whole-table reads."""
    ran: list[Ran] = []

    def hook(conn: apsw.Connection) -> None:
        previous = conn.exec_trace

        def trace(cursor: Any, sql: str, bindings: Any) -> bool:
            if sql.lstrip().split(None, 1)[0].upper() in (
                "SELECT",
                "INSERT",
                "UPDATE",
                "DELETE",
                "WITH",
            ):
                ran.append(Ran(sql, bindings))
            return previous(cursor, sql, bindings) if previous is not None else True

        conn.exec_trace = trace

    def lost(error: BaseException | None) -> None:
        raise AssertionError(f"writer lost: {error!r}")

    apsw.connection_hooks.append(hook)
    try:
        with trio.fail_after(60):
            async with open_store(db, on_writer_lost=lost, clock=lambda: NOW):
                pass
    finally:
        apsw.connection_hooks.remove(hook)
    assert len(ran) > 3
    conn = await trio.to_thread.run_sync(open_reader_connection, str(db))
    try:
        found = await trio.to_thread.run_sync(full_reads, conn, "start-up", ran)
    finally:
        conn.close()
    assert not found, "start-up reads whole tables:\n" + "\n".join(found)


def test_the_plan_check_catches_a_missing_index(db: Path, generated: Generated) -> None:
    """Without the index on a turn's items, the bounded snapshot is reported as a scan."""
    conn = _writer(db)
    conn.execute("DROP INDEX items_by_turn")
    ran = recorded(conn, _in_transaction(q.snapshot_query(generated.big_thread_id, 10, None)))
    assert any("SCAN items" in step for step in full_reads(conn, "snapshot", ran))
    conn.close()


def _kind_walks(conn: apsw.Connection, ran: list[Ran]) -> list[str]:
    """Plan steps that search events_by_entity by kind alone: every event of a kind."""
    found = []
    for statement in ran:
        for *_, detail in conn.execute("EXPLAIN QUERY PLAN " + statement.sql, statement.bindings):
            if "events_by_entity" in detail and "entity_id=" not in detail and detail.startswith("SEARCH"):
                found.append(f"{detail!r} in {' '.join(statement.sql.split())[:160]!r}")
    return found


def test_retention_steps_use_indexes(db: Path, generated: Generated) -> None:
    """A retention pass's survey, its item and state windows (real and dry), a deleted
    thread's purge, the outbox step, and the shell resume: no whole-table reads, and none
    walks every event of a kind through events_by_entity (it is searched by kind and entity
    only); db.stats reads the events' index and the counts whole, which is its point."""
    conn = _writer(db)
    execute(conn, c.DeleteThread(generated.child_thread_id), "delete-child", NOW)
    policy = retention_plan.Policy()
    top = q.current_sequence(conn)
    steps = {
        "survey": lambda cx: retention.survey(cx, NOW, policy),
        "item window": lambda cx: retention.run_step(cx, retention_plan.Window("item", 1000, 3000)),
        "state window": lambda cx: retention.run_step(cx, retention_plan.Window("state", 1000, 3000)),
        "dry item window": lambda cx: retention.count_step(cx, retention_plan.Window("item", 3000, 5000)),
        "dry state window": lambda cx: retention.count_step(cx, retention_plan.Window("state", 3000, 5000)),
        "purge": lambda cx: retention.run_step(cx, retention_plan.Purge(generated.child_thread_id, top, 100)),
        "outbox": lambda cx: retention.run_step(cx, retention_plan.Outbox(NOW, 100)),
        "shell resume": _in_transaction(shell_resume_query(top - 200, REPLAY_MAX_EVENTS, REPLAY_MAX_BYTES, SHELL_SCAN_MAX)),
    }
    for path, run in steps.items():
        ran = recorded(conn, run)
        assert ran, f"{path}: no statement was recorded"
        # purge_threads is a queue: deleted threads whose events are still to go (LIMIT 64)
        scans = [f for f in full_reads(conn, path, ran) if "SCAN purge_threads" not in f]
        assert not scans, f"{path} reads whole tables: {scans}"
        assert not _kind_walks(conn, ran), f"{path} walks a whole kind: {_kind_walks(conn, ran)}"
    ran = recorded(conn, _in_transaction(maintenance.stats_query(db, NOW)))
    whole = {found.split()[1].strip("'") for found in full_reads(conn, "db stats", ran)}
    assert whole <= {"events", "thread_counts", "purge_threads", "threads"}, whole
    conn.close()
