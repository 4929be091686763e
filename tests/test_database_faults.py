"""`t3d serve` (a real subprocess) while its database cannot take writes: the disk is full,
or another process holds SQLite's write lock. The daemon stays up, calls fail with a clear
error, health says why, provider output waits (nothing dropped), and everything goes on
once the trouble passes, without a restart.

The provider is `tests/fixtures/misbehaving_claude` in ``chunks`` mode: a turn streams
20 KB assistant messages, each its own item, until a stop file appears, then says how
many it sent. The full disk is a 20 MiB tmpfs (root only, else skipped) filled with a
ballast file; the lock is a second real process holding ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import orjson
import trio
from db_faults import fill, lock_held_by_another_process, small_tmpfs
from harness import RpcClient, RpcFailed, http, wait_until
from served import Served, base_env, open_ws, query, serve
from test_provider_failures import fake_claude

UNAVAILABLE = -32003
FULL = "the database is full: free space on the disk of the state dir"
LOCKED = "the database is locked by another process"


async def _items(served: Served, turn_id: str) -> list[str]:
    rows = await query(served.db_path, "SELECT body FROM items WHERE turn_id = ?", turn_id)
    return [item["text"] for item in (orjson.loads(body) for (body,) in rows) if item["kind"] == "assistant_message"]


async def _turn_status(served: Served, turn_id: str) -> str:
    [(status,)] = await query(served.db_path, "SELECT status FROM turns WHERE id = ?", turn_id)
    return str(status)


async def _health(served: Served) -> tuple[int, dict[str, Any]]:
    status, body = await http(served, "GET", "/api/health")  # type: ignore[arg-type]  # the whole report needs the token
    return status, body


async def _calls(client: RpcClient, thread_id: str, count: int, expected: str) -> tuple[int, int]:
    """``count`` client commands (thread.rename); (failed, succeeded). Every failure must be
    UNAVAILABLE with a message starting with ``expected``."""
    failed = succeeded = 0
    for n in range(count):
        try:
            await client.call("thread.rename", thread_id=thread_id, title=f"title {n}")
            succeeded += 1
        except RpcFailed as exc:
            assert exc.code == UNAVAILABLE, (exc.code, exc.message)
            assert exc.message.startswith(expected), exc.message
            failed += 1
        await trio.sleep(0.05)
    return failed, succeeded


async def _start_streaming(client: RpcClient, project: Path) -> tuple[str, str]:
    created = await client.call("project.create", path=str(project))
    thread = await client.call("thread.create", project_id=created["project_id"], provider="claude")
    turn = await client.call("turn.start", thread_id=thread["thread_id"], text="stream")
    return thread["thread_id"], turn["turn_id"]


async def _stop_and_check_the_turn(served: Served, stop: Path, turn_id: str) -> tuple[int, int]:
    """Stop the stream; wait for the turn to complete; every message the provider sent is
    stored, each exactly once. (sent, stored)."""
    await trio.Path(stop).touch()
    with trio.fail_after(60):
        await wait_until(lambda: _completed(served, turn_id), interval=0.1)
    sent = int(await trio.Path(f"{stop}.count").read_text())
    texts = await _items(served, turn_id)
    numbers = sorted(int(text.split("#", 1)[1].split(":", 1)[0]) for text in texts)
    assert numbers == list(range(sent)), (len(numbers), sent)
    return sent, len(texts)


async def _completed(served: Served, turn_id: str) -> bool:
    return await _turn_status(served, turn_id) == "completed"


async def _sigterm_exits_0(served: Served) -> None:
    assert served.process.returncode is None, served.stderr_text()
    served.process.send_signal(signal.SIGTERM)
    with trio.fail_after(60):
        code = await served.process.wait()
    assert code == 0, served.stderr_text()[-3000:]


def _project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir(exist_ok=True)
    return path


async def test_a_full_disk_fails_calls_clearly_holds_provider_output_and_all_goes_on_once_freed(tmp_path: Path) -> None:
    """The state dir on a 20 MiB tmpfs, filled by a ballast file while a turn streams: the
    daemon stays up; client calls fail with "the database is full: free space on <dir>"
    (WebSocket and HTTP, the JSON-RPC UNAVAILABLE envelope) or succeed; health is failing
    with that reason; the provider's output waits. The ballast deleted: health is ok, calls
    succeed, the turn completes with every message stored once, the file is intact, and
    SIGTERM still ends the daemon with status 0."""
    binary, _ = fake_claude(tmp_path, "chunks")
    stop = tmp_path / "stop"
    env = base_env(MISBEHAVING_STOP=str(stop), MISBEHAVING_CHUNK_PAUSE="0.05")
    with small_tmpfs(tmp_path / "state") as state, trio.fail_after(240):
        async with serve(state, "--claude-bin", binary, env=env) as served, open_ws(served) as client:
            thread_id, turn_id = await _start_streaming(client, _project(tmp_path))
            await wait_until(lambda: _count_at_least(served, turn_id, 10), interval=0.05)
            ballast = state / "ballast"
            await trio.to_thread.run_sync(fill, ballast)
            expected = f"the database is full: free space on {state}"

            await wait_until(lambda: _failing(served, FULL, expected), interval=0.1)
            full_failed, full_succeeded = await _calls(client, thread_id, 20, expected)
            assert full_failed >= 1
            status, body = await http(  # type: ignore[arg-type]
                served, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 7, "method": "thread.rename", "params": {"thread_id": thread_id, "title": "x"}}
            )
            assert status == 200 and body["id"] == 7, body
            if "error" in body:
                assert body["error"]["code"] == UNAVAILABLE and body["error"]["message"].startswith(expected), body
                assert body["error"]["data"] == {"reason": "database_full"}
            health_status, health = await _health(served)
            held_before = len(await _items(served, turn_id))
            await trio.sleep(1.0)
            held_after = len(await _items(served, turn_id))

            await trio.to_thread.run_sync(ballast.unlink)
            await wait_until(lambda: _healthy(served), interval=0.1)
            freed_failed, freed_succeeded = await _calls(client, thread_id, 20, expected)
            assert (freed_failed, freed_succeeded) == (0, 20)
            sent, stored = await _stop_and_check_the_turn(served, stop, turn_id)
            [(integrity,)] = await query(served.db_path, "PRAGMA integrity_check")
            assert integrity == "ok"
            after_status, after = await _health(served)
            # Nothing of the database's trouble is left (the loop may still lag on a busy machine).
            assert after_status == 200 and after["status"] != "failing", after
            assert not any("database" in reason for reason in after["reasons"]), after
            await _sigterm_exits_0(served)
    stderr = served.stderr_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    print(
        f"\n[disk full] health {health_status} {health['status']}: {health['reasons']}; "
        f"calls failed {full_failed}, succeeded {full_succeeded}; items stored meanwhile {held_before} -> {held_after}"
        f"\n[freed] health {after_status} {after['status']}; calls failed {freed_failed}, succeeded {freed_succeeded}; "
        f"provider messages sent {sent}, stored {stored}"
    )


async def test_a_lock_held_by_another_process_past_the_busy_timeout_is_waited_out(tmp_path: Path) -> None:
    """A second process holds BEGIN IMMEDIATE for ~4 s (the daemon's busy timeout: 1 s)
    while a turn streams: the daemon stays up, calls fail with "the database is locked by
    another process" naming it, or wait and succeed; health is failing with that reason; once
    the lock goes, calls succeed and the turn completes with every message stored once."""
    binary, _ = fake_claude(tmp_path, "chunks")
    stop = tmp_path / "stop"
    env = base_env(MISBEHAVING_STOP=str(stop), MISBEHAVING_CHUNK_PAUSE="0.02")
    with trio.fail_after(240):
        async with (
            serve(tmp_path / "state", "--claude-bin", binary, "--sqlite-busy-timeout-ms", "1000", env=env) as served,
            open_ws(served) as client,
        ):
            thread_id, turn_id = await _start_streaming(client, _project(tmp_path))
            await wait_until(lambda: _count_at_least(served, turn_id, 10), interval=0.05)
            async with lock_held_by_another_process(served.db_path) as holder:
                expected = f"the database is locked by another process: pid {holder.pid} "
                await wait_until(lambda: _failing(served, LOCKED, expected), interval=0.1)
                failed, succeeded = await _calls(client, thread_id, 3, expected)
                assert failed >= 1
                health_status, health = await _health(served)
                # Over HTTP: the JSON-RPC envelope on /api/dispatch, 503 with it on a REST route.
                rename = {"jsonrpc": "2.0", "id": 9, "method": "thread.rename", "params": {"thread_id": thread_id, "title": "y"}}
                status, body = await http(served, "POST", "/api/dispatch", rename)  # type: ignore[arg-type]
                assert status == 200 and body["id"] == 9 and body["error"]["code"] == UNAVAILABLE, body
                assert body["error"]["message"].startswith(expected) and body["error"]["data"] == {"reason": "database_busy"}
                status, body = await http(served, "POST", "/api/requests/nope/respond", {"decision": "allow"})  # type: ignore[arg-type]
                assert status == 503 and body["error"]["code"] == UNAVAILABLE, (status, body)
                assert body["error"]["message"].startswith(expected)
                await trio.sleep(1.0)
            await wait_until(lambda: _healthy(served), interval=0.1)
            assert await _calls(client, thread_id, 5, expected) == (0, 5)
            sent, stored = await _stop_and_check_the_turn(served, stop, turn_id)
            await _sigterm_exits_0(served)
    assert "Traceback" not in served.stderr_text()
    print(f"\n[locked] health {health_status} {health['status']}: {health['reasons']}; calls failed {failed}, succeeded {succeeded}; sent {sent}, stored {stored}")


async def _count_at_least(served: Served, turn_id: str, count: int) -> bool:
    rows = await query(served.db_path, "SELECT count(*) FROM items WHERE turn_id = ?", turn_id)
    return bool(rows[0][0] >= count)


async def _failing(served: Served, headline: str, detail: str) -> bool:
    """Health is failing for the database: a reason starting with ``headline`` (it names no
    path or process), and the writer section's whole message starting with ``detail``."""
    status, body = await _health(served)
    return (
        status == 503
        and body["status"] == "failing"
        and any(r.startswith(headline + " (for ") for r in body["reasons"])
        and (body["writer"]["unavailable"] or "").startswith(detail)
    )


async def _healthy(served: Served) -> bool:
    status, body = await _health(served)
    return status == 200 and body["status"] != "failing"


async def test_sigterm_while_the_disk_is_full_still_stops_the_daemon_cleanly(tmp_path: Path) -> None:
    """SIGTERM while provider updates wait for room: the daemon stops within its bounds with
    status 0, logging how many updates could not be written (none was committed, so none
    is lost), and the database opens intact afterwards."""
    binary, _ = fake_claude(tmp_path, "chunks")
    env = base_env(MISBEHAVING_STOP=str(tmp_path / "stop"), MISBEHAVING_CHUNK_PAUSE="0.02")
    with small_tmpfs(tmp_path / "state") as state, trio.fail_after(120):
        async with serve(state, "--claude-bin", binary, env=env) as served, open_ws(served) as client:
            _, turn_id = await _start_streaming(client, _project(tmp_path))
            await wait_until(lambda: _count_at_least(served, turn_id, 10), interval=0.05)
            await trio.to_thread.run_sync(fill, state / "ballast")
            await wait_until(lambda: _failing(served, FULL, "the database is full: free space on "), interval=0.1)
            await _sigterm_exits_0(served)
        assert "could not be written before the database closed" in served.stderr_text()
        assert "Traceback" not in served.stderr_text(), served.stderr_text()[-3000:]
        (state / "ballast").unlink()
        [(integrity,)] = await query(served.db_path, "PRAGMA integrity_check")
        assert integrity == "ok"
