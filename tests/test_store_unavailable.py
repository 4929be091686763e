"""A database that cannot take writes for a while: a full disk, another process's lock.

The store runs on a real SQLite file. "Full" is SQLite's own SQLITE_FULL, reached with
``PRAGMA max_page_count`` (so these run without root; test_disk_full.py fills a real
filesystem); "locked" is a second real process holding ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import apsw
import pytest
import trio
from db_faults import lock_held_by_another_process
from harness import wait_until
from served import base_env

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.model import TurnItem
from t3d.effects import EffectQueue, run_effects
from t3d.errors import DatabaseBusyError, DatabaseFullError
from t3d.store.commit import Committed
from t3d.store.store import Store, open_store


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


def _item(turn: str, key: str, size: int) -> TurnItem:
    return TurnItem(f"{turn}-{key}", f"t-{turn}", turn, 0, "assistant_message", "completed", None, key * size, None, 0.0)


async def _running_turn(store: Store, tmp_path: Path, turn: str = "u0") -> None:
    if not await store.projects():
        await store.execute(c.CreateProject("p", str(tmp_path)))
    await store.execute(c.CreateThread(f"t-{turn}", "p", "replay"))
    await store.execute(c.StartTurn(f"t-{turn}", turn, "go"))
    await store.execute(c.MarkTurnRunning(turn))


async def _cap_pages(store: Store, pages: int | None = None) -> None:
    """No page beyond the database's current size (None: lift the cap)."""

    def cap(conn: apsw.Connection) -> None:
        limit = pages or conn.execute("PRAGMA page_count").get
        conn.execute(f"PRAGMA max_page_count={limit}")

    await store._writer.run(cap)  # type: ignore[attr-defined]


async def _integrity(store: Store) -> str:
    return await store.read(lambda conn: conn.execute("PRAGMA integrity_check").get, lambda ok: str(ok))


async def test_a_full_database_fails_client_commands_clearly_and_holds_provider_updates_in_order(tmp_path: Path) -> None:
    """With no room for new pages: a client's command fails with "the database is full:
    free space on <dir>"; provider updates are held (a small one that would fit is not let
    ahead of a large one before it), none is published; once there is room they commit in
    the order they were sent, the writer's connection works on, the file is intact."""
    with trio.fail_after(30):
        async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
            await _running_turn(store, tmp_path)
            published: list[str] = []
            store.on_commit(lambda done: published.extend(e.entity.id for e in done.events if e.kind == "item.updated"))
            await _cap_pages(store)
            with pytest.raises(DatabaseFullError, match=f"^the database is full: free space on {tmp_path}") as raised:
                await store.execute(c.CreateProject("p2", "/x" * 8000), command_id="c-1")
            assert isinstance(raised.value.__cause__, apsw.FullError)
            assert store.unavailable is not None and store.statistics().unavailable == str(store.unavailable)

            pending = [await store.send(c.RecordItems("u0", (_item("u0", key, size),))) for key, size in (("a", 30_000), ("b", 10), ("c", 30_000))]
            await wait_until(lambda: store.statistics().writes_held == 3)
            assert published == []
            await trio.sleep(0.5)  # retries keep failing meanwhile; nothing gets out
            assert published == [] and store.statistics().writes_held == 3

            await _cap_pages(store, 1 << 30)
            results = [await p.outcome() for p in pending]
            assert all(isinstance(r, Committed) for r in results)
            assert published == ["u0-a", "u0-b", "u0-c"]
            sequences = [r.events[0].sequence for r in results]
            assert sequences == sorted(sequences)
            assert store.unavailable is None and store.statistics().writes_held == 0
            assert (await store.execute(c.CreateProject("p2", "/x" * 8000), command_id="c-1")).result["project_id"] == "p2"
            assert await _integrity(store) == "ok"


async def test_a_clients_command_that_joins_an_open_transaction_on_a_full_database_fails_and_the_update_is_held(tmp_path: Path) -> None:
    """A client's command joins a transaction of provider updates still open for the commit
    interval; the database has no room for it: the command fails with "the database is
    full" (it is never held), the update before it is held, not lost, and commits once
    there is room; the file is intact."""
    with trio.fail_after(30):
        async with open_store(tmp_path / "db", commit_interval_s=30.0, on_writer_lost=_lost) as store:
            await _running_turn(store, tmp_path)
            await (await store.send(c.RecordItems("u0", (_item("u0", "a", 10),)))).outcome()
            await _cap_pages(store)
            waiting = await store.send(c.RecordItems("u0", (_item("u0", "b", 10),)))
            await trio.sleep(0.2)
            assert store.statistics().writes_held == 0 and not waiting.done  # applied, open
            with pytest.raises(DatabaseFullError, match=r"^the database is full"):
                await store.execute(c.CreateProject("p2", "/x" * 8000), command_id="c-1")
            await wait_until(lambda: store.statistics().writes_held == 1)
            assert not waiting.done
            await _cap_pages(store, 1 << 30)
            assert isinstance(await waiting.outcome(), Committed)
            assert store.statistics().writes_held == 0
            assert await _integrity(store) == "ok"


