"""Codex agents across a daemon restart, with real parts: `t3d serve` subprocesses one after the
other on one state dir, the real spawner, and the fake ``codex app-server`` replaying the bundled
multi-turn recording slowly enough that the restart lands mid-turn.

Most tests run three agents: A and B (the replay-codex provider, at 0.05 of the recorded speed)
stream their "ping" turn, and C (the codex provider, run as the fake at full speed) waits on the
command approval of its "Please run SHELL" turn. A control run without a restart gives the items,
requests and results every turn must end with. Every fake appends what it reads on stdin to one
host log, which shows what t3d sent each app-server (and what it did not send again).
"""

from __future__ import annotations

import json
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

PING, SHELL, PATCH = "ping", "Please run SHELL", "Please PATCH"
SLOW = "0.05"


def flags(window: str = "60", codex_bin: Path = replay_fixtures.FAKE_CODEX) -> tuple[str, ...]:
    return (
        "--replay-speed", SLOW,  # replay-codex's pace (C's fake reads T3D_REPLAY_SPEED)
        "--codex-bin", str(codex_bin),
        "--agent-reattach-window", window,
        "--checkpoints", "off",
    )  # fmt: skip


def environment(log: Path) -> dict[str, str]:
    return base_env(T3D_REPLAY_SPEED="0", T3D_REPLAY_HOST_LOG=str(log))


def host_messages(log: Path) -> list[dict[str, Any]]:
    """What the daemons wrote to every fake, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def sent(log: Path, method: str) -> list[dict[str, Any]]:
    return [m for m in host_messages(log) if m.get("method") == method]


def turn_start_id(log: Path, text: str) -> int:
    (request,) = [m for m in sent(log, "turn/start") if m["params"]["input"][0]["text"] == text]
    return int(request["id"])


async def start_turns(daemon: Served, project: Path) -> Started:
    """A and B mid-stream in "ping", C waiting on the approval of "Please run SHELL"."""
    started = Started()
    async with open_ws(daemon) as client:
        for role, provider in (("a", "replay-codex"), ("b", "replay-codex"), ("c", "codex")):
            started.threads[role] = await new_thread(client, project, provider=provider)
        assert (await run_turn(client, started.threads["c"], PING)).turn["status"] == "completed"
        started.turns["c"] = (await client.call("turn.start", thread_id=started.threads["c"], text=SHELL))["turn_id"]
        request = await client.wait_event(
            lambda d: d["kind"] == "request.updated" and d["entity"]["turn_id"] == started.turns["c"]
        )
        started.request = request["entity"]["id"]
        for role in ("a", "b"):
            started.turns[role] = (await client.call("turn.start", thread_id=started.threads[role], text=PING))["turn_id"]
        by_turn = {started.turns[r]: r for r in ("a", "b")}
        streaming: set[str] = set()
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
        async with serve(state, *flags(), env=environment(tmp_path / "control-host.jsonl")) as daemon:
            started = await start_turns(daemon, project)
            await answer_and_finish(daemon, started)
            _control.update(await outcome(daemon, started))
            pids = await provider_pids(daemon)
        kill_leftovers(pids, state)
    return _control


@pytest.fixture
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One project directory for every run, so paths in the output are the same."""
    path = tmp_path_factory.getbasetemp() / "codex-reattach-project"
    path.mkdir(exist_ok=True)
    (path / "README.md").write_text("hello\n")
    return path.resolve()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
