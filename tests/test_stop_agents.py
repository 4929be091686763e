"""Stopping everything on purpose, and not stopping agents by accident (issue 16, point 2).

`t3d ctl shutdown --stop-agents` and Ctrl-C in the daemon's terminal are the explicit ways to
stop every agent: with turns mid-stream, the agents' processes are gone and every turn has a
terminal record once the daemon has exited (not only at the next start). A daemon that dies
because its database writer is lost does not stop its agents: the next daemon on the state
dir reattaches and the turns complete.

Real parts: `t3d serve` subprocesses (tests/served.py), one run in a real pseudo-terminal
(tests/pty_support.py), the real spawner, and the replay fake CLI at 0.05 of the recorded
speed so that the stop lands mid-turn. The writer is lost in a `t3d serve` run through
tests/fixtures/writer_loss_t3d.py, which on SIGUSR1 hands the writer thread something that
is not a job, as a bug would (as tests/test_store_batching.py does in-process).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import trio
from harness import TERMINAL, TEST_FIXTURES, RpcClient, new_thread, wait_until
from pty_support import open_pty
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

T3D = str(Path(sys.executable).parent / "t3d")
READ = "Please READ notes.txt"
SLOW = "0.05"  # a READ turn takes about 30 s: the stop lands mid-turn even on a loaded machine
AGENTS = 2


def flags() -> tuple[str, ...]:
    return ("--replay-fixture", str(replay_fixtures.DEFAULT_FIXTURE), "--replay-speed", SLOW, "--checkpoints", "off")


def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir(exist_ok=True)
    (path / "notes.txt").write_text("hello\n")
    return path.resolve()


async def start_streaming(client: RpcClient, tmp_path: Path, count: int = AGENTS) -> list[str]:
    """``count`` replay threads, each with a READ turn whose assistant text is streaming."""
    turns: list[str] = []
    for _ in range(count):
        thread_id = await new_thread(client, project(tmp_path))
        turns.append((await client.call("turn.start", thread_id=thread_id, text=READ))["turn_id"])
    streaming: set[str] = set()
    while streaming != set(turns):
        data = await client.wait_event(lambda d: d["kind"] == "item.updated" and d["entity"]["turn_id"] in turns)
        if data["entity"]["kind"] == "assistant_message" and data["entity"]["status"] == "streaming":
            streaming.add(data["entity"]["turn_id"])
    return turns


async def turn_records(db: Path, turn_ids: list[str]) -> list[dict[str, Any]]:
    marks = ",".join("?" * len(turn_ids))
    rows = await query(db, f"SELECT body FROM turns WHERE id IN ({marks})", *turn_ids)
    return [orjson.loads(body) for (body,) in rows]


async def assert_stopped_with_records(daemon: Served, turn_ids: list[str], pids: list[int]) -> None:
    """The agents are gone (bounded wait), and the database the daemon left, read before any
    other daemon starts, has every turn terminal."""
    assert len(pids) == len(turn_ids), pids
    assert await wait_gone(pids, 15) == [], "agents still running after --stop-agents / Ctrl-C"
    turns = await turn_records(daemon.db_path, turn_ids)
    assert len(turns) == len(turn_ids)
    for turn in turns:
        assert turn["status"] in TERMINAL and turn["status"] != "completed", turn
        assert turn["reason"] == "server_shutdown" and turn["completed_at"] is not None, turn


async def test_ctl_shutdown_stop_agents_stops_agents_mid_turn_and_closes_their_turns(tmp_path: Path) -> None:
    """`t3d ctl shutdown --stop-agents` while two agents stream a turn: ctl exits 0, the daemon
    exits 0, both agents' processes are gone within seconds, and once the daemon has exited
    its database already shows both turns ended (terminal, not completed), without waiting
    for the next daemon's restart recovery."""
    state = tmp_path / "state"
    pids: list[int] = []
    try:
        with trio.fail_after(120):
            async with serve(state, *flags()) as daemon:
                async with open_ws(daemon) as client:
                    turn_ids = await start_streaming(client, tmp_path)
                    pids = await provider_pids(daemon)
                    assert all(alive(pid) for pid in pids), pids
                done = await trio.run_process(
                    [T3D, "ctl", "--state-dir", str(state), "shutdown", "--stop-agents"],
                    capture_stdout=True, capture_stderr=True, check=False, env=base_env(),
                )  # fmt: skip
                assert done.returncode == 0, done.stderr.decode()
                with trio.fail_after(30):
                    await daemon.process.wait()
                assert daemon.process.returncode == 0, daemon.stderr_text()
                assert "stopping every agent" in daemon.stderr_text()
                await assert_stopped_with_records(daemon, turn_ids, pids)
    finally:
        kill_leftovers(pids, state)


