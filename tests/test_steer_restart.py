"""A steered turn across a daemon restart: `t3d serve` subprocesses one after the other on one
state dir, the real spawner keeping the agent, the fake CLI replaying the steer recording slowly
enough that the daemon stops after the steered message reached the agent and before the turn's
first result."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import trio
from harness import new_thread, wait_until
from served import base_env, kill_leftovers, open_ws, provider_pids, query, serve

import replay_fixtures

STEER = replay_fixtures.FIXTURES_DIR / "claude-2.1.197_steer.jsonl"
# At a third of the recorded speed the first result comes ~6 s after the steered message.
SPEED = "0.33"


def flags() -> tuple[str, ...]:
    return ("--replay-fixture", str(STEER), "--replay-speed", SPEED, "--agent-reattach-window", "60", "--checkpoints", "off")


def host_prompts(log: Path) -> list[str]:
    if not log.exists():
        return []
    lines = [orjson.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [line["message"]["content"] for line in lines if line.get("type") == "user"]


async def test_a_steered_turn_taken_over_after_a_restart_ends_at_the_steered_messages_result(tmp_path: Path) -> None:
    """The daemon stops (SIGTERM, agents left running) while a turn with a steered message
    runs: the next daemon takes the agent over and the turn still lasts until the steered
    message's result (the spawner keeps the steer count), one turn with both answers, the
    steered message's item in it, nothing recorded twice; the agent got each message once."""
    project = tmp_path / "project"
    project.mkdir()
    log = tmp_path / "host.log"
    state = tmp_path / "state"
    env = base_env(T3D_REPLAY_HOST_LOG=str(log))
    lines = STEER.read_text().splitlines()
    prompt, steered = [orjson.loads(line[4:])["message"]["content"] for line in lines if line.startswith('>>> {"type":"user"')]
    pids: list[int] = []
    try:
        with trio.fail_after(120):
            async with serve(state, *flags(), env=env) as first:
                async with open_ws(first) as client:
                    thread_id = await new_thread(client, project.resolve())
                    started = await client.call("turn.start", thread_id=thread_id, text=prompt)
                    await client.wait_event(lambda d: d["kind"] == "item.updated" and d["entity"]["kind"] == "assistant_message")
                    reply = await client.call("turn.start", thread_id=thread_id, text=steered, delivery="steer")
                    assert reply["delivery"] == "steer" and reply["turn_id"] == started["turn_id"]
                    await wait_until(lambda: host_prompts(log) == [prompt, steered])
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    await first.process.wait()
            async with serve(state, *flags(), env=env) as second:
                assert "took over 1 agent(s)" in second.stderr_text()

                async def turns() -> list[dict[str, object]]:
                    rows = await query(second.db_path, "SELECT body FROM turns WHERE thread_id = ? ORDER BY ordinal", thread_id)
                    return [orjson.loads(body) for (body,) in rows]

                async def ended() -> bool:
                    found = await turns()
                    return len(found) == 1 and found[0]["status"] == "completed"

                await wait_until(ended, 0.1)
                [turn] = await turns()
                items = await query(second.db_path, "SELECT body FROM items WHERE turn_id = ? ORDER BY ordinal", turn["id"])
                bodies = [orjson.loads(b) for (b,) in items]
                texts = [b["text"] for b in bodies if b["kind"] == "assistant_message"]
                assert len(texts) == 2 and texts[1] == "ok"
                assert [b["text"] for b in bodies if b["kind"] == "user_message"] == [prompt, steered]
                assert host_prompts(log) == [prompt, steered]
                pids += await provider_pids(second)
    finally:
        kill_leftovers(pids, state)
