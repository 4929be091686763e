"""The in-memory shell (t3d/live/shell_rows.py): served without a database read, and always
byte for byte what a fresh read of the same state gives.

On real parts: a real SQLite file, the real writer and readers, the hub and the API app
served in-process (tests/live_support.py) or the whole daemon (tests/harness.py).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import apsw
import orjson
import trio
from harness import http, new_thread, open_client, run_turn, start_daemon, wait_until
from live_support import Served, merge_chunks, notes_until, seed_thread, serve_app, ws_client

from t3d.domain import commands as c
from t3d.domain.model import TurnItem
from t3d.live import base as b
from t3d.live.chunks import Parts, chunk_objects, object_bytes
from t3d.live.reads import ROWS_PER_PIECE, BaseReader
from t3d.live.shell_rows import ShellCopy, ShellRows, seed_of, shell_chunks
from t3d.store import queries as q
from t3d.store.commit import Committed, ShellRow, StoredEvent
from t3d.store.read_classes import ReadClass

ONE_TURN = Path(__file__).resolve().parent.parent / "replay_fixtures" / "claude" / "claude-2.1.197_oneshot_default_noprompttool.stdout.jsonl"


class Workspaces:
    """Workspace values set by the test: thread id -> (path, value); the shape of
    t3d/git/workspaces.py's view, which the hub asks for the value of each row."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[str, bytes]] = {}

    def row(self, thread_id: str) -> bytes | None:
        found = self.values.get(thread_id)
        return found[1] if found else None

    def rows(self) -> Mapping[str, bytes]:
        return {t: v for t, (_, v) in self.values.items()}

    def of_thread(self, thread_id: str) -> tuple[str, bytes] | None:
        return self.values.get(thread_id)

    def every(self) -> Mapping[str, bytes]:
        return dict(self.values.values())

    def watchers_changed(self) -> None:
        return None


def set_workspace(served: Served, view: Workspaces, thread_id: str, value: bytes) -> None:
    view.values[thread_id] = (f"/w/{thread_id}", value)
    served.hub.publish_workspace(f"/w/{thread_id}", [thread_id], value)


async def fresh(served: Served, view: Workspaces | None = None) -> bytes:
    """The shell as a database read gives it (the path every request took before the cache)."""
    reader = BaseReader(served.store, workspaces=(view.rows if view is not None else dict))
    return b"".join(await reader.shell_pieces())


async def cached(served: Served) -> bytes:
    return b"".join(await served.app.bases.shell_pieces())


async def test_the_cached_shell_is_byte_for_byte_a_fresh_read_after_a_mixed_workload(tmp_path: Path) -> None:
    """Creates, turns, deletes, archive and unarchive, new projects and workspace values
    changed, added and dropped, before and after the cache was seeded: GET /api/shell's
    bytes, and the subscribe.shell snapshot's chunks, equal a fresh read's; and once seeded
    the shell is served without a read (no seed more)."""
    with trio.fail_after(60):
        async with serve_app(tmp_path) as served:
            view = Workspaces()
            served.hub.workspaces = view
            store = served.store
            for n in range(4):
                await seed_thread(store, tmp_path, f"t{n}", turns=n, items=2, output_bytes=10)
            set_workspace(served, view, "t1", b'{"path":"/w/t1","state":"clean"}')
            set_workspace(served, view, "t3", b'{"path":"/w/t3","state":"clean"}')
            assert await cached(served) == await fresh(served, view)
            assert served.hub.shell_rows.seeds == 1

            await store.execute(c.CreateProject("p2", str(tmp_path / "second"), title="second"))
            await store.execute(c.CreateThread("t9", "p2", "replay", title="new one"))
            await seed_thread(store, tmp_path, "t9", turns=1, items=3, output_bytes=5)
            await store.execute(c.DeleteThread("t2"))
            await store.execute(c.ArchiveThread("t3"))
            await store.execute(c.ArchiveThread("t0"))
            await store.execute(c.UnarchiveThread("t0"))
            await store.execute(c.RenameThread("t1", 'a "quoted" title'))
            set_workspace(served, view, "t1", b'{"path":"/w/t1","state":"dirty"}')
            set_workspace(served, view, "t9", b'{"path":"/w/t9","state":"clean"}')
            view.values.pop("t3")  # dropped silently: the thread's next commit remakes its row
            await store.execute(c.RenameThread("t3", "archived, renamed"))
            await store.execute(c.CreateThread("t10", "p", "replay"))
            await store.execute(c.DeleteThread("t10"))

            body = await cached(served)
            assert body == await fresh(served, view)
            shell = orjson.loads(body)
            assert [t["id"] for t in shell["threads"]] == ["t0", "t1", "t3", "t9"]
            assert shell["threads"][1]["workspace"] == {"path": "/w/t1", "state": "dirty"}
            assert served.hub.shell_rows.seeds == 1
            set_workspace(served, view, "t0", b'{"path":"/w/t0","state":"ahead"}')
            assert await cached(served) == await fresh(served, view)
            # The statuses remap a project's threads without publishing (a new directory's
            # first value): a project update rechecks every row.
            view.values["t9"] = ("/w/t9", b'{"path":"/w/t9","state":"unknown"}')
            await store.execute(c.CreateProject("p3", str(tmp_path / "third")))
            assert await cached(served) == await fresh(served, view)

            status, over_http = await http(served, "GET", "/api/shell")  # type: ignore[arg-type]
            assert status == 200 and over_http == orjson.loads(await fresh(served, view))

            ours = await served.app.bases.join_snapshot((None, 0)).result()
            theirs = await served.store.read(q.shell_query, lambda raw: b.decode_shell_snapshot(raw, view.rows()), ReadClass.SMALL)
            assert ours == theirs and ours is not None and len(ours.chunks) == 1


