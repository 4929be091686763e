"""The data lifecycle on a real daemon (tests/harness.py): retention and resume, thread
delete and unarchive, backup while turns stream, restore, and `t3d ctl db` as a user runs it.

Each daemon runs its automatic retention pass only once a day (``retention_interval``),
so every pass here is one the test asks for (``db.prune``), except where the test is
about the automatic purge of a deleted thread.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import apsw
import orjson
import trio
from harness import TERMINAL, new_thread, open_client, run_turn, start_daemon, wait_until
from live_support import merge_chunks, notes_until, thread_events, write_flood_fixture
from metrics_support import scrape, value
from served import base_env, query, serve
from test_retention import folded, projections

from t3d.domain.codec import event_from
from t3d.domain.state import fold

ONE_TURN = Path(__file__).resolve().parent.parent / "replay_fixtures" / "claude" / "claude-2.1.197_oneshot_default_noprompttool.stdout.jsonl"
T3D = str(Path(sys.executable).parent / "t3d")
QUIET = {"retention_interval": "1d"}  # no automatic pass during a test
PRUNE_ALL = {**QUIET, "retention_item_snapshots_age": "0", "retention_state_events_age": "0"}


async def finish(client: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Poll a db job until it ends; its final state."""
    while job["state"] == "running":
        await trio.sleep(0.05)
        job = await client.call("db.job", job_id=job["job_id"])
    assert job["state"] == "done", job
    return job


def position_of(notes: list[dict[str, Any]]) -> int:
    return max(n["seq"] for n in notes)


def turn_ended(turn_id: str) -> Any:
    return lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn_id and d["entity"]["status"] in TERMINAL


# --- resume across pruned events -------------------------------------------------------------


async def test_a_resume_across_pruned_events_gets_a_snapshot(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A subscriber away while a turn streamed comes back after ``db.prune`` deleted that
    turn's superseded snapshots and compacted its final ones: it gets ``base: snapshot`` (a
    replay would lack events), holding the turn's final items (read from their rows). One that left after the prune gets its replay as before.
    A shell subscriber from before a pruned ``thread.deleted`` gets a fresh shell."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(ONE_TURN), **PRUNE_ALL)
        async with open_client(daemon) as actor:
            thread_id = await new_thread(actor, tmp_path)
            other = (await actor.call("thread.create", project_id=(await actor.call("project.list"))["projects"][0]["id"], provider="replay"))["thread_id"]
            async with open_client(daemon) as watcher:
                sub = (await watcher.call("subscribe.thread", thread_id=thread_id))["sub"]
                position = position_of(await notes_until(watcher, sub, "snapshot.end"))
                shell = await watcher.call("subscribe.shell")
                shell_position = shell["sequence"]
            second = await run_turn(actor, thread_id, "while you were away")
            pruned = await finish(actor, await actor.call("db.prune"))
            assert pruned["result"]["rows"]["item snapshots"] > 0
            assert pruned["result"]["rows"]["thread-state events"] > 0
            assert pruned["result"]["compacted"]["item snapshots"] > 0, "the turn's final items are their rows only"
            # The pass a delete wakes (ages 0 here) takes the thread's events, thread.deleted too.
            await actor.call("thread.delete", thread_id=other)
            await wait_until(lambda: _events_of(daemon, other, 0))

            async with open_client(daemon) as back:
                result = await back.call("subscribe.thread", thread_id=thread_id, after_sequence=position)
                assert result["base"] == "snapshot"
                snapshot = merge_chunks(await notes_until(back, result["sub"], "snapshot.end"))
                assert snapshot["turns"][-1]["id"] == second.turn["id"]
                assert [i for i in snapshot["items"] if i["turn_id"] == second.turn["id"]] == second.items

                shell_back = await back.call("subscribe.shell", after_sequence=shell_position)
                assert shell_back["base"] == "snapshot"
                shell_notes = merge_chunks(await notes_until(back, shell_back["sub"], "snapshot.end"))
                assert [t["id"] for t in shell_notes["threads"]] == [thread_id]

                since = result["sequence"]
                third = await run_turn(actor, thread_id, "after the prune")
                again = await back.call("subscribe.thread", thread_id=thread_id, after_sequence=since)
                assert again["base"] == "replay"
                replayed = [n["data"] for n in (await notes_until(back, again["sub"], "synced"))[:-1]]
                expected = [e for e in await thread_events(daemon.settings.db_path, thread_id) if e["sequence"] > since]
                assert replayed == expected and any(e["entity"]["id"] == third.turn["id"] for e in replayed)
        daemon.stop()


