"""`t3d serve` as a real subprocess: crash recovery, graceful stop, start-up errors.

The daemon runs as ``python -m t3d serve --port 0`` (tests/served.py). The replay fake
waits at its recorded interrupt point for up to T3D_REPLAY_INTERRUPT_TIMEOUT
(60 s here), so "COUNT to 200 slowly" is reliably mid-turn when the daemon is
killed.
"""

from __future__ import annotations

import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import trio
from harness import new_thread, run_turn
from served import alive, base_env, kill_leftovers, open_ws, provider_pids, query, serve, wait_gone

import replay_fixtures

READ, EDIT, BASH, COUNT = (
    "Please READ notes.txt",
    "Now EDIT notes.txt",
    "Now run BASH to create a file",
    "COUNT to 200 slowly",
)
# The recorded can_use_tool id of turn 2, the same in every replay of the default fixture.
RECORDED_EDIT_REQUEST = "37a06034-d329-44cb-8e0a-b8fa2e8f4446"


def write_renamed_fixture(path: Path) -> None:
    """The default fixture with another id for turn 2's prompt: thread B replays it through the
    claude provider, so the crash covers both providers and does not depend on how prompt ids
    of identical recordings are scoped (see test_api.py's two-threads test)."""
    text = replay_fixtures.DEFAULT_FIXTURE.read_text()
    path.write_text(text.replace(RECORDED_EDIT_REQUEST, "5f0c1d2e-0000-4000-8000-000000000002"))


async def test_kill_9_mid_turn_loses_nothing_and_recovers(tmp_path: Path) -> None:
    """kill -9 while turn 4 ("COUNT to 200 slowly") streams and another thread's turn waits on a
    permission prompt, with a reattach window of 0 (agents stop with their daemon): after a
    restart on the same state dir every event a subscriber saw is in the database with the
    same payload, PRAGMA integrity_check is ok, both open turns are ``interrupted`` with reason
    ``server_restart``, the pending request is ``expired``, nothing is pending, and a new turn on
    the killed thread completes. (Agents that outlive their daemon: tests/test_reattach.py.)"""
    state = tmp_path / "state"
    fixture_b = tmp_path / "renamed.jsonl"
    write_renamed_fixture(fixture_b)
    # Thread A: the replay provider on the default fixture. Thread B: the claude provider, run
    # as the fake CLI on the renamed copy (T3D_REPLAY_FIXTURE reaches only the fake: the
    # daemon's own replay fixture is set by flag, which wins).
    flags = (
        "--replay-fixture",
        str(replay_fixtures.DEFAULT_FIXTURE),
        "--claude-bin",
        str(replay_fixtures.FAKE_CLAUDE),
        "--agent-reattach-window",
        "0",
    )
    env = base_env(T3D_REPLAY_FIXTURE=str(fixture_b), T3D_REPLAY_SPEED="0")
    seen: list[dict[str, Any]] = []
    pids: list[int] = []
    try:
        with trio.fail_after(40):
            async with (
                serve(state, *flags, env=env) as daemon,
                open_ws(daemon) as actor,
                open_ws(daemon) as watcher,
            ):
                thread_a = await new_thread(actor, tmp_path)
                thread_b = await new_thread(actor, tmp_path, provider="claude")
                for thread_id in (thread_a, thread_b):
                    await watcher.call("subscribe.thread", thread_id=thread_id)
                for text in (READ, EDIT, BASH):
                    assert (await run_turn(actor, thread_a, text)).turn["status"] == "completed"
                assert (await run_turn(actor, thread_b, READ)).turn["status"] == "completed"
                turn_b = (await actor.call("turn.start", thread_id=thread_b, text=EDIT))["turn_id"]
                await actor.wait_event(
                    lambda d: d["kind"] == "request.updated" and d["entity"]["turn_id"] == turn_b
                )
                turn_a = (await actor.call("turn.start", thread_id=thread_a, text=COUNT))["turn_id"]

                # Everything the watcher gets, until turn 4's answer has streamed to "19".
                while True:
                    note = await watcher.next_notification()
                    if note["kind"] != "event":
                        continue
                    seen.append(note["data"])
                    entity = note["data"]["entity"]
                    if entity.get("turn_id") == turn_a and (entity.get("text") or "").endswith(
                        "19\n"
                    ):
                        break
                pids = await provider_pids(daemon)
                assert len(pids) == 2
                daemon.process.send_signal(signal.SIGKILL)
                await daemon.process.wait()
            assert daemon.process.returncode == -signal.SIGKILL

            async with serve(state, *flags, env=env) as daemon:
                # The spawner stopped the agents when their daemon went (a window of 0);
                # restart recovery gave their turns their records.
                assert await wait_gone(pids, 5) == []
                rows = await query(daemon.db_path, "SELECT sequence, kind, payload FROM events")
                stored = {
                    seq: {"kind": kind, "sequence": seq, "entity": orjson.loads(payload)}
                    for seq, kind, payload in rows
                }
                assert len(seen) > 40
                assert [stored.get(event["sequence"]) for event in seen] == seen
                assert await query(daemon.db_path, "PRAGMA integrity_check") == [("ok",)]
                [(request_status,)] = await query(
                    daemon.db_path, "SELECT status FROM requests WHERE turn_id = ?", turn_b
                )
                assert request_status == "expired"

                async with open_ws(daemon) as client:
                    assert (await client.call("requests.pending"))["requests"] == []
                    for thread_id, turn_id in ((thread_a, turn_a), (thread_b, turn_b)):
                        snapshot = await client.call("thread.snapshot", thread_id=thread_id)
                        [turn] = [t for t in snapshot["turns"] if t["id"] == turn_id]
                        assert (turn["status"], turn["reason"]) == ("interrupted", "server_restart")
                        assert snapshot["thread"]["status"] == "idle"
                        assert snapshot["requests"] == []
                    await client.call("subscribe.thread", thread_id=thread_a)
                    after = await run_turn(client, thread_a, "Say ok")
                    assert after.turn["status"] == "completed"
                    assert after.turn["ordinal"] == 5
                    pids += await provider_pids(daemon)
    finally:
        kill_leftovers(pids, state)