async def test_a_large_shell_built_piece_by_piece_equals_a_fresh_read(tmp_path: Path) -> None:
    """A shell of more rows than one piece joins (ROWS_PER_PIECE) is built in pieces and its
    rows' pieces reused while no row changes: after commits that move only the sequence (an
    item update), a rename and a delete, every response equals a fresh read, and the
    snapshot's chunks equal a read's."""
    with trio.fail_after(120):
        async with serve_app(tmp_path) as served:
            store = served.store
            await seed_thread(store, tmp_path, "t0", turns=1, items=1, output_bytes=1)
            for n in range(1, ROWS_PER_PIECE + 40):
                await store.execute(c.CreateThread(f"t{n}", "p", "replay", title="x" * (n % 200)))
            await store.execute(c.StartTurn("t0", "live", "go"))
            first = await served.app.bases.shell_pieces()
            assert len(first) > 1 and b"".join(first) == await fresh(served)
            item = TurnItem("late", "t0", "live", 0, "command", "completed", "ls", None, {"command": "ls"}, 0.0)
            await store.execute(c.RecordItems("live", (item,)))
            again = await served.app.bases.shell_pieces()
            assert again[1:] == first[1:] and again[0] != first[0]  # the same rows, a new sequence
            await store.execute(c.FinishTurn("live", "completed"))  # the counts catch up
            await store.execute(c.RenameThread(f"t{ROWS_PER_PIECE}", "renamed"))
            await store.execute(c.DeleteThread("t3"))
            assert b"".join(await served.app.bases.shell_pieces()) == await fresh(served)
            ours = await served.app.bases.join_snapshot((None, 0)).result()
            theirs = await store.read(q.shell_query, b.decode_shell_snapshot, ReadClass.SMALL)
            assert ours == theirs


async def test_a_shell_subscriber_resuming_from_its_snapshot_misses_nothing(tmp_path: Path) -> None:
    """A subscriber takes the shell snapshot (from the cache), leaves, and resumes from its
    sequence after threads were created, changed and deleted: its snapshot plus the replay
    equal a fresh read."""
    with trio.fail_after(60):
        async with serve_app(tmp_path) as served:
            for n in range(3):
                await seed_thread(served.store, tmp_path, f"t{n}", turns=1, items=1, output_bytes=1)
            async with ws_client(served) as first:
                sub = await first.call("subscribe.shell")
                state = merge_chunks(await notes_until(first, sub["sub"], "snapshot.end"))
            assert state["sequence"] == sub["sequence"] == orjson.loads(await fresh(served))["sequence"]
            await served.store.execute(c.DeleteThread("t0"))
            await seed_thread(served.store, tmp_path, "t1", turns=1, items=2, output_bytes=1)
            await served.store.execute(c.CreateThread("t5", "p", "replay"))
            await served.store.execute(c.CreateProject("p2", str(tmp_path / "other")))
            async with ws_client(served) as back:
                again = await back.call("subscribe.shell", after_sequence=sub["sequence"])
                assert again["base"] == "replay"
                notes = await notes_until(back, again["sub"], "synced")
            threads = {t["id"]: t for t in state["threads"]}
            projects = {p["id"]: p for p in state["projects"]}
            for note in notes[:-1]:
                event = note["data"]
                if event["kind"] == "shell.removed":
                    threads.pop(event["entity"]["id"])
                elif event["kind"] == "shell.updated":
                    threads[event["entity"]["id"]] = event["entity"]
                elif event["kind"] == "project.updated":
                    projects[event["entity"]["id"]] = event["entity"]
            now = orjson.loads(await fresh(served))
            assert list(threads.values()) == now["threads"] and list(projects.values()) == now["projects"]


