"""The store's threads and transactions, on a real SQLite file."""

from __future__ import annotations

import threading
import tracemalloc
from pathlib import Path

import apsw
import attrs
import pytest
import trio
import trio.testing

from t3d.domain import commands as c
from t3d.domain.model import Checkpoint, Turn, TurnItem
from t3d.errors import DomainError, StoreError, WriterClosedError
from t3d.store.commit import Committed, Write, _apply
from t3d.store.readers import ReaderPool
from t3d.store.schema import MIGRATIONS, migrate
from t3d.store.store import Store, open_store
from t3d.store.tables import EntityCache, SqlView


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


async def test_commands_commit_off_the_loop_and_publish_in_sequence_order(tmp_path: Path) -> None:
    """Many concurrent commands: each commits on the writer thread, publications arrive in sequence order."""
    published: list[int] = []
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        store.on_commit(lambda done: published.extend(e.sequence for e in done.events))
        await store.execute(c.CreateProject("p", "/p"))
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(store.execute, c.CreateThread(f"t{i}", "p", "replay"))
        assert published == sorted(published) and len(published) == 51
        shell = await store.shell()
        assert len(shell["threads"]) == 50
        assert shell["sequence"] == published[-1]


async def test_a_rejected_command_changes_nothing_and_its_retry_fails_the_same_way(tmp_path: Path) -> None:
    """A DomainError rolls back the transaction; the rejected receipt replays the error."""
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        for _ in range(2):
            with pytest.raises(DomainError, match="does not exist"):
                await store.execute(c.CreateThread("t", "missing", "replay"), command_id="x")
        assert (await store.shell())["threads"] == []
        first = await store.execute(c.CreateProject("p", "/p"), command_id="y")
        again = await store.execute(c.CreateProject("p2", "/p2"), command_id="y")
        assert again.replayed and again.result == first.result
        assert len((await store.shell())["projects"]) == 1


async def test_jobs_sent_before_close_commit_and_later_ones_fail(tmp_path: Path) -> None:
    """Close lets queued statements finish and commit; afterwards: 'database writer is closed'."""
    release = threading.Event()
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        writer = store._writer  # type: ignore[attr-defined]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run, lambda conn: release.wait(10))  # holds the writer busy
            await trio.testing.wait_all_tasks_blocked()
            for i in range(20):
                nursery.start_soon(store.execute, c.CreateProject(f"p{i}", f"/p{i}"))
            await trio.testing.wait_all_tasks_blocked()
            assert writer.queued == 21
            nursery.start_soon(writer.close)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        with pytest.raises(WriterClosedError, match="database writer is closed"):
            await store.execute(c.CreateProject("late", "/late"))

    def count() -> int:
        return apsw.Connection(str(tmp_path / "db")).execute("SELECT count(*) FROM projects").get  # type: ignore[no-any-return]

    assert await trio.to_thread.run_sync(count) == 20


async def test_a_failing_job_fails_only_itself(tmp_path: Path) -> None:
    """An exception inside one writer job reaches its caller; the writer keeps serving."""
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        writer = store._writer  # type: ignore[attr-defined]

        def boom(conn: apsw.Connection) -> None:
            conn.execute("SELECT * FROM no_such_table")

        with pytest.raises(apsw.SQLError):
            await writer.run(boom)
        assert isinstance(await store.execute(c.CreateProject("p", "/p")), Committed)


async def test_the_writer_runs_on_its_own_thread(tmp_path: Path) -> None:
    """Writer jobs never run on the Trio thread."""
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        name = await store._writer.run(lambda conn: threading.current_thread().name)  # type: ignore[attr-defined]
        assert name == "t3d-writer"


async def test_a_reader_that_failed_to_open_comes_back(tmp_path: Path) -> None:
    """A reader whose database is missing fails that read; once the file exists the next read works."""
    path = tmp_path / "later.sqlite"
    pool = ReaderPool(str(path), 2)
    with pytest.raises(StoreError, match="could not open a database reader"):
        await pool.read(lambda conn: conn.execute("SELECT 1").get, lambda raw: raw)

    def create() -> None:
        conn = apsw.Connection(str(path))
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t(x)")
        conn.close()

    await trio.to_thread.run_sync(create)
    assert await pool.read(lambda conn: conn.execute("SELECT 7").get, lambda raw: raw) == 7
    pool.close()


def test_migrations_are_a_ladder_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """user_version counts applied migrations; a database from a newer t3d is not touched."""
    conn = apsw.Connection(str(tmp_path / "db"))
    assert migrate(conn) == len(MIGRATIONS)
    assert conn.execute("PRAGMA user_version").get == len(MIGRATIONS)
    assert migrate(conn) == len(MIGRATIONS)
    conn.execute(f"PRAGMA user_version={len(MIGRATIONS) + 5}")
    with pytest.raises(StoreError, match="newer than this t3d supports"):
        migrate(conn)