async def test_sigterm_stops_cleanly_and_leaves_the_agents_for_the_reattach_window(tmp_path: Path) -> None:
    """SIGTERM, while a turn waits on a permission prompt, makes `t3d serve` exit with status 0
    within a few seconds, logging why; its agent keeps running under the spawner, and with no
    daemon back it is stopped once the reattach window (2 s here) has passed."""
    pids: list[int] = []
    try:
        with trio.fail_after(30):
            async with serve(tmp_path / "state", "--agent-reattach-window", "2") as daemon:
                async with open_ws(daemon) as client:
                    thread_id = await new_thread(client, tmp_path)
                    assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
                    await client.call("turn.start", thread_id=thread_id, text=EDIT)
                    await client.wait_event(lambda d: d["kind"] == "request.updated")
                    pids = await provider_pids(daemon)
                    assert len(pids) == 1 and alive(pids[0])
                    daemon.process.send_signal(signal.SIGTERM)
                    with trio.fail_after(8):
                        await daemon.process.wait()
                assert daemon.process.returncode == 0, daemon.stderr_text()
                assert "received SIGTERM; shutting down" in daemon.stderr_text()
                assert "left its replay process" in daemon.stderr_text()
                assert alive(pids[0])
                assert await wait_gone(pids, 10) == []
    finally:
        kill_leftovers(pids, tmp_path / "state")