async def test_codex_turns_in_flight_carry_on_across_a_restart(tmp_path: Path, project: Path, how: signal.Signals) -> None:
    """A daemon stopped (SIGTERM, or kill -9) with two Codex agents mid-turn and one waiting on
    an approval: the agents keep running under the spawner; the next daemon reattaches to them
    without a new handshake or turn/start (no agent is stopped or started again), the approval
    is still pending and answering it completes its turn, every turn ends with the same items,
    requests and result as in a run without the restart, and a taken-over app-server takes the
    next turn with a JSON-RPC id above every id the previous daemon used."""
    state, log = tmp_path / "state", tmp_path / "host.jsonl"
    env = environment(log)
    pids: list[int] = []
    try:
        with trio.fail_after(180):
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
                # One handshake per agent, one turn/start per turn: nothing was sent again.
                assert len(sent(log, "initialize")) == 3 and len(sent(log, "thread/start")) == 3
                assert sent(log, "thread/resume") == []
                assert len(sent(log, "turn/start")) == 4
                async with open_ws(second) as client:  # the taken-over agent takes the next turn
                    await client.call("subscribe.thread", thread_id=started.threads["c"])
                    after = await run_turn(client, started.threads["c"], PATCH)
                    assert after.turn["status"] == "completed" and after.turn["ordinal"] == 3
                    assert after.assistant_text == ["Done. Tool output was: unsupported call: apply_patch"]
                assert turn_start_id(log, PATCH) > turn_start_id(log, SHELL)
                assert sorted(await provider_pids(second)) == sorted(pids)
    finally:
        kill_leftovers(pids, state)


async def test_a_daemon_after_the_reattach_window_finds_the_codex_agents_stopped_and_their_turns_closed(
    tmp_path: Path, project: Path
) -> None:
    """With no daemon back within the reattach window, the spawner stops the Codex agents; the
    daemon that starts later closes their turns (`interrupted`, `server_restart`), expires the
    pending approval, and a thread's next turn starts a new app-server that resumes its Codex
    thread."""
    state, log = tmp_path / "state", tmp_path / "host.jsonl"
    env = environment(log)
    pids: list[int] = []
    try:
        with trio.fail_after(120):
            async with serve(state, *flags(window="1"), env=env) as first:
                started = await start_turns(first, project)
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            assert await wait_gone(pids, 20) == []
            async with serve(state, *flags(), env=env) as second, open_ws(second) as client:
                assert "took over" not in second.stderr_text()
                assert (await client.call("requests.pending"))["requests"] == []
                for role, turn_id in started.turns.items():
                    snapshot = await client.call("thread.snapshot", thread_id=started.threads[role])
                    [turn] = [t for t in snapshot["turns"] if t["id"] == turn_id]
                    assert (turn["status"], turn["reason"]) == ("interrupted", "server_restart"), (role, turn)
                [(status,)] = await query(second.db_path, "SELECT status FROM requests WHERE id = ?", started.request)
                assert status == "expired"
                await client.call("subscribe.thread", thread_id=started.threads["c"])
                after = await run_turn(client, started.threads["c"], PATCH)
                assert after.turn["status"] == "completed"
                [resumed] = sent(log, "thread/resume")
                assert resumed["params"]["threadId"] in {m["params"].get("threadId") for m in sent(log, "turn/start")}
                pids += await provider_pids(second)
    finally:
        kill_leftovers(pids, state)


async def test_an_approval_answer_codex_never_read_is_sent_again_after_the_restart(tmp_path: Path, project: Path) -> None:
    """The daemon died after an approval's answer was committed (its effect marked handed over)
    but before the answer reached Codex: the next daemon sees in the replay that Codex still
    waits on the request (no serverRequest/resolved after it), sends the answer again under
    Codex's own request id, and the turn ends as it does without the restart."""
    state, log = tmp_path / "state", tmp_path / "host.jsonl"
    env = environment(log)
    pids: list[int] = []
    try:
        with trio.fail_after(180):
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
        answers = [m for m in host_messages(log) if "result" in m and "method" not in m]
        assert answers == [{"jsonrpc": "2.0", "id": 0, "result": {"decision": "accept"}}]
    finally:
        kill_leftovers(pids, state)


