"""Agents across a daemon restart, with real parts: `t3d serve` subprocesses one after the other
on one state dir, the real spawner, and fake CLIs replaying a recording slowly enough that the
restart lands mid-turn.

Three agents: A and B (the replay provider, at 0.15 of the recorded speed) stream their "READ" turn,
and C (the claude provider, run as the fake CLI at full speed) waits on a permission prompt
for its "EDIT" turn. A control run without a restart gives the items and results every turn
must end with.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import http, new_thread, run_turn, wait_until
from reattach_support import Started, answer_in_the_database_only, outcome, wait_terminal
from served import (
    Served,
    alive,
    base_env,
    kill_leftovers,
    open_ws,
    provider_pids,
    query,
    serve,
    wait_gone,
)

import replay_fixtures

READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"
RECORDED_EDIT_REQUEST = "37a06034-d329-44cb-8e0a-b8fa2e8f4446"
SLOW = "0.15"


def flags(window: str = "60") -> tuple[str, ...]:
    return (
        "--replay-fixture", str(replay_fixtures.DEFAULT_FIXTURE),  # (T3D_REPLAY_FIXTURE is C's)
        "--replay-speed", SLOW,
        "--claude-bin", str(replay_fixtures.FAKE_CLAUDE),
        "--agent-reattach-window", window,
        "--checkpoints", "off",
    )


def environment(tmp_path: Path) -> dict[str, str]:
    """Thread C's fake plays a copy of the recording with its own prompt id, at full speed."""
    fixture = tmp_path / "renamed.jsonl"
    text = replay_fixtures.DEFAULT_FIXTURE.read_text()
    fixture.write_text(text.replace(RECORDED_EDIT_REQUEST, "5f0c1d2e-0000-4000-8000-000000000002"))
    return base_env(T3D_REPLAY_FIXTURE=str(fixture), T3D_REPLAY_SPEED="0")


async def start_turns(daemon: Served, project: Path) -> Started:
    """A and B mid-stream in READ, C waiting on EDIT's prompt."""
    started = Started()
    async with open_ws(daemon) as client:
        for role, provider in (("a", "replay"), ("b", "replay"), ("c", "claude")):
            started.threads[role] = await new_thread(client, project, provider=provider)
        assert (await run_turn(client, started.threads["c"], READ)).turn["status"] == "completed"
        started.turns["c"] = (await client.call("turn.start", thread_id=started.threads["c"], text=EDIT))["turn_id"]
        request = await client.wait_event(
            lambda d: d["kind"] == "request.updated" and d["entity"]["turn_id"] == started.turns["c"]
        )
        started.request = request["entity"]["id"]
        streaming: set[str] = set()
        for role in ("a", "b"):
            started.turns[role] = (await client.call("turn.start", thread_id=started.threads[role], text=READ))["turn_id"]
        by_turn = {started.turns[r]: r for r in ("a", "b")}
        while streaming != {"a", "b"}:
            data = await client.wait_event(lambda d: d["kind"] == "item.updated" and d["entity"]["turn_id"] in by_turn)
            if data["entity"]["kind"] == "assistant_message":
                streaming.add(by_turn[data["entity"]["turn_id"]])
    return started


async def answer_and_finish(daemon: Served, started: Started) -> None:
    async with open_ws(daemon) as client:
        await client.call("request.respond", request_id=started.request, decision="allow")
    await wait_terminal(daemon, list(started.turns.values()))


_control: dict[str, Any] = {}


async def control_outcome(tmp_path: Path, project: Path) -> dict[str, Any]:
    """The same turns on a daemon that is never restarted (run once per test session)."""
    if not _control:
        state = tmp_path / "control"
        async with serve(state, *flags(), env=environment(tmp_path)) as daemon:
            started = await start_turns(daemon, project)
            await answer_and_finish(daemon, started)
            _control.update(await outcome(daemon, started))
            pids = await provider_pids(daemon)
        kill_leftovers(pids, state)
    return _control