async def test_sigterm_with_many_sessions_exits_cleanly(tmp_path: Path) -> None:
    """SIGTERM with many live sessions exits 0, and with a reattach window of 0 every provider
    goes with it. (A benchmark saw `t3d serve` exit 1 with a KeyError when sessions ended while
    `stop_all` awaited; the race itself depends on timing this test does not force.)"""
    pids: list[int] = []
    try:
        with trio.fail_after(40):
            async with serve(tmp_path / "state", "--agent-reattach-window", "0") as daemon, open_ws(daemon) as client:
                for _ in range(10):
                    thread_id = await new_thread(client, tmp_path)
                    assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
                pids = await provider_pids(daemon)
                daemon.process.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    await daemon.process.wait()
            assert daemon.process.returncode == 0, daemon.stderr_text()
            assert await wait_gone(pids, 2) == []
    finally:
        kill_leftovers(pids)


async def test_bad_settings_and_a_busy_port_fail_start_up_clearly(tmp_path: Path) -> None:
    """Invalid settings (also a ~user state dir for an unknown user) end `t3d serve` with status
    2 and a message naming the setting, the bad value and what is allowed, never a traceback; a port already in use ends it with status 1 and a message that
    names the address and what to do."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    busy = listener.getsockname()[1]
    cases = [
        (["--port", "99999"], {}, 2, ["--port", "99999", "0 to 65535"]),
        ([], {"T3D_PORT": "abc"}, 2, ["T3D_PORT", "abc", "0 to 65535"]),
        ([], {"T3D_SQLITE_READER_POOL": "0"}, 2, ["T3D_SQLITE_READER_POOL", "'0'", "1 to 32"]),
        ([], {"T3D_EFFECT_ADMISSION_DELAY_MS": "10"}, 2, ["T3D_EFFECT_ADMISSION_DELAY_MS", "'10'", "0 (off) or 30 to 60000"]),
        ([], {"T3D_MAX_ACTIVE_TURNS": "-1"}, 2, ["T3D_MAX_ACTIVE_TURNS", "'-1'", "0 to 100000"]),
        ([], {"T3D_PROCESS_SPAWNER": "maybe"}, 2, ["T3D_PROCESS_SPAWNER", "'maybe'", "auto, required, off"]),
        (["--log-level", "loud"], {}, 2, ["--log-level", "loud", "debug, info, warning, error"]),
        (
            ["--state-dir", "~t3d-no-such-user/s"],
            {},
            2,
            ["--state-dir", "~t3d-no-such-user", "absolute path"],
        ),
        (
            ["--port", str(busy)],
            {},
            1,
            [f"127.0.0.1:{busy}", "already in use", "pick another --port"],
        ),
    ]
    results: dict[int, subprocess.CompletedProcess[bytes]] = {}

    async def start(n: int, flags: list[str], env: dict[str, str]) -> None:
        argv = [
            sys.executable,
            "-m",
            "t3d",
            "serve",
            "--state-dir",
            str(tmp_path / f"state{n}"),
            *flags,
        ]
        results[n] = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, check=False, env=base_env(**env)
        )

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n, (flags, env, _, _) in enumerate(cases):
                    nursery.start_soon(start, n, flags, env)
    finally:
        listener.close()
    for n, (flags, env, status, words) in enumerate(cases):
        stderr = results[n].stderr.decode()
        assert results[n].returncode == status, (flags, env, stderr)
        for word in words:
            assert word in stderr, (flags, env, word, stderr)
        assert "Traceback" not in stderr


async def test_default_state_dir_follows_xdg_state_home(tmp_path: Path) -> None:
    """Without --state-dir or T3D_STATE_DIR the daemon keeps its state in
    $XDG_STATE_HOME/t3d: the token lands in auth/token with mode 0600 (directory 0700)."""
    xdg = tmp_path / "xdg"
    with trio.fail_after(20):
        async with serve(None, env=base_env(XDG_STATE_HOME=str(xdg))) as daemon:
            token = xdg / "t3d" / "auth" / "token"
            assert str(token) in daemon.stderr_text()
            assert stat.S_IMODE(token.stat().st_mode) == 0o600
            assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
            assert len(token.read_text().strip()) >= 32
            assert (xdg / "t3d" / "t3d.sqlite").exists()
            daemon.process.send_signal(signal.SIGTERM)
            with trio.fail_after(8):
                await daemon.process.wait()
            assert daemon.process.returncode == 0