async def test_a_lock_held_by_another_process_fails_client_commands_and_provider_updates_wait(tmp_path: Path) -> None:
    """While a second process holds BEGIN IMMEDIATE past the busy timeout: a client's command
    fails with "the database is locked by another process", naming that process; a provider
    update and a turn's end (record) wait; when the lock goes they commit, in order."""
    with trio.fail_after(60):
        async with open_store(tmp_path / "db", busy_timeout_ms=200, on_writer_lost=_lost) as store:
            await _running_turn(store, tmp_path)
            kinds: list[str] = []
            store.on_commit(lambda done: kinds.extend(e.kind for e in done.events))
            async with trio.open_nursery() as nursery, lock_held_by_another_process(tmp_path / "db") as holder:
                with pytest.raises(DatabaseBusyError, match=f"^the database is locked by another process: pid {holder.pid} ") as raised:
                    await store.execute(c.CreateProject("p2", "/p2"))
                assert isinstance(raised.value.__cause__, apsw.BusyError)
                assert str(raised.value).endswith("holds a write transaction on " + str(tmp_path / "db") + "; end that transaction")
                update = await store.send(c.RecordItems("u0", (_item("u0", "a", 10),)))
                nursery.start_soon(store.record, c.FinishTurn("u0", "completed"))
                await wait_until(lambda: store.statistics().writes_held == 1)
                await trio.sleep(0.6)  # a few retries, all refused
                assert kinds == [] and store.unavailable is not None
            assert isinstance(await update.outcome(), Committed)
            assert [k for k in kinds if k != "thread.updated"] == ["item.updated", "turn.updated"]
            assert store.unavailable is None


async def test_effect_bookkeeping_that_cannot_commit_is_retried_and_no_effect_runs_twice(tmp_path: Path) -> None:
    """The effect worker runs an effect, then cannot mark it done (another process holds the
    lock): it does not crash, does not run the effect again, and marks it once the lock goes;
    later effects run as usual."""
    dispatched: list[ev.Effect] = []
    locked = trio.Event()
    release = trio.Event()

    async def hold_lock_once() -> None:
        async with lock_held_by_another_process(tmp_path / "db"):
            locked.set()
            await release.wait()

    with trio.fail_after(60):
        async with open_store(tmp_path / "db", busy_timeout_ms=200, on_writer_lost=_lost) as store:
            queue = EffectQueue()
            store.on_commit(queue.on_commit)
            async with trio.open_nursery() as nursery:

                async def dispatch(effect: ev.Effect) -> None:
                    dispatched.append(effect)
                    if len(dispatched) == 1:  # the lock is taken before its mark
                        nursery.start_soon(hold_lock_once)
                        await locked.wait()

                await nursery.start(run_effects, store, queue, dispatch)
                await store.execute(c.CreateProject("p", str(tmp_path)))
                await store.execute(c.CreateThread("t-u0", "p", "replay"))
                await store.execute(c.StartTurn("t-u0", "u0", "go"))
                await wait_until(lambda: store.unavailable is not None)
                assert [type(e) for _, e in await store.pending_effects()] == [ev.StartProviderTurn]
                await trio.sleep(1.5)  # past a retry of the mark
                release.set()
                await wait_until(lambda: _no_pending(store))
                await store.execute(c.CreateThread("t-u1", "p", "replay"))
                await store.execute(c.StartTurn("t-u1", "u1", "go"))
                await wait_until(lambda: len(dispatched) == 2)
                await wait_until(lambda: _no_pending(store))
                nursery.cancel_scope.cancel()
    assert [(type(e).__name__, getattr(e, "turn_id", None)) for e in dispatched] == [
        ("StartProviderTurn", "u0"),
        ("StartProviderTurn", "u1"),
    ]


async def _no_pending(store: Store) -> bool:
    return not await store.pending_effects()


async def test_a_daemon_started_on_a_locked_database_exits_1_naming_the_cause(tmp_path: Path) -> None:
    """`t3d serve` on a database another process holds locked past the busy timeout exits
    with status 1 and one line naming the cause and the holder, not a traceback."""
    state = tmp_path / "state"
    async with open_store(state / "t3d.sqlite", on_writer_lost=_lost):
        pass
    with trio.fail_after(60):
        async with lock_held_by_another_process(state / "t3d.sqlite") as holder:
            done = await trio.run_process(
                [sys.executable, "-m", "t3d", "serve", "--port", "0", "--state-dir", str(state), "--sqlite-busy-timeout-ms", "300"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=base_env(),
            )
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert f"t3d: stopped: the database is locked by another process: pid {holder.pid} " in stderr, stderr
    assert "Traceback" not in stderr, stderr