@pytest.fixture
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One project directory for every run, so paths in the output are the same."""
    path = tmp_path_factory.getbasetemp() / "reattach-project"
    path.mkdir(exist_ok=True)
    (path / "notes.txt").write_text("hello\n")
    return path.resolve()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
async def test_turns_in_flight_carry_on_across_a_restart(tmp_path: Path, project: Path, how: signal.Signals) -> None:
    """A daemon stopped (SIGTERM, or kill -9) with two agents mid-turn and one waiting on a
    permission prompt: its agents keep running under the spawner; the next daemon on the state
    dir reattaches to them (no agent is stopped or started again), the prompt is still pending
    and answering it completes its turn, and every turn ends with the same items, requests and
    result as in a run without the restart."""
    state = tmp_path / "state"
    env = environment(tmp_path)
    pids: list[int] = []
    try:
        with trio.fail_after(150):
            expected = await control_outcome(tmp_path, project)
            async with serve(state, *flags(), env=env) as first:
                started = await start_turns(first, project)
                pids = await provider_pids(first)
                assert len(pids) == 3
                first.process.send_signal(how)
                with trio.fail_after(15):
                    await first.process.wait()
            assert first.process.returncode == (0 if how == signal.SIGTERM else -signal.SIGKILL), first.stderr_text()
            assert all(alive(pid) for pid in pids), "an agent died with its daemon"
            async with serve(state, *flags(), env=env) as second:
                assert "took over 3 agent(s)" in second.stderr_text()
                async with open_ws(second) as client:
                    pending = (await client.call("requests.pending"))["requests"]
                    assert [r["id"] for r in pending] == [started.request]
                    for role in ("a", "b"):
                        snapshot = await client.call("thread.snapshot", thread_id=started.threads[role])
                        [turn] = [t for t in snapshot["turns"] if t["id"] == started.turns[role]]
                        assert turn["status"] in ("running", "completed"), turn
                await answer_and_finish(second, started)
                assert await outcome(second, started) == expected
                assert sorted(await provider_pids(second)) == sorted(pids)  # no agent started anew
                assert all(alive(pid) for pid in pids)  # and none was stopped
                sessions = await query(second.db_path, "SELECT status FROM sessions")
                assert sorted(s for (s,) in sessions) == ["running"] * 3
                async with open_ws(second) as client:  # the taken-over agent takes the next turn
                    await client.call("subscribe.thread", thread_id=started.threads["a"])
                    after = await run_turn(client, started.threads["a"], EDIT)
                    assert after.turn["status"] == "completed" and after.turn["ordinal"] == 2
                assert sorted(await provider_pids(second)) == sorted(pids)
    finally:
        kill_leftovers(pids, state)


async def test_a_daemon_after_the_reattach_window_finds_the_agents_stopped_and_their_turns_closed(
    tmp_path: Path, project: Path
) -> None:
    """With no daemon back within the reattach window, the spawner stops the agents; the
    daemon that starts later closes their turns (`interrupted`, `server_restart`), expires the
    pending prompt, and the threads take new turns."""
    state = tmp_path / "state"
    env = environment(tmp_path)
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            async with serve(state, *flags(window="1"), env=env) as first:
                started = await start_turns(first, project)
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            assert await wait_gone(pids, 20) == []
            async with serve(state, *flags(), env=env) as second, open_ws(second) as client:
                assert (await client.call("requests.pending"))["requests"] == []
                for role, turn_id in started.turns.items():
                    snapshot = await client.call("thread.snapshot", thread_id=started.threads[role])
                    [turn] = [t for t in snapshot["turns"] if t["id"] == turn_id]
                    assert (turn["status"], turn["reason"]) == ("interrupted", "server_restart"), (role, turn)
                [(status,)] = await query(second.db_path, "SELECT status FROM requests WHERE id = ?", started.request)
                assert status == "expired"
                await client.call("subscribe.thread", thread_id=started.threads["c"])
                after = await run_turn(client, started.threads["c"], "Say ok")
                assert after.turn["status"] == "completed"
                pids += await provider_pids(second)
    finally:
        kill_leftovers(pids, state)


async def test_a_killed_spawner_stops_its_agents_and_the_daemon_carries_on(tmp_path: Path, project: Path) -> None:
    """SIGKILL to the spawner while agents run: they are stopped (nothing relays their output
    any more), their turns get terminal records (`failed`, `spawner_lost`), the daemon keeps
    serving and restarts the spawner, and the next turn works."""
    state = tmp_path / "state"
    env = environment(tmp_path)
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            async with serve(state, *flags(), env=env) as daemon:
                started = await start_turns(daemon, project)
                pids = await provider_pids(daemon)
                status, spawner = await http(daemon, "GET", "/api/spawner")
                assert status == 200
                old_pid = spawner["pid"]
                signal_pid(old_pid, signal.SIGKILL)
                assert await wait_gone(pids, 20) == []
                await wait_terminal(daemon, list(started.turns.values()))
                async with open_ws(daemon) as client:
                    for role, turn_id in started.turns.items():
                        snapshot = await client.call("thread.snapshot", thread_id=started.threads[role])
                        [turn] = [t for t in snapshot["turns"] if t["id"] == turn_id]
                        assert (turn["status"], turn["reason"]) == ("failed", "spawner_lost"), (role, turn)
                        assert "the spawner died" in turn["error"]
                    assert (await client.call("requests.pending"))["requests"] == []
                    status, spawner = await http(daemon, "GET", "/api/spawner")
                    assert status == 200 and spawner["pid"] != old_pid and spawner["restarts"] == 1
                    await client.call("subscribe.thread", thread_id=started.threads["c"])
                    after = await run_turn(client, started.threads["c"], "Say ok")
                    assert after.turn["status"] == "completed"
                    status, health = await http(daemon, "GET", "/api/health", token=False)
                    assert status == 200, health
                pids += await provider_pids(daemon)
    finally:
        kill_leftovers(pids, state)


def signal_pid(pid: int, sig: signal.Signals) -> None:
    os.kill(pid, sig)


async def test_an_answer_the_cli_never_read_is_sent_again_after_the_restart(tmp_path: Path, project: Path) -> None:
    """The daemon died after a prompt's answer was committed (its effect marked handed over)
    but before the answer reached the CLI: the next daemon sees in the replay that the CLI
    still waits on the prompt (no tool result after it), sends the answer again, and the turn
    ends as it does without the restart."""
    state = tmp_path / "state"
    env = environment(tmp_path)
    pids: list[int] = []
    try:
        with trio.fail_after(150):
            expected = await control_outcome(tmp_path, project)
            async with serve(state, *flags(), env=env) as first:
                started = await start_turns(first, project)
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            await answer_in_the_database_only(state / "t3d.sqlite", started.request)
            async with serve(state, *flags(), env=env) as second:
                await wait_terminal(second, list(started.turns.values()))
                assert "answering request" in second.stderr_text()
                got = await outcome(second, started)
                assert got["<c:2>"] == expected["<c:2>"]
                assert got == expected
    finally:
        kill_leftovers(pids, state)


async def test_a_turn_whose_output_passed_the_replay_buffer_carries_on_from_the_live_point(
    tmp_path: Path, project: Path
) -> None:
    """With a spawner whose replay buffer is smaller than a turn's output, a restart mid-turn
    cannot replay the turn from its start: the new daemon reads on from the live point, keeps
    what was committed, records the gap as an error item in the turn, and the turn completes."""
    state = tmp_path / "state"
    state.mkdir(parents=True)
    env = environment(tmp_path)
    socket_path = state / "spawner.sock"
    spawner = await trio.lowlevel.open_process(
        [sys.executable, "-m", "spawner", "--socket", str(socket_path), "--replay-buffer", "1024", "--orphan-grace", "60"],
        env=env,
    )
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            await wait_until(socket_path.exists)
            async with serve(state, *flags(), env=env) as first:
                started = await start_turns(first, project)
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            async with serve(state, *flags(), env=env) as second:
                await answer_and_finish(second, started)
                assert "were dropped" in second.stderr_text()
                got = await outcome(second, started)
                for role in ("a", "b"):
                    turn = got[f"<{role}:1>"]
                    assert turn["turn"]["status"] == "completed", turn
                    [gap] = [i for i in turn["items"] if i["kind"] == "error"]
                    assert gap["title"] == "Output lost across a daemon restart"
                    assert gap["data"]["lost_bytes"] > 0
                assert got["<c:2>"]["turn"]["status"] == "completed"
    finally:
        kill_leftovers(pids, state)
        spawner.kill()
        await spawner.wait()
