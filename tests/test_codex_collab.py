"""Codex's spawned agents as child threads, through a real daemon and a fake app-server.

The fake is `tests/fixtures/misbehaving_codex` in its ``collab*`` modes: made-up lines that
follow codex 0.171.0's app-server schema (``collabAgentToolCall`` items, and each spawned
agent's own Codex thread on the same connection), as no recording of a collab run exists.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import (
    TERMINAL,
    RpcClient,
    http,
    new_thread,
    open_client,
    run_turn,
    start_daemon,
    wait_until,
)
from served import alive, base_env, kill_leftovers, open_ws, provider_pids, serve
from test_codex_failures import MISBEHAVING, fake_codex, project

from t3d.providers.codex.collab import child_ids

Json = dict[str, Any]

AGENT = "01a2268d-0000-7000-8000-00000000a001"  # the fake's first agent's Codex thread
INNER = "01a2268d-0000-7000-8000-00000000a002"
GHOST = "01a2268d-0000-7000-8000-00000000dead"


async def snapshot(client: RpcClient, thread_id: str) -> Json:
    result: Json = await client.call("thread.snapshot", thread_id=thread_id)
    return result


def spawn_call(items: list[Json], call_id: str = "call_spawn_1") -> Json:
    return next(i for i in items if i["kind"] == "tool_call" and i["data"]["tool_use_id"] == call_id)


async def pending_requests(client: Any) -> list[Json]:
    """The pending requests, once there is at least one."""
    pending: list[Json] = []

    async def asked() -> bool:
        pending[:] = (await client.call("requests.pending"))["requests"]
        return bool(pending)

    await wait_until(asked)
    return pending


async def collab_daemon(tmp_path: Path, nursery: trio.Nursery, mode: str) -> Any:
    return await start_daemon(nursery, tmp_path / "state", codex_bin=fake_codex(tmp_path, mode))


def settled(items: list[Json]) -> bool:
    return all(i["status"] not in ("streaming", "running", "pending") for i in items)


@pytest.mark.parametrize("mode", ["collab", "collab-early"])
async def test_a_spawned_agent_is_a_child_thread_of_its_turn(tmp_path: Path, nursery: trio.Nursery, mode: str) -> None:
    """A spawnAgent call opens a child thread of the parent's thread (ids derived from the
    turn, the call and the agent's Codex thread; the prompt as its first item, the model in
    its title); the agent's messages and command are items of the child's turn, not the
    parent's, also when its first lines come before the spawn's item names it
    (collab-early: held, then fed to the child); the parent's spawn and wait items link to
    the child and show its status; the agent's turn/completed completes the child; the
    next turn runs as usual."""
    with trio.fail_after(60):
        daemon = await collab_daemon(tmp_path, nursery, mode)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            outcome = await run_turn(client, thread_id, "go")
            assert outcome.turn["status"] == "completed", outcome.turn
            assert outcome.assistant_text == ["ok: go"]
            assert [i["kind"] for i in outcome.items if i["kind"] == "command"] == []
            spawn = spawn_call(outcome.items)
            child_thread, child_turn = child_ids(outcome.turn["id"], "call_spawn_1", AGENT)
            assert spawn["data"]["child_thread_id"] == child_thread
            status = "running" if mode == "collab-early" else "pendingInit"
            assert (spawn["title"], spawn["status"], spawn["data"]["child_status"]) == ("spawnAgent", "completed", status)
            wait = spawn_call(outcome.items, "call_wait_1")
            assert (wait["data"]["child_thread_id"], wait["data"]["child_status"]) == (child_thread, "completed")
            child = await snapshot(client, child_thread)
            assert child["thread"]["parent_thread_id"] == thread_id
            assert child["thread"]["subagent"]["parent_turn_id"] == outcome.turn["id"]
            assert child["thread"]["subagent"]["tool_use_id"] == "call_spawn_1"
            assert child["thread"]["title"] == "gpt-mock: look around"
            assert child["thread"]["status"] == "idle"
            [turn] = child["turns"]
            assert (turn["id"], turn["status"], turn["origin"]["kind"]) == (child_turn, "completed", "subagent")
            items = child["items"]
            assert items[0]["kind"] == "user_message" and items[0]["text"] == "look around"
            assert [i["text"] for i in items if i["kind"] == "assistant_message"] == ["agent: looking", "agent: done"]
            [command] = [i for i in items if i["kind"] == "command"]
            assert (command["title"], command["status"], command["data"]["output"]) == ("ls", "completed", "README.md\n")
            assert settled(items)
            again = await run_turn(client, thread_id, "are you back")
            assert again.turn["status"] == "completed" and again.assistant_text == ["ok: are you back"]
        daemon.stop()


@pytest.mark.parametrize("mode", ["collab-late", "collab-late-lost"])
async def test_an_agent_reported_completed_keeps_its_last_lines(tmp_path: Path, nursery: trio.Nursery, mode: str) -> None:
    """A wait that reports the agent completed before the agent's last message does not cut
    the child short: the last message is an item of the child, whose turn ends completed at
    the agent's turn/completed, or (collab-late-lost: it never comes) with the parent's
    turn, still completed since Codex said so."""
    with trio.fail_after(60):
        daemon = await collab_daemon(tmp_path, nursery, mode)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            outcome = await run_turn(client, thread_id, "go")
            assert outcome.turn["status"] == "completed", outcome.turn
            child_thread, _ = child_ids(outcome.turn["id"], "call_spawn_1", AGENT)
            child = await snapshot(client, child_thread)
            assert [i["text"] for i in child["items"] if i["kind"] == "assistant_message"] == ["agent: looking", "agent: done"]
            assert (child["turns"][0]["status"], child["turns"][0]["reason"]) == ("completed", None)
            assert child["thread"]["status"] == "idle" and settled(child["items"])
        daemon.stop()


async def test_an_agents_own_spawn_nests(tmp_path: Path, nursery: trio.Nursery) -> None:
    """An agent that spawns an agent (senderThreadId: the agent's thread): the inner one is a
    child thread of the outer child, linked from the outer child's spawn item, its message
    an item of its own turn; both complete; the parent's snapshot lists only its child."""
    with trio.fail_after(60):
        daemon = await collab_daemon(tmp_path, nursery, "collab-nested")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            outcome = await run_turn(client, thread_id, "go")
            assert outcome.turn["status"] == "completed", outcome.turn
            outer_id, outer_turn = child_ids(outcome.turn["id"], "call_spawn_1", AGENT)
            inner_id, _ = child_ids(outer_turn, "call_spawn_2", INNER)
            outer = await snapshot(client, outer_id)
            assert spawn_call(outer["items"], "call_spawn_2")["data"]["child_thread_id"] == inner_id
            assert [i["text"] for i in outer["items"] if i["kind"] == "assistant_message"] == ["agent: looking", "agent: done"]
            inner = await snapshot(client, inner_id)
            assert inner["thread"]["parent_thread_id"] == outer_id
            assert inner["thread"]["subagent"]["parent_turn_id"] == outer_turn
            assert [i["text"] for i in inner["items"] if i["kind"] == "assistant_message"] == ["inner: done"]
            assert outer["turns"][0]["status"] == inner["turns"][0]["status"] == "completed"
            tree = await client.call("thread.snapshot", thread_id=thread_id, children=True)
            assert [c["id"] for c in tree["children"]] == [outer_id]
        daemon.stop()


async def test_an_approval_inside_an_agent_is_asked_on_the_child_and_answered(tmp_path: Path, nursery: trio.Nursery) -> None:
    """An approval request on the agent's Codex thread is a request of the child's turn (not
    of the parent's); answered through the API, Codex gets the decision under its own
    request id (the fake echoes it: decision=accept), and both turns complete."""
    with trio.fail_after(60):
        daemon = await collab_daemon(tmp_path, nursery, "collab-approval")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            started = await client.call("turn.start", thread_id=thread_id, text="go")
            [request] = await pending_requests(client)
            child_thread, child_turn = child_ids(started["turn_id"], "call_spawn_1", AGENT)
            assert (request["thread_id"], request["turn_id"]) == (child_thread, child_turn)
            assert request["id"] == f"{child_turn}:5"
            await client.call("request.respond", request_id=request["id"], decision="allow")
            end = await client.wait_event(
                lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == started["turn_id"] and d["entity"]["status"] in TERMINAL
            )
            assert end["entity"]["status"] == "completed", end["entity"]
            child = await snapshot(client, child_thread)
            assert [i["text"] for i in child["items"] if i["kind"] == "assistant_message"][-1] == "agent: decision=accept"
            [approval] = [i for i in child["items"] if i["kind"] == "approval_request"]
            assert approval["status"] == "allowed"
            parent = await snapshot(client, thread_id)
            assert [i for i in parent["items"] if i["kind"] == "approval_request"] == []
        daemon.stop()


async def test_an_agent_that_never_finishes_is_closed_with_the_parents_turn(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent that never ends its turn does not hold the parent: the parent's turn
    completes, the child's turn ends with it (failed, parent_turn_ended), its streaming
    message is closed and its thread idle; the session logs it."""
    caplog.set_level(logging.WARNING, "t3d.providers.codex")
    with trio.fail_after(60):
        daemon = await collab_daemon(tmp_path, nursery, "collab-open")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            outcome = await run_turn(client, thread_id, "go")
            assert outcome.turn["status"] == "completed", outcome.turn
            child_thread, _ = child_ids(outcome.turn["id"], "call_spawn_1", AGENT)
            child = await snapshot(client, child_thread)
            [turn] = child["turns"]
            assert (turn["status"], turn["reason"]) == ("failed", "parent_turn_ended")
            assert child["thread"]["status"] == "idle"
            [message] = [i for i in child["items"] if i["kind"] == "assistant_message"]
            assert (message["text"], message["status"]) == ("agent: forever", "completed")
            assert settled(child["items"])
        daemon.stop()
    assert any("had not finished when turn" in r.getMessage() for r in caplog.records)


async def test_lines_of_an_unknown_codex_thread_are_dropped_and_its_approval_refused(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """Lines of a Codex thread that is neither the session's nor an agent's: its message is
    in no turn (logged, dropped), its approval request is declined at once without asking
    anyone (the fake echoes the decision), and the parent and its real agent are as
    without them."""
    caplog.set_level(logging.WARNING, "t3d.providers.codex")
    with trio.fail_after(60):
        daemon = await collab_daemon(tmp_path, nursery, "collab-stray")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            outcome = await run_turn(client, thread_id, "go")
            assert outcome.turn["status"] == "completed", outcome.turn
            assert outcome.assistant_text == ["ghost answered: decline"]
            assert outcome.requests == []
            child_thread, _ = child_ids(outcome.turn["id"], "call_spawn_1", AGENT)
            child = await snapshot(client, child_thread)
            assert [i["text"] for i in child["items"] if i["kind"] == "assistant_message"] == ["agent: looking", "agent: done"]
            assert child["turns"][0]["status"] == "completed"
            assert sorted(await thread_ids(daemon)) == sorted([thread_id, child_thread])
            assert all(i["text"] != "ghost text" for i in outcome.items + child["items"])
        daemon.stop()
    warned = [r.getMessage() for r in caplog.records if GHOST in r.getMessage()]
    assert len(warned) == 2, warned
    assert "is no open agent of turn" in warned[0] and "approval request is declined" in warned[0], warned
    assert "is no agent of turn" in warned[1] and "3 line(s) of it were dropped" in warned[1], warned


async def test_interrupting_the_parent_interrupts_its_agent(tmp_path: Path, nursery: trio.Nursery) -> None:
    """turn.interrupt of the parent sends turn/interrupt for the parent's Codex turn and for
    its open agent's (the fake ends the parent interrupted only if both came): the child's
    turn ends interrupted by the user, the parent's interrupted, no request pending."""
    with trio.fail_after(60):
        daemon = await collab_daemon(tmp_path, nursery, "collab-interrupt")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            started = await client.call("turn.start", thread_id=thread_id, text="go")
            child_thread, child_turn = child_ids(started["turn_id"], "call_spawn_1", AGENT)

            async def streaming() -> bool:
                items = (await snapshot(client, child_thread))["items"] if child_thread in await thread_ids(daemon) else []
                return any(i["kind"] == "assistant_message" for i in items)

            await wait_until(streaming)
            await client.call("turn.interrupt", thread_id=thread_id)
            end = await client.wait_event(
                lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == started["turn_id"] and d["entity"]["status"] in TERMINAL
            )
            assert end["entity"]["status"] == "interrupted", end["entity"]
            child = await snapshot(client, child_thread)
            [turn] = child["turns"]
            assert (turn["id"], turn["status"], turn["reason"]) == (child_turn, "interrupted", "interrupt")
            assert child["thread"]["status"] == "idle" and settled(child["items"])
        daemon.stop()


async def thread_ids(daemon: Any) -> list[str]:
    status, shell = await http(daemon, "GET", "/api/shell")
    assert status == 200, shell
    return [row["id"] for row in shell["threads"]]


async def test_an_agent_waiting_on_approval_carries_on_across_a_daemon_restart(tmp_path: Path) -> None:
    """A daemon stopped (SIGTERM) while a spawned agent waits on its approval leaves the
    app-server running; the next daemon's replay names the same child (one child thread,
    the same ids), the request is still pending on the child's turn, and answering it
    reaches Codex (decision=accept) and completes the child and the parent."""
    state = tmp_path / "state"
    flags = ("--codex-bin", fake_codex(tmp_path, "collab-approval"), "--agent-reattach-window", "60", "--checkpoints", "off")
    pids: list[int] = []
    try:
        with trio.fail_after(120):
            async with serve(state, *flags, env=base_env()) as first:
                async with open_ws(first) as client:
                    thread_id = await new_thread(client, project(tmp_path), provider="codex")
                    started = await client.call("turn.start", thread_id=thread_id, text="go")
                    [request] = await pending_requests(client)
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGTERM)
                await first.process.wait()
            child_thread, child_turn = child_ids(started["turn_id"], "call_spawn_1", AGENT)
            assert request["turn_id"] == child_turn
            assert all(alive(pid) for pid in pids), "the app-server died with its daemon"
            async with serve(state, *flags, env=base_env()) as second:
                assert "took over 1 agent(s)" in second.stderr_text()
                async with open_ws(second) as client:
                    pending = (await client.call("requests.pending"))["requests"]
                    assert [(r["id"], r["turn_id"]) for r in pending] == [(request["id"], child_turn)]
                    await client.call("request.respond", request_id=request["id"], decision="allow")
                    await wait_until(lambda: turn_status(client, started["turn_id"], thread_id))
                    parent = await snapshot(client, thread_id)
                    assert parent["turns"][-1]["status"] == "completed", parent["turns"][-1]
                    child = await snapshot(client, child_thread)
                    assert child["turns"][0]["status"] == "completed"
                    assert [i["text"] for i in child["items"] if i["kind"] == "assistant_message"] == ["agent: looking", "agent: decision=accept"]
                assert sorted(await thread_ids(second)) == sorted([thread_id, child_thread])
                assert sorted(await provider_pids(second)) == sorted(pids)  # taken over, not started anew
    finally:
        kill_leftovers(pids, state)


async def turn_status(client: RpcClient, turn_id: str, thread_id: str) -> bool:
    turns = (await snapshot(client, thread_id))["turns"]
    return any(t["id"] == turn_id and t["status"] in TERMINAL for t in turns)


SCHEMA = Path("/work/shared/providers/fixtures/codex/schema-0.171.0")


def test_the_fakes_collab_lines_follow_the_app_server_schema() -> None:
    """The made-up lines of the fake's collab-nested run use only notification methods codex
    0.171.0's schema has, and every collabAgentToolCall item has the schema's required
    fields, no field it lacks, and only its tool, status and agent-status values."""
    bundle = SCHEMA / "codex_app_server_protocol.v2.schemas.json"
    if not bundle.exists():
        pytest.skip(f"the Codex schema is not on this machine ({SCHEMA})")
    defs = json.loads(bundle.read_text())["definitions"]
    notifications = {v["properties"]["method"]["enum"][0] for v in json.loads((SCHEMA / "ServerNotification.json").read_text())["oneOf"]}
    [item_schema] = [v for v in defs["ThreadItem"]["oneOf"] if v["title"] == "CollabAgentToolCallThreadItem"]
    host = [
        {"id": 1, "method": "initialize", "params": {}},
        {"id": 2, "method": "thread/start", "params": {"cwd": "/"}},
        {"id": 3, "method": "turn/start", "params": {"threadId": "t", "input": [{"type": "text", "text": "go"}]}},
    ]
    run = subprocess.run(
        [sys.executable, str(MISBEHAVING), "--mode", "collab-nested", "app-server"],
        input="".join(json.dumps(m) + "\n" for m in host), capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    lines = [json.loads(raw) for raw in run.stdout.splitlines()]
    collab_items = []
    for message in lines:
        if "method" not in message:
            continue
        assert message["method"] in notifications, message["method"]
        item = message["params"].get("item")
        if isinstance(item, dict) and item["type"] == "collabAgentToolCall":
            collab_items.append(item)
    assert len(collab_items) == 6  # two spawns and a wait, each started and completed
    for item in collab_items:
        assert set(item_schema["required"]) <= set(item) <= set(item_schema["properties"]), item
        assert item["tool"] in defs["CollabAgentTool"]["enum"]
        assert item["status"] in defs["CollabAgentToolCallStatus"]["enum"]
        assert all(s["status"] in defs["CollabAgentStatus"]["enum"] for s in item["agentsStates"].values())


async def test_force_stopping_the_parent_ends_its_waiting_agent(tmp_path: Path, nursery: trio.Nursery) -> None:
    """thread.force_stop of the parent while its agent waits on an approval ends the parent's
    turn cancelled (force_stop) and the child's turn with it, its request no longer pending;
    the child stays a child of the parent."""
    with trio.fail_after(60):
        daemon = await collab_daemon(tmp_path, nursery, "collab-approval")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            started = await client.call("turn.start", thread_id=thread_id, text="go")
            await pending_requests(client)
            stopped = await client.call("thread.force_stop", thread_id=thread_id)
            assert stopped["turn_id"] == started["turn_id"]
            parent = await client.call("thread.snapshot", thread_id=thread_id, children=True)
            assert (parent["turns"][-1]["status"], parent["turns"][-1]["reason"]) == ("cancelled", "force_stop")
            child_thread, _ = child_ids(started["turn_id"], "call_spawn_1", AGENT)
            assert [c["id"] for c in parent["children"]] == [child_thread]
            child = await snapshot(client, child_thread)
            assert (child["turns"][0]["status"], child["thread"]["status"]) == ("cancelled", "idle")
            assert (await client.call("requests.pending"))["requests"] == []
        daemon.stop()


async def test_an_agent_whose_spawn_was_past_the_replay_buffer_reads_on_after_a_restart(tmp_path: Path) -> None:
    """With a spawner whose replay buffer is smaller than the turn's output, a restart while
    the agent waits on its approval cannot replay the spawn: the new daemon makes the child
    of the committed spawn item open again, the pending request (rebuilt from the database,
    not declined) reaches Codex when answered, and the agent's lines from the live point on
    are the child's: its last message, and its turn's end completes it."""
    state = tmp_path / "state"
    state.mkdir()
    env = base_env()
    socket_path = state / "spawner.sock"
    spawner = await trio.lowlevel.open_process(
        [sys.executable, "-m", "spawner", "--socket", str(socket_path), "--replay-buffer", "1024", "--orphan-grace", "60"], env=env
    )
    flags = ("--codex-bin", fake_codex(tmp_path, "collab-approval-long"), "--agent-reattach-window", "60", "--checkpoints", "off")
    pids: list[int] = []
    try:
        with trio.fail_after(120):
            await wait_until(socket_path.exists)
            async with serve(state, *flags, env=env) as first:
                async with open_ws(first) as client:
                    thread_id = await new_thread(client, project(tmp_path), provider="codex")
                    started = await client.call("turn.start", thread_id=thread_id, text="go")
                    pending = await pending_requests(client)
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            child_thread, _ = child_ids(started["turn_id"], "call_spawn_1", AGENT)
            async with serve(state, *flags, env=env) as second, open_ws(second) as client:
                await client.call("request.respond", request_id=pending[0]["id"], decision="allow")
                await wait_until(lambda: turn_status(client, started["turn_id"], thread_id))
                assert "were dropped" in second.stderr_text()
                parent = await snapshot(client, thread_id)
                assert parent["turns"][-1]["status"] == "completed", parent["turns"][-1]
                assert [i["title"] for i in parent["items"] if i["kind"] == "error"] == ["Output lost across a daemon restart"]
                child = await snapshot(client, child_thread)
                assert child["turns"][0]["status"] == "completed", child["turns"][0]
                assert [i["text"] for i in child["items"] if i["kind"] == "assistant_message"][-1] == "agent: decision=accept"
    finally:
        kill_leftovers(pids, state)
        spawner.kill()
        await spawner.wait()