async def test_commits_while_the_seed_read_waits_are_merged(tmp_path: Path) -> None:
    """The first shell request seeds the cache with a read; a thread deleted and one created
    while that read waits for a reader are neither resurrected nor lost."""
    with trio.fail_after(60):
        async with serve_app(tmp_path) as served:
            for n in range(3):
                await seed_thread(served.store, tmp_path, f"t{n}", turns=1, items=1, output_bytes=1)
            release = threading.Event()
            busy: list[int] = []

            def hold(conn: apsw.Connection) -> None:
                busy.append(1)
                release.wait(30)

            async with trio.open_nursery() as nursery:
                for _ in range(8):  # more than the reader pool: every reader is held
                    nursery.start_soon(served.store.read, hold, lambda raw: raw, ReadClass.SMALL)
                await wait_until(lambda: len(busy) >= 4)
                result: list[bytes] = []

                async def first_request() -> None:
                    result.append(await cached(served))

                nursery.start_soon(first_request)
                await wait_until(lambda: served.hub.shell_rows.seeding)
                await served.store.execute(c.DeleteThread("t1"))
                await served.store.execute(c.CreateThread("t7", "p", "replay"))
                await served.store.execute(c.RenameThread("t2", "renamed"))
                release.set()
            assert result == [await fresh(served)]
            assert [t["id"] for t in orjson.loads(result[0])["threads"]] == ["t0", "t2", "t7"]


def _row(thread_id: str, sequence: int, payload: bytes | None) -> Committed:
    event = StoredEvent(sequence, "thread.updated", thread_id, None, b"{}", 0.0)  # type: ignore[arg-type]
    return Committed({}, (event,), (ShellRow(thread_id, sequence, payload),))


def test_commits_after_the_seed_read_s_sequence_win_over_what_it_found() -> None:
    """A seed read that began before commits it does not see (their sequences are above its
    own): a thread deleted after it stays deleted, one created after it is appended, one
    changed after it has the newer row; rows it saw that commits before it also touched
    keep what it read."""
    rows = ShellRows()
    rows.begin_seed()
    rows.apply(_row("a", 5, b'{"id":"a","v":0}'))  # before the read: the read has it too
    rows.apply(_row("b", 11, None))  # deleted after the read began
    rows.apply(_row("n", 12, b'{"id":"n"}'))  # created after it
    rows.apply(_row("c", 13, b'{"id":"c","v":2}'))  # changed after it
    rows.seed(seed_of(10, [("p", b'{"id":"p"}')], [("a", b'{"id":"a","v":1}'), ("b", b'{"id":"b"}'), ("c", b'{"id":"c","v":1}')], {}))
    shell = rows.copy()
    assert shell.threads == (b'{"id":"a","v":1}', b'{"id":"c","v":2}', b'{"id":"n"}')
    assert shell.sequence == 13 and shell.projects == (b'{"id":"p"}',)


def test_a_row_is_remade_only_when_its_workspace_value_changes() -> None:
    """Serving twice with nothing changed reuses each row's bytes (the same objects); a new
    workspace value remakes that row only, and dropping it restores the plain row."""
    values: dict[str, bytes] = {"a": b'"x"'}
    rows = ShellRows(values.get)
    rows.begin_seed()
    rows.seed(seed_of(1, [], [("a", b'{"id":"a"}'), ("b", b'{"id":"b"}')], values))
    first = rows.copy()
    assert first.threads == (b'{"id":"a","workspace":"x"}', b'{"id":"b"}')
    second = rows.copy()
    assert all(x is y for x, y in zip(first.threads, second.threads, strict=True))
    values["b"] = b'"y"'
    rows.workspace_changed(["b"])
    third = rows.copy()
    assert third.threads[0] is first.threads[0] and third.threads[1] == b'{"id":"b","workspace":"y"}'
    del values["a"]
    rows.workspace_changed(["a"])
    assert rows.copy().threads == (b'{"id":"a"}', b'{"id":"b","workspace":"y"}')


