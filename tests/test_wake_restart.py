"""A background task's wake across a daemon restart: `t3d serve` subprocesses one after the
other on one state dir, the real spawner keeping the agent, the fake CLI replaying the
background Bash recording slowly enough that the wake comes while the daemon is down."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import trio
from harness import new_thread, run_turn
from served import base_env, kill_leftovers, open_ws, provider_pids, query, serve

import replay_fixtures

BASH_WAKE = replay_fixtures.FIXTURES_DIR / "claude-2.1.197_background_bash_wake.jsonl"
# At half the recorded speed the turn ends ~1.2 s after its prompt and the wake begins ~4.6 s
# after it: the daemon is stopped in between.
SPEED = "0.5"


def flags() -> tuple[str, ...]:
    return ("--replay-fixture", str(BASH_WAKE), "--replay-speed", SPEED, "--agent-reattach-window", "60", "--checkpoints", "off")


async def test_a_wake_while_no_daemon_runs_is_recorded_by_the_next_one(tmp_path: Path) -> None:
    """The daemon stops (SIGTERM, agents left running) after a turn that started background
    Bash: the command ends and the agent wakes while no daemon reads it, or while the daemon
    stops. The next daemon takes the agent over and records the wake from the spawner's
    replay: a turn the provider started, with the recorded text, completed; the task
    completed; nothing of the first turn recorded twice."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("hello\n")
    state = tmp_path / "state"
    env = base_env()
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            async with serve(state, *flags(), env=env) as first:
                async with open_ws(first) as client:
                    thread_id = await new_thread(client, project.resolve())
                    before = await run_turn(client, thread_id, "Please run BGBASH now")
                    assert before.turn["status"] == "completed"
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    await first.process.wait()
            await trio.sleep(4.0)  # the wake is due about now, with no daemon to read it
            async with serve(state, *flags(), env=env) as second:
                assert "took over 1 agent(s)" in second.stderr_text()
                while True:
                    rows = await query(second.db_path, "SELECT body FROM turns WHERE thread_id = ? ORDER BY ordinal", thread_id)
                    turns = [orjson.loads(body) for (body,) in rows]
                    if len(turns) == 2 and turns[1]["status"] == "completed":
                        break
                    await trio.sleep(0.1)
                assert [t["started_by"] for t in turns] == ["user", "provider"]
                assert turns[1]["origin"]["kind"] == "task_notification"
                items = await query(second.db_path, "SELECT body FROM items WHERE turn_id = ? ORDER BY ordinal", turns[1]["id"])
                texts = [orjson.loads(b)["text"] for (b,) in items if orjson.loads(b)["kind"] == "assistant_message"]
                assert texts == ['A background task finished: Background command "Wait, then print bg-done" completed (exit code 0)']
                first_items = await query(second.db_path, "SELECT body FROM items WHERE turn_id = ?", turns[0]["id"])
                kinds = sorted(orjson.loads(b)["kind"] for (b,) in first_items)
                assert kinds == ["assistant_message", "assistant_message", "background_task", "tool_call", "user_message"]
                [task] = [orjson.loads(b) for (b,) in first_items if orjson.loads(b)["kind"] == "background_task"]
                assert task["status"] == "completed"
                [(body,)] = await query(second.db_path, "SELECT body FROM threads WHERE id = ?", thread_id)
                assert orjson.loads(body)["running_tasks"] == []
                pids += await provider_pids(second)
    finally:
        kill_leftovers(pids, state)
