"""The schema's ``user_version`` ladder, from the oldest shipped schema to this one, on a
database with data; and a database from a newer t3d, refused by `t3d serve`."""

from __future__ import annotations

import sys
from pathlib import Path

import apsw
import orjson
import trio
from served import base_env

from t3d.domain import commands as c
from t3d.domain.codec import to_json
from t3d.domain.decide import decide
from t3d.domain.events import Event
from t3d.domain.model import TurnItem
from t3d.domain.state import State
from t3d.store.schema import MIGRATIONS
from t3d.store.store import open_store

NOW = 1_760_000_000.0
UPSERT_V1 = {
    "project.updated": ("projects", ("path",)),
    "thread.updated": ("threads", ("project_id",)),
    "turn.updated": ("turns", ("thread_id", "ordinal", "status")),
    "item.updated": ("items", ("thread_id", "turn_id", "ordinal")),
}


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


def write_version_1(path: Path) -> tuple[list[tuple[str, bytes]], State]:
    """A database as t3d's first schema held it: migration 1 only, its rows written with
    plain SQL the way commit.py wrote them then (events, "replace the row" projections,
    receipts without a fingerprint, outbox rows), one thread deleted along the way."""
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA journal_mode=WAL")
    with conn:
        conn.execute(MIGRATIONS[0])
        conn.execute("PRAGMA user_version=1")
    state = State()
    log: list[tuple[str, bytes]] = []
    commands = [
        c.CreateProject("p", "/w/p"),
        c.CreateThread("t1", "p", "replay", title="kept"),
        c.CreateThread("t2", "p", "replay", title="deleted"),
        c.CreateThread("t3", "p", "replay", title="a child", parent_thread_id="t1"),
        c.StartTurn("t1", "u1", "hello"),
        c.MarkTurnRunning("u1"),
        *[c.RecordItems("u1", (TurnItem("u1:a", "", "", 0, "assistant_message", "streaming", None, "hi" * n, None, NOW),)) for n in range(1, 4)],
        c.FinishTurn("u1", "completed"),
        c.StartTurn("t2", "u2", "bye"),
        c.DeleteThread("t2"),
    ]
    with conn:
        for n, command in enumerate(commands):
            decision = decide(state, command, NOW + n)
            for event in decision.events:
                payload = orjson.dumps(to_json(event.entity))
                conn.execute(
                    "INSERT INTO events(kind, thread_id, entity_id, payload, created_at) VALUES (?,?,?,?,?)",
                    (event.kind, event.thread_id, event.entity.id, payload, NOW + n),
                )
                _project_v1(conn, event, payload)
                state.apply(event)
                log.append((event.kind, payload))
            for effect in decision.effects:
                conn.execute(
                    "INSERT INTO outbox(thread_id, kind, payload, created_at, done_at) VALUES (?,?,?,?,?)",
                    (effect.thread_id, type(effect).__name__, b"{}", NOW + n, NOW + n),
                )
            conn.execute(
                "INSERT INTO receipts(command_id, ok, result, created_at) VALUES (?,?,?,?)",
                (f"cmd-{n}", 1, orjson.dumps({**decision.result, "sequence": None}), NOW + n),
            )
    conn.close()
    return log, state


def _project_v1(conn: apsw.Connection, event: Event, payload: bytes) -> None:
    if event.kind == "thread.deleted":
        for table in ("items", "requests", "sessions", "turns"):
            conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (event.entity.id,))
        conn.execute("DELETE FROM thread_counts WHERE thread_id = ?", (event.entity.id,))
        conn.execute("DELETE FROM threads WHERE id = ?", (event.entity.id,))
        return
    table, columns = UPSERT_V1[event.kind]
    names = ("id", *columns, "body")
    values = (event.entity.id, *(getattr(event.entity, col) for col in columns), payload)
    conn.execute(
        f"INSERT INTO {table}({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
        f"ON CONFLICT(id) DO UPDATE SET body = excluded.body",
        values,
    )