async def _all_turns_ended(daemon: Any) -> bool:
    rows = await query(daemon.settings.db_path, f"SELECT count(*) FROM turns WHERE status NOT IN {tuple(TERMINAL)}")
    return bool(rows[0][0] == 0)


async def _events_of(daemon: Any, thread_id: str, count: int) -> bool:
    rows = await query(daemon.settings.db_path, "SELECT count(*) FROM events WHERE thread_id = ?", thread_id)
    return bool(rows[0][0] == count)


# --- delete and unarchive ----------------------------------------------------------------------


async def test_a_deleted_threads_events_go_soon_and_other_threads_keep_theirs(tmp_path: Path, nursery: trio.Nursery) -> None:
    """thread.delete removes the thread's projection at once and, moments later (the pruner
    wakes for it, whatever the ages), every event of the thread but its thread.deleted;
    another thread's events and rows are untouched."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(ONE_TURN), **QUIET)
        async with open_client(daemon) as actor:
            doomed = await new_thread(actor, tmp_path)
            kept = await new_thread(actor, tmp_path)
            await run_turn(actor, doomed, "one")
            await run_turn(actor, kept, "two")
            kept_before = await thread_events(daemon.settings.db_path, kept)
            assert len(await thread_events(daemon.settings.db_path, doomed)) > 10
            await actor.call("thread.delete", thread_id=doomed)
            await wait_until(lambda: _events_of(daemon, doomed, 1))
            left = await thread_events(daemon.settings.db_path, doomed)
            assert [e["kind"] for e in left] == ["thread.deleted"]
            for table in ("items", "turns", "requests", "sessions", "checkpoints"):
                assert await query(daemon.settings.db_path, f"SELECT count(*) FROM {table} WHERE thread_id = ?", doomed) == [(0,)]
            assert await query(daemon.settings.db_path, "SELECT count(*) FROM purge_threads") == [(0,)]
            assert (await thread_events(daemon.settings.db_path, kept))[: len(kept_before)] == kept_before
        daemon.stop()


async def test_unarchive_undoes_archive_and_the_next_turn_starts_an_agent(tmp_path: Path, nursery: trio.Nursery) -> None:
    """An archived thread refuses turns; thread.unarchive clears ``archived_at`` (idempotent,
    retried by command_id with the same result), and its next turn runs to completion on a
    freshly started agent."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(ONE_TURN), **QUIET)
        async with open_client(daemon) as actor:
            thread_id = await new_thread(actor, tmp_path)
            await run_turn(actor, thread_id, "before")
            await actor.call("thread.archive", thread_id=thread_id)
            try:
                await actor.call("turn.start", thread_id=thread_id, text="refused")
                raise AssertionError("an archived thread took a turn")
            except Exception as exc:
                assert "archived" in str(exc)
            first = await actor.call("thread.unarchive", thread_id=thread_id, command_id="u1")
            assert await actor.call("thread.unarchive", thread_id=thread_id, command_id="u1") == first
            await actor.call("thread.unarchive", thread_id=thread_id)
            shell = (await actor.call("thread.snapshot", thread_id=thread_id))["thread"]
            assert shell["archived_at"] is None
            after = await run_turn(actor, thread_id, "after")
            assert after.turn["status"] == "completed"
            sessions = await query(daemon.settings.db_path, "SELECT count(*) FROM sessions WHERE thread_id = ?", thread_id)
            assert sessions[0][0] == 2, "the archive stopped the first agent; the next turn started another"
        daemon.stop()


# --- backup and restore ------------------------------------------------------------------------


def _read_backup(path: Path) -> tuple[str, int, dict[str, Any], dict[str, Any]]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        integrity = conn.execute("PRAGMA integrity_check").get
        top = conn.execute("SELECT coalesce(max(sequence), 0) FROM events").get
        own = folded(fold(event_from(k, p) for k, p in conn.execute("SELECT kind, payload FROM events ORDER BY sequence")))
        return str(integrity), int(top), projections(conn), own  # type: ignore[arg-type]
    finally:
        conn.close()


def _fold_until(db: Path, sequence: int) -> dict[str, Any]:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute("SELECT kind, payload FROM events WHERE sequence <= ? ORDER BY sequence", (sequence,))
        return folded(fold(event_from(k, p) for k, p in rows))
    finally:
        conn.close()