def test_the_shell_s_chunks_are_cut_exactly_as_chunk_objects_cuts_them() -> None:
    """The subscribe.shell snapshot made from the in-memory rows has the chunks
    `chunk_objects` makes of the same rows as parts: for empty shells, projects only, rows
    of every size and budgets from tiny (one row a chunk) to large."""
    import random

    rng = random.Random(7)
    for case in range(60):
        projects = tuple(b'{"id":"p%d","x":"%s"}' % (n, b"y" * rng.randrange(40)) for n in range(rng.randrange(4)))
        threads = tuple(b'{"id":"t%d","x":"%s"}' % (n, b"z" * rng.randrange(300)) for n in range(rng.randrange(0, 80)))
        copy = ShellCopy(rng.randrange(10**6), projects, threads)
        parts = Parts((("sequence", b"%d" % copy.sequence),), b.SHELL_LISTS, (*((0, p) for p in projects), *((1, t) for t in threads)))
        for budget in (1, 64, 500, 4096, 1 << 20):
            assert list(shell_chunks(copy, budget)) == chunk_objects(parts, budget), (case, budget)


# --- the whole daemon -----------------------------------------------------------------------


def _read_shell(path: Path) -> bytes:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return object_bytes(b.shell_parts(q.shell_query(conn)))
    finally:
        conn.close()


async def _shell_matches_file(daemon: Any) -> bool:
    status, body = await http(daemon, "GET", "/api/shell")
    assert status == 200
    return bool(body == orjson.loads(await trio.to_thread.run_sync(_read_shell, daemon.settings.db_path)))


QUIET: dict[str, Any] = {"retention_interval": "1d", "workspace_status": "off"}


async def test_the_shell_after_turns_a_restart_and_a_prune_equals_a_fresh_read(tmp_path: Path) -> None:
    """On the real daemon: after real turns, a delete and an archive the served shell equals
    the database's; after a restart (recovery included) the new daemon's does too; and after
    ``db.prune`` (every age 0: item snapshots and state events pruned) it still does."""
    prune_all: dict[str, Any] = {**QUIET, "retention_item_snapshots_age": "0", "retention_state_events_age": "0"}
    state = tmp_path / "state"
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            daemon = await start_daemon(nursery, state, replay_fixture=str(ONE_TURN), **prune_all)
            async with open_client(daemon) as client:
                kept = await new_thread(client, tmp_path)
                gone = await new_thread(client, tmp_path)
                await http(daemon, "GET", "/api/shell")  # seeded now
                await run_turn(client, kept, "one")
                await run_turn(client, gone, "two")
                await client.call("thread.delete", thread_id=gone)
                archived = await new_thread(client, tmp_path)
                await client.call("thread.archive", thread_id=archived)
                await wait_until(lambda: _shell_matches_file(daemon))
                _, body = await http(daemon, "GET", "/api/shell")
                assert [t["id"] for t in body["threads"]] == [kept, archived]
                assert body["threads"][0]["turn_count"] == 1 and body["threads"][0]["item_count"] > 0
            daemon.stop()
        async with trio.open_nursery() as nursery:
            again = await start_daemon(nursery, state, replay_fixture=str(ONE_TURN), **prune_all)
            async with open_client(again) as client:
                await wait_until(lambda: _shell_matches_file(again))
                await client.call("subscribe.thread", thread_id=kept)
                await run_turn(client, kept, "three")
                job = await client.call("db.prune")
                while job["state"] == "running":
                    await trio.sleep(0.05)
                    job = await client.call("db.job", job_id=job["job_id"])
                assert job["state"] == "done", job
                assert job["result"]["rows"]["item snapshots"] > 0
                await wait_until(lambda: _shell_matches_file(again))
                _, body = await http(again, "GET", "/api/shell")
                assert body["threads"][0]["turn_count"] == 2
            again.stop()