async def test_restart_recovery_closes_running_turns_and_expires_requests(tmp_path: Path) -> None:
    """After a restart: the running turn is interrupted (server_restart), its request expired, the queued turn starts."""
    db = tmp_path / "db"
    async with open_store(db, on_writer_lost=_lost) as store:
        await store.execute(c.CreateProject("p", "/p"))
        await store.execute(c.CreateThread("t", "p", "replay"))
        await store.execute(c.StartTurn("t", "u1", "one"))
        await store.execute(c.StartTurn("t", "u2", "two"))
        await store.execute(c.MarkTurnRunning("u1"))
        approval = (await store.snapshot("t"))["items"][0]
        from t3d.domain.codec import entity_from

        item = entity_from("item.updated", {**approval, "id": "u1:req", "kind": "approval_request", "status": "pending"})
        await store.execute(c.OpenRequest("u1", "r1", "permission", item))  # type: ignore[arg-type]
    async with open_store(db, on_writer_lost=_lost) as store:
        snap = await store.snapshot("t")
        turns = {t["id"]: t for t in snap["turns"]}
        assert turns["u1"]["status"] == "interrupted" and turns["u1"]["reason"] == "server_restart"
        assert turns["u2"]["status"] == "starting"
        assert await store.pending_requests() == []
        # The interrupted turn's checkpoint is captured before the queued turn starts.
        assert [type(e).__name__ for _, e in await store.pending_effects()] == ["CaptureCheckpoint", "StartProviderTurn"]


async def test_a_huge_thread_is_paged_by_bytes_and_every_turn_comes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot stops taking older finished turns past SNAPSHOT_BYTES (here 64 KiB) and
    says has_more with its `before` cursor; paging with `before` then yields every turn
    exactly once, newest page first, so a huge thread is never held whole in memory."""
    from t3d.domain.model import TurnItem
    from t3d.store import queries

    monkeypatch.setattr(queries, "SNAPSHOT_BYTES", 64 * 1024)
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        await store.execute(c.CreateProject("p", "/p"))
        await store.execute(c.CreateThread("t", "p", "replay"))
        for n in range(1, 21):
            await store.execute(c.StartTurn("t", f"u{n}", "go"))
            await store.execute(c.MarkTurnRunning(f"u{n}"))
            big = TurnItem(f"u{n}-out", "t", f"u{n}", 0, "command", "completed", "make", "x" * 10_000, None, 0.0)
            await store.execute(c.RecordItems(f"u{n}", (big,)))
            await store.execute(c.FinishTurn(f"u{n}", "completed"))
        seen: list[int] = []
        before = None
        while True:
            page = await store.snapshot("t", turn_limit=1000, before=before)
            ordinals = [t["ordinal"] for t in page["turns"]]
            assert 1 <= len(ordinals) <= 8, ordinals  # ~11 KB a turn: at most 64 KiB + one turn
            seen = ordinals + seen
            if not page["has_more"]:
                break
            before = page["before"]
            assert before == ordinals[0]
        assert seen == list(range(1, 21))


def _streamed(text: str) -> TurnItem:
    return TurnItem("u:m:0", "t", "u", 0, "assistant_message", "streaming", None, text, None, 1.0)


async def _stream_an_item(store: Store) -> EntityCache:
    """A running turn ``u`` whose item ``u:m:0`` streams "A"; the writer's cache."""
    await store.execute(c.CreateProject("p", "/p"))
    await store.execute(c.CreateThread("t", "p", "replay"))
    await store.execute(c.StartTurn("t", "u", "go"))
    await store.record(c.MarkTurnRunning("u"))
    await store.record(c.RecordItems("u", (_streamed("A"),)))
    cache: EntityCache = store._cache  # type: ignore[attr-defined]
    return cache