async def test_ctrl_c_in_the_daemons_terminal_stops_agents_mid_turn_and_closes_their_turns(tmp_path: Path) -> None:
    """Ctrl-C typed in the terminal `t3d serve` runs in (a real pty, the daemon its session's
    foreground process): the daemon says it stops every agent and exits 0, both agents that
    were streaming a turn are gone within seconds, and every turn has a terminal record once
    the daemon has exited."""
    state = tmp_path / "state"
    pids: list[int] = []
    argv = [sys.executable, "-m", "t3d", "serve", "--port", "0", "--state-dir", str(state), *flags()]
    try:
        with trio.fail_after(120):
            async with open_pty(argv, env=base_env()) as terminal:
                port = int((await terminal.expect(r"t3d serving on http://127\.0\.0\.1:(\d+)")).group(1))
                daemon = Served(terminal.process, state, port=port)
                async with open_ws(daemon) as client:
                    turn_ids = await start_streaming(client, tmp_path)
                    pids = await provider_pids(daemon)
                    assert all(alive(pid) for pid in pids), pids
                terminal.type("\x03")
                status = await terminal.wait(30)
                assert status == 0, terminal.text
                assert "received SIGINT (Ctrl-C); shutting down and stopping every agent" in terminal.text
                await assert_stopped_with_records(daemon, turn_ids, pids)
    finally:
        kill_leftovers(pids, state)


async def test_a_daemon_whose_writer_is_lost_leaves_its_agents_for_the_next_daemon(tmp_path: Path) -> None:
    """A `t3d serve` whose database writer thread dies while an agent streams a turn exits
    with status 1, naming the lost writer, yet leaves the agent running under the spawner;
    the next daemon on the same state dir takes the agent over (the same pid, no new
    process) and the turn completes there."""
    state = tmp_path / "state"
    pids: list[int] = []
    launcher = (str(TEST_FIXTURES / "writer_loss_t3d.py"),)
    window = ("--agent-reattach-window", "120")
    try:
        with trio.fail_after(180):
            async with serve(state, *flags(), *window, launcher=launcher) as daemon:
                async with open_ws(daemon) as client:
                    (turn_id,) = await start_streaming(client, tmp_path, 1)
                    pids = await provider_pids(daemon)
                    assert len(pids) == 1 and alive(pids[0]), pids
                    daemon.process.send_signal(signal.SIGUSR1)
                    with trio.fail_after(30):
                        await daemon.process.wait()
                assert daemon.process.returncode == 1, daemon.stderr_text()
                assert "database writer thread died" in daemon.stderr_text()
                assert alive(pids[0]), "the lost writer took the agent with it"

            async with serve(state, *flags(), *window) as again:

                async def ended() -> bool:
                    return (await turn_records(again.db_path, [turn_id]))[0]["status"] in TERMINAL

                await wait_until(ended, interval=0.2)
                (turn,) = await turn_records(again.db_path, [turn_id])
                assert turn["status"] == "completed", turn
                assert await provider_pids(again) == pids  # taken over: no new process
    finally:
        kill_leftovers(pids, state)