async def test_a_backup_while_turns_stream_is_the_database_at_one_commit(tmp_path: Path, nursery: trio.Nursery) -> None:
    """db.backup while three threads stream 1,200 items each: the copy passes integrity_check,
    has mode 0600, and its projections are exactly the source's as of the backup's sequence
    (the fold of the source's events up to it), though the source went on writing."""
    with trio.fail_after(90):
        fixture = tmp_path / "flood.stdout.jsonl"
        write_flood_fixture(fixture, 1200)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(fixture), **QUIET)
        target = tmp_path / "backups" / "t3d-copy.sqlite"
        target.parent.mkdir()
        async with open_client(daemon) as actor:
            project = (await actor.call("project.create", path=str(tmp_path)))["project_id"]
            threads = [(await actor.call("thread.create", project_id=project, provider="replay"))["thread_id"] for _ in range(3)]
            for thread_id in threads:
                await actor.call("turn.start", thread_id=thread_id, text="flood")
            job = await finish(actor, await actor.call("db.backup", path=str(target)))
            await wait_until(lambda: _all_turns_ended(daemon))
            final = (await actor.call("db.stats"))["sequence"]
        result = job["result"]
        assert result["path"] == str(target) and result["bytes"] == target.stat().st_size
        assert target.stat().st_mode & 0o777 == 0o600
        assert result["sequence"] < final, "the turns went on after the backup's commit"
        integrity, top, tables, own = await trio.to_thread.run_sync(_read_backup, target)
        assert integrity == "ok"
        assert top == result["sequence"]
        assert tables == own == await trio.to_thread.run_sync(_fold_until, daemon.settings.db_path, result["sequence"])
        daemon.stop()


async def test_restoring_a_backup_brings_back_the_projections_it_holds(tmp_path: Path, nursery: trio.Nursery) -> None:
    """README's restore: stop the daemon, put the backup in place of t3d.sqlite (and remove its
    -wal and -shm), start it: the threads, turns and items are those of the backup's moment;
    what happened after the backup is gone."""
    state = tmp_path / "state"
    target = tmp_path / "backup.sqlite"
    with trio.fail_after(90):
        async with trio.open_nursery() as first:
            daemon = await start_daemon(first, state, replay_fixture=str(ONE_TURN), **QUIET)
            async with open_client(daemon) as actor:
                thread_id = await new_thread(actor, tmp_path)
                await run_turn(actor, thread_id, "kept")
                await finish(actor, await actor.call("db.backup", path=str(target)))
                before = await actor.call("thread.snapshot", thread_id=thread_id)
                await actor.call("thread.rename", thread_id=thread_id, title="after the backup")
                await run_turn(actor, thread_id, "lost")
            daemon.stop()
        for suffix in ("-wal", "-shm"):
            (state / f"t3d.sqlite{suffix}").unlink(missing_ok=True)
        shutil.copyfile(target, state / "t3d.sqlite")
        async with trio.open_nursery() as second:
            daemon = await start_daemon(second, state, replay_fixture=str(ONE_TURN), **QUIET)
            async with open_client(daemon) as actor:
                after = await actor.call("thread.snapshot", thread_id=thread_id)
                assert {k: v for k, v in after.items() if k != "sequence"} == {k: v for k, v in before.items() if k != "sequence"}
                assert after["thread"]["title"] != "after the backup" and len(after["turns"]) == 1
                check = await finish(actor, await actor.call("db.check"))
                assert check["result"]["ok"], check
            daemon.stop()


# --- t3d ctl db --------------------------------------------------------------------------------