async def test_a_version_1_database_with_data_climbs_the_whole_ladder(tmp_path: Path) -> None:
    """Opened by this t3d, a schema-1 database with data reaches the newest version: every
    event and projection row survives byte for byte, receipts gain their fingerprint column
    (NULL: such a receipt replays as before), the retention tables and index exist, the
    deleted thread waits in the purge queue, a thread's parent is copied into the indexed
    parent_thread_id column, and the small file was converted to incremental auto-vacuum at
    start-up."""
    path = tmp_path / "t3d.sqlite"
    log, state = await trio.to_thread.run_sync(write_version_1, path)
    async with open_store(path, on_writer_lost=_lost) as store:
        replayed = await store.execute(c.RenameThread("t1", "ignored"), command_id="cmd-1")
        assert replayed.replayed and replayed.result["thread_id"] == "t1"

        def read(conn: apsw.Connection) -> dict[str, object]:
            return {
                "version": conn.execute("PRAGMA user_version").get,
                "auto_vacuum": conn.execute("PRAGMA auto_vacuum").get,
                "events": [(k, bytes(p)) for k, p in conn.execute("SELECT kind, payload FROM events ORDER BY sequence")],
                "threads": [orjson.loads(b) for (b,) in conn.execute("SELECT body FROM threads")],
                "items": [orjson.loads(b) for (b,) in conn.execute("SELECT body FROM items")],
                "fingerprints": [f for (f,) in conn.execute("SELECT fingerprint FROM receipts")],
                "indexes": {n for (n,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'index'")},
                "tables": {n for (n,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")},
                "purge": list(conn.execute("SELECT thread_id FROM purge_threads")),
                "parents": list(conn.execute("SELECT id, parent_thread_id FROM threads ORDER BY id")),
            }

        found = await store.read(read, lambda raw: raw)
    assert found["version"] == len(MIGRATIONS) == 7
    assert found["auto_vacuum"] == 2
    recovered = [e for e in found["events"] if e not in log]  # type: ignore[operator]
    assert found["events"][: len(log)] == log and not [e for e in recovered if e[0] != "session.updated"]
    assert found["threads"] == [to_json(state.threads["t1"]), to_json(state.threads["t3"])]
    assert found["parents"] == [("t1", None), ("t3", "t1")]
    assert found["items"] == [to_json(i) for i in state.items.values()]
    assert set(found["fingerprints"]) == {None}  # type: ignore[arg-type]
    assert {"events_by_entity", "requests_pending_in_order", "checkpoints_by_thread", "threads_by_parent"} <= found["indexes"]  # type: ignore[operator]
    assert {"retention", "pruned_threads", "purge_threads", "checkpoints"} <= found["tables"]  # type: ignore[operator]
    assert found["purge"] == [("t2",)]


async def test_serve_refuses_a_database_from_a_newer_t3d(tmp_path: Path) -> None:
    """`t3d serve` on a database whose user_version is past this build's exits with status 1,
    says so and what to do, and changes neither its schema nor its version."""
    state = tmp_path / "state"
    state.mkdir()
    path = state / "t3d.sqlite"

    def newer() -> None:
        conn = apsw.Connection(str(path))
        conn.execute("CREATE TABLE from_the_future(x)")
        conn.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
        conn.close()

    def schema() -> tuple[object, list[tuple[object, ...]]]:
        conn = apsw.Connection(str(path))
        try:
            return conn.execute("PRAGMA user_version").get, list(conn.execute("SELECT * FROM sqlite_schema"))
        finally:
            conn.close()

    await trio.to_thread.run_sync(newer)
    before = await trio.to_thread.run_sync(schema)
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, "-m", "t3d", "serve", "--state-dir", str(state), "--port", "0"],
            capture_stderr=True,
            check=False,
            env=base_env(),
        )
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert f"schema is version {len(MIGRATIONS) + 1}, newer than this t3d supports ({len(MIGRATIONS)})" in stderr
    assert "upgrade t3d" in stderr
    assert await trio.to_thread.run_sync(schema) == before