async def test_a_codex_turn_whose_output_passed_the_replay_buffer_carries_on_from_the_live_point(
    tmp_path: Path, project: Path
) -> None:
    """With a spawner whose replay buffer is smaller than a turn's output, a restart mid-turn
    cannot replay the turn from its start: the new daemon reads on from the live point, keeps
    what was committed, records the gap as an error item in the turn, and the turn completes;
    the pending approval, rebuilt from the database, still reaches Codex when answered."""
    state, log = tmp_path / "state", tmp_path / "host.jsonl"
    state.mkdir(parents=True)
    env = environment(log)
    socket_path = state / "spawner.sock"
    spawner = await trio.lowlevel.open_process(
        [sys.executable, "-m", "spawner", "--socket", str(socket_path), "--replay-buffer", "1024", "--orphan-grace", "60"],
        env=env,
    )
    pids: list[int] = []
    try:
        with trio.fail_after(120):
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
                    gaps = [i for i in turn["items"] if i["title"] == "Output lost across a daemon restart"]
                    assert len(gaps) == 1 and gaps[0]["kind"] == "error" and gaps[0]["data"]["lost_bytes"] > 0
                    [message] = [i for i in turn["items"] if i["kind"] == "assistant_message"]
                    assert message["text"] == "pong from the mock model" and message["status"] == "completed"
                assert got["<c:2>"]["turn"]["status"] == "completed"
                assert [r["status"] for r in got["<c:2>"]["requests"]] == ["resolved"]
    finally:
        kill_leftovers(pids, state)
        spawner.kill()
        await spawner.wait()


async def test_a_killed_spawner_fails_the_codex_turns_and_the_daemon_carries_on(tmp_path: Path, project: Path) -> None:
    """SIGKILL to the spawner while Codex agents run: they are stopped (nothing relays their
    output any more), their turns fail with reason `spawner_lost`, the pending approval is
    closed with its turn, the daemon restarts the spawner, and the next turn works."""
    state = tmp_path / "state"
    pids: list[int] = []
    try:
        with trio.fail_after(120):
            async with serve(state, *flags(), env=environment(tmp_path / "host.jsonl")) as daemon:
                started = await start_turns(daemon, project)
                pids = await provider_pids(daemon)
                status, spawner = await http(daemon, "GET", "/api/spawner")
                assert status == 200
                os.kill(spawner["pid"], signal.SIGKILL)
                assert await wait_gone(pids, 20) == []
                await wait_terminal(daemon, list(started.turns.values()))
                async with open_ws(daemon) as client:
                    for role, turn_id in started.turns.items():
                        snapshot = await client.call("thread.snapshot", thread_id=started.threads[role])
                        [turn] = [t for t in snapshot["turns"] if t["id"] == turn_id]
                        assert (turn["status"], turn["reason"]) == ("failed", "spawner_lost"), (role, turn)
                        assert "the spawner died" in turn["error"]
                    assert (await client.call("requests.pending"))["requests"] == []
                    status, restarted = await http(daemon, "GET", "/api/spawner")
                    assert status == 200 and restarted["pid"] != spawner["pid"]
                    await client.call("subscribe.thread", thread_id=started.threads["c"])
                    after = await run_turn(client, started.threads["c"], PATCH)
                    assert after.turn["status"] == "completed"
                pids += await provider_pids(daemon)
    finally:
        kill_leftovers(pids, state)