async def _ctl(served: Any, *args: str) -> tuple[int, str, str]:
    result = await trio.run_process(
        [T3D, "ctl", "--state-dir", str(served.state_dir), "--port", str(served.port), "db", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=base_env(),
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_ctl_db_commands_report_and_act_through_the_daemon(tmp_path: Path) -> None:
    """`t3d ctl db stats|prune --dry-run|prune|check|vacuum|backup` against `t3d serve`: JSON
    with --json and tables without; the dry run counts what prune then deletes and compacts,
    and stats counts the compacted events; a backup to
    a file that exists is refused (exit 1, the reason named) and leaves it alone."""
    state = tmp_path / "state"
    with trio.fail_after(120):
        async with serve(state, "--replay-fixture", str(ONE_TURN), "--retention-interval", "1d", "--retention-item-snapshots-age", "0") as served:
            async with open_client(served) as actor:  # type: ignore[arg-type]
                thread_id = await new_thread(actor, tmp_path)
                await run_turn(actor, thread_id, "one")
                await run_turn(actor, thread_id, "two")
            code, out, err = await _ctl(served, "stats", "--json")
            assert code == 0, err
            stats = orjson.loads(out)
            assert stats["events_by_kind"]["item.updated"]["total"] > 2
            assert stats["largest_threads"][0]["thread_id"] == thread_id and stats["auto_vacuum"] == "incremental"
            code, text, err = await _ctl(served, "stats")
            assert code == 0 and "events by kind and age" in text and thread_id in text

            code, out, _ = await _ctl(served, "prune", "--dry-run", "--json")
            dry = orjson.loads(out)
            assert code == 0 and dry["dry_run"] and dry["rows"]["item snapshots"] > 0
            code, out, _ = await _ctl(served, "prune", "--json")
            done = orjson.loads(out)
            assert code == 0 and done["rows"]["item snapshots"] == dry["rows"]["item snapshots"]
            assert done["compacted"]["item snapshots"] == dry["compacted"]["item snapshots"] > 0
            code, out, _ = await _ctl(served, "stats", "--json")
            assert code == 0 and orjson.loads(out)["retention"]["compacted"] == done["compacted"]["item snapshots"]
            # /metrics counts the pass's steps and what it deleted and compacted.
            families = await scrape(served.port, served.token)
            assert value(families, "t3d_retention_passes", "t3d_retention_passes_total") == 1
            assert value(families, "t3d_retention_steps", "t3d_retention_steps_total") == done["steps"] > 0
            # Events only: the done outbox rows a pass removes are not events.
            events_deleted = sum(n for phase, n in done["rows"].items() if phase != "outbox")
            assert value(families, "t3d_retention_events_deleted", "t3d_retention_events_deleted_total") == events_deleted > 0
            assert value(families, "t3d_retention_events_compacted", "t3d_retention_events_compacted_total") == sum(done["compacted"].values())
            assert value(families, "t3d_retention_running") == 0
            code, text, _ = await _ctl(served, "prune")
            assert code == 0 and text.startswith("deleted: 0 item snapshots")

            code, text, err = await _ctl(served, "check")
            assert code == 0 and text.startswith("ok: "), err
            code, text, err = await _ctl(served, "vacuum")
            assert code == 0 and "incremental vacuum" in text, err

            copy = tmp_path / "copy.sqlite"
            code, text, err = await _ctl(served, "backup", str(copy))
            assert code == 0 and text.startswith(f"backed up to {copy}"), err
            size = copy.stat().st_size
            code, text, err = await _ctl(served, "backup", str(copy))
            assert code == 1 and "exists" in err and copy.stat().st_size == size
            code, _, err = await _ctl(served, "backup", "relative/dir/copy.sqlite")
            assert code == 1 and "does not exist" in err
            rows = await query(copy, "SELECT count(*) FROM threads")
            assert rows == [(1,)]



async def test_check_names_each_problem_it_finds(tmp_path: Path) -> None:
    """db.check's work on a database whose counts drifted and that holds an item of no thread:
    not ok, each problem named; its progress goes table by table up to its total."""
    from t3d.domain import commands as c
    from t3d.store.maintenance import run_check
    from t3d.store.store import open_store

    def lost(error: BaseException | None) -> None:
        raise AssertionError(f"writer lost: {error!r}")

    path = tmp_path / "t3d.sqlite"
    async with open_store(path, on_writer_lost=lost) as store:
        await store.execute(c.CreateProject("p", "/p"))
        await store.execute(c.CreateThread("t", "p", "replay"))
        await store.execute(c.StartTurn("t", "u", "go"))

    def damage() -> None:
        conn = apsw.Connection(str(path))
        conn.execute("UPDATE thread_counts SET items = 7 WHERE thread_id = 't'")
        conn.execute("INSERT INTO items(id, thread_id, turn_id, ordinal, body) VALUES ('x', 'gone', 'u0', 1, x'7b7d')")
        conn.close()

    await trio.to_thread.run_sync(damage)
    seen: list[tuple[str, int, int]] = []
    result = await run_check(path, progress=lambda phase, done, total: seen.append((phase, done, total)))
    assert not result["ok"]
    assert any("items: 1 rows whose thread does not exist" in p for p in result["problems"])
    assert any(p.startswith("thread t: threads whose maintained counts do not match") for p in result["problems"])
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen) and seen[-1][1] == seen[-1][2]
    assert any(phase == "checking events" for phase, _, _ in seen)