async def test_the_writers_entity_cache_never_serves_a_row_that_changed(tmp_path: Path) -> None:
    """The writer keeps entities it decoded or wrote (a streaming item, its turn), but reads
    one from the cache only while the row's body is still the bytes it came from: a write
    rolled back, or a row changed behind the cache's back, is read from the row; an
    unchanged row is served without decoding (the same object)."""
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        cache = await _stream_an_item(store)

        def rolled_back(conn: apsw.Connection) -> tuple[TurnItem | None, bool]:
            conn.execute("BEGIN IMMEDIATE")
            outcome = _apply(conn, Write(c.RecordItems("u", (_streamed("B"),)), None, 2.0), cache)
            assert outcome.unwrap().events  # B was written, and kept in the cache
            conn.execute("ROLLBACK")
            view = SqlView(conn, cache)
            first = view.item("u:m:0")
            return first, view.item("u:m:0") is first

        item, same = await store.maintain(rolled_back)
        assert item is not None and item.text == "A" and same

        def changed_behind(conn: apsw.Connection) -> TurnItem | None:
            with conn:
                conn.execute("UPDATE items SET body = json_set(body, '$.text', 'C') WHERE id = 'u:m:0'")
            return SqlView(conn, cache).item("u:m:0")

        changed = await store.maintain(changed_behind)
        assert changed is not None and changed.text == "C"


async def test_the_writers_entity_cache_lets_a_settled_item_go(tmp_path: Path) -> None:
    """A streaming item is kept (its next update reads it back), but once it is completed
    the cache drops it, and its turn once the turn has ended (a checkpoint is never kept),
    so under many sessions finished entities do not push the live ones out; both are
    still read right, from their rows."""
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        cache = await _stream_an_item(store)
        assert (TurnItem, "u:m:0") in cache._entries and (Turn, "u") in cache._entries
        done = attrs.evolve(_streamed("AB"), status="completed")
        await store.record(c.RecordItems("u", (done,)))
        assert (TurnItem, "u:m:0") not in cache._entries and (Turn, "u") in cache._entries

        def read(conn: apsw.Connection) -> TurnItem | None:
            return SqlView(conn, cache).item("u:m:0")

        item = await store.maintain(read)
        assert item is not None and item.status == "completed" and item.text == "AB"
        assert (TurnItem, "u:m:0") not in cache._entries

        await store.record(c.FinishTurn("u", "completed"))
        assert (Turn, "u") not in cache._entries

        def read_turn(conn: apsw.Connection) -> Turn | None:
            return SqlView(conn, cache).turn("u")

        turn = await store.maintain(read_turn)
        assert turn is not None and turn.status == "completed"
        assert (Turn, "u") not in cache._entries

        # A checkpoint is written once, at its turn's end, and not read by the writer again.
        await store.record(c.RecordCheckpoint(Checkpoint("t:1", "t", "u", 1, "/p", "ok", 2.0)))
        assert (Checkpoint, "t:1") not in cache._entries


async def test_the_bodies_the_writer_keeps_take_their_own_size(tmp_path: Path) -> None:
    """The writer keeps each streaming item's row body (its cache); those bytes take about
    their length in memory, not the 4 KiB write buffer orjson 3.12 hands back with every
    encoding (at PRIMARY 150, 1,969 kept payloads of ~400 bytes held 14.4 MiB; issue 19)."""
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        cache = await _stream_an_item(store)
        items = tuple(
            TurnItem(f"u:m:{n}", "t", "u", n, "assistant_message", "streaming", None, "x" * 300, None, 1.0)
            for n in range(1, 101)
        )
        tracemalloc.start()
        try:
            await store.record(c.RecordItems("u", items))
            bodies = [body for (kind, key), (body, _) in cache._entries.items() if kind is TurnItem and key != "u:m:0"]
            where = {tracemalloc.get_object_traceback(body) for body in bodies}
            held = sum(t.size for t in tracemalloc.take_snapshot().traces if t.traceback in where)
        finally:
            tracemalloc.stop()
    assert len(bodies) == 100 and None not in where
    assert held <= 1.5 * sum(len(body) for body in bodies), (held, sum(len(body) for body in bodies))


def test_the_entity_cache_is_bounded() -> None:
    """At most MAX_ENTRIES entries and MAX_BYTES of bodies are kept (the oldest go first),
    and a body over MAX_BODY is not kept at all."""
    cache = EntityCache()
    for n in range(EntityCache.MAX_ENTRIES + 10):
        cache.put(TurnItem, f"i{n}", b"x%d" % n, n)
    assert cache.get(TurnItem, "i0", b"x0") is None and cache.get(TurnItem, f"i{n}", b"x%d" % n) == n
    big = b"y" * (EntityCache.MAX_BODY - 1)
    for n in range(EntityCache.MAX_BYTES // len(big) + 2):
        cache.put(TurnItem, f"b{n}", big, n)
    assert cache._bytes <= EntityCache.MAX_BYTES  # type: ignore[attr-defined]
    cache.put(TurnItem, "huge", b"z" * (EntityCache.MAX_BODY + 1), "huge")
    assert cache.get(TurnItem, "huge", b"z" * (EntityCache.MAX_BODY + 1)) is None