async def test_a_taken_over_codex_turn_is_interrupted_with_codexs_own_ids(tmp_path: Path, project: Path) -> None:
    """kill -9 while a Codex turn streams (the recording's slow count, which runs until it is
    interrupted): after the takeover, turn.interrupt reaches Codex as turn/interrupt naming the
    Codex thread and turn the replay showed, under an id above every earlier one, Codex honours
    it (the turn ends `interrupted`, reason `interrupt`, not stopped at the interrupt timeout),
    and the agent goes on to the next turn."""
    state, log = tmp_path / "state", tmp_path / "host.jsonl"
    env = environment(log)
    pids: list[int] = []
    try:
        with trio.fail_after(120):
            async with serve(state, *flags(), env=env) as first, open_ws(first) as client:
                thread_id = await new_thread(client, project, provider="codex")
                for text in (PING, SHELL, PATCH):  # the fake plays the recorded turns in order
                    assert (await run_turn(client, thread_id, text)).turn["status"] == "completed"
                turn_id = (await client.call("turn.start", thread_id=thread_id, text="SLOW count please"))["turn_id"]
                await client.wait_event(
                    lambda d: d["entity"].get("turn_id") == turn_id and d["entity"].get("kind") == "assistant_message"
                )
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            async with serve(state, *flags(), env=env) as second, open_ws(second) as client:
                assert "took over 1 agent(s)" in second.stderr_text()
                await client.call("subscribe.thread", thread_id=thread_id)
                await client.call("turn.interrupt", thread_id=thread_id)
                await wait_terminal(second, [turn_id])
                [(body,)] = await query(second.db_path, "SELECT body FROM turns WHERE id = ?", turn_id)
                turn = json.loads(body)
                assert (turn["status"], turn["reason"]) == ("interrupted", "interrupt"), turn
                after = await run_turn(client, thread_id, "ping again")
                assert after.turn["status"] == "completed"
                assert await provider_pids(second) == pids
        [interrupt] = sent(log, "turn/interrupt")
        slow_start = [m for m in sent(log, "turn/start") if m["params"]["input"][0]["text"].startswith("SLOW")]
        assert interrupt["params"]["threadId"] == slow_start[0]["params"]["threadId"]
        assert interrupt["id"] > slow_start[0]["id"]
    finally:
        kill_leftovers(pids, state)


async def test_an_app_server_left_before_its_handshake_is_replaced_and_the_turn_runs_on_a_new_one(
    tmp_path: Path, project: Path
) -> None:
    """The daemon was killed while its new app-server had not yet answered ``initialize``: the
    next daemon finds the process with no Codex thread in its meta, stops it (it cannot take it
    over), and runs the open turn on a new app-server, where it ends as a turn that never saw a
    restart does."""
    state, log, gate = tmp_path / "state", tmp_path / "host.jsonl", tmp_path / "gate"
    wrapper = tmp_path / "slow-codex"
    wrapper.write_text(
        f'#!/bin/sh\nwhile [ ! -e "{gate}" ]; do sleep 0.05; done\nexec "{replay_fixtures.FAKE_CODEX}" "$@"\n'
    )
    wrapper.chmod(0o755)
    env = environment(log)
    options = flags(codex_bin=wrapper)
    pids: list[int] = []
    try:
        with trio.fail_after(120):
            async with serve(state, *options, env=env) as first, open_ws(first) as client:
                thread_id = await new_thread(client, project, provider="codex")
                turn_id = (await client.call("turn.start", thread_id=thread_id, text=PING))["turn_id"]
                await wait_until(lambda: provider_pids(first))
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            assert all(alive(pid) for pid in pids)  # the spawner kept it
            gate.touch()
            async with serve(state, *options, env=env) as second:
                await wait_terminal(second, [turn_id])
                assert "left before its handshake finished" in second.stderr_text()
                assert await wait_gone(pids, 20) == []
                async with open_ws(second) as client:
                    control_thread = await new_thread(client, project, provider="codex")
                    assert (await run_turn(client, control_thread, PING)).turn["status"] == "completed"
                restarted, control = Started(), Started()
                restarted.threads["c"], control.threads["c"] = thread_id, control_thread
                got, expected = await outcome(second, restarted), await outcome(second, control)
                assert got["<c:1>"]["turn"]["status"] == "completed"
                assert got == expected
                pids += await provider_pids(second)
        assert len(sent(log, "turn/start")) == 2  # the restarted turn once, the control's once
        assert sent(log, "thread/resume") == []  # the first process never named a Codex thread
    finally:
        gate.touch()
        kill_leftovers(pids, state)
