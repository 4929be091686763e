"""The MCP work tools that stop things, driven by the official ``mcp`` SDK's streamable HTTP
client (as in tests/test_mcp.py) against a real in-process daemon whose replay agent (the
fake CLI, a real subprocess under the real spawner) plays its turn at 0.1 of the recorded
speed, so that the tool lands mid-turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from harness import Daemon, start_daemon, wait_until
from mcp import Client
from served import alive, query, wait_gone
from test_mcp import call, mcp_client

READ = "Please READ notes.txt"


def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir(exist_ok=True)
    (path / "notes.txt").write_text("hello\n")
    return path.resolve()


async def delegate_streaming(client: Client, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """delegate_task a READ turn to a replay agent; return its thread id and its task_status
    once the turn runs and some assistant text has arrived."""
    started = await call(client, "delegate_task", text=READ, project_path=str(project(tmp_path)), provider="replay")
    status: dict[str, Any] = {}

    async def streaming() -> bool:
        status.update(await call(client, "task_status", thread_id=started["thread_id"]))
        assert not status["done"], status  # the turn ended before the tool could stop it
        return status["turn"]["status"] == "running" and bool(status["assistant_text"])

    await wait_until(streaming, interval=0.1)
    return started["thread_id"], status


async def agent_pid(daemon: Daemon, thread_id: str) -> int:
    [(pid,)] = await query(daemon.settings.db_path, "SELECT json_extract(body, '$.pid') FROM sessions WHERE thread_id = ?", thread_id)
    return int(pid)


async def until_done(client: Client, thread_id: str) -> dict[str, Any]:
    status: dict[str, Any] = {}

    async def done() -> bool:
        status.update(await call(client, "task_status", thread_id=thread_id))
        return bool(status["done"])

    await wait_until(done, interval=0.1)
    return status


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_interrupt_turn_ends_a_streaming_turn_interrupted(tmp_path: Path, nursery: trio.Nursery, mode: str) -> None:
    """interrupt_turn on a thread whose replay turn is streaming returns a line saying the
    interrupt was asked for; the turn then ends ``interrupted`` (reason ``interrupt``) with
    the text streamed so far, the agent itself keeps running (an interrupt is not a kill),
    and a second interrupt_turn, with nothing running, is a tool error naming the thread."""
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_speed=0.1, checkpoints="off")
        async with mcp_client(daemon, mode) as client:
            thread_id, before = await delegate_streaming(client, tmp_path)
            pid = await agent_pid(daemon, thread_id)
            asked = await client.call_tool("interrupt_turn", {"thread_id": thread_id})
            assert not asked.is_error, asked.content
            assert asked.content[0].text.startswith(f"Interrupt requested for thread {thread_id}")  # type: ignore[union-attr]
            assert asked.structured_content is not None and asked.structured_content["thread_id"] == thread_id

            after = await until_done(client, thread_id)
            assert (after["turn"]["id"], after["turn"]["status"], after["turn"]["reason"]) == (before["turn"]["id"], "interrupted", "interrupt"), after
            assert after["assistant_text"].startswith(before["assistant_text"][:20])
            assert alive(pid), "an interrupt killed the agent"

            again = await client.call_tool("interrupt_turn", {"thread_id": thread_id})
            assert again.is_error, again.content
            assert thread_id in again.content[0].text, again.content  # type: ignore[union-attr]
        daemon.stop()


async def test_force_stop_kills_a_streaming_agent_and_cancels_its_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    """force_stop on a thread whose replay turn is streaming returns the killed agent's pid
    (the one its session recorded) and its exit status; that process is gone, the turn has
    ended ``cancelled`` (reason ``force_stop``), and a second force_stop, with no agent
    left, is a tool error saying there is nothing to stop."""
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_speed=0.1, checkpoints="off")
        async with mcp_client(daemon, "auto") as client:
            thread_id, before = await delegate_streaming(client, tmp_path)
            pid = await agent_pid(daemon, thread_id)
            assert alive(pid)
            stopped = await call(client, "force_stop", thread_id=thread_id)
            assert stopped["thread_id"] == thread_id and stopped["pid"] == pid, stopped
            assert stopped["exit_code"] is not None, stopped
            assert await wait_gone([pid], 15) == [], "force_stop left the agent running"

            after = await until_done(client, thread_id)
            assert (after["turn"]["id"], after["turn"]["status"], after["turn"]["reason"]) == (before["turn"]["id"], "cancelled", "force_stop"), after

            again = await client.call_tool("force_stop", {"thread_id": thread_id})
            assert again.is_error, again.content
            assert "has no running agent and no running turn; nothing to stop" in again.content[0].text, again.content  # type: ignore[union-attr]
        daemon.stop()
