"""Subagents as child threads, through a real daemon replaying real recordings of the CLI.

Claude Code 2.1.197 streams a foreground subagent's lines (``Agent`` tool) on the same stdout,
marked with ``parent_tool_use_id``; t3d shows each subagent as a child thread of its parent.
The expectations are read from the recordings (which lines belong to which subagent), not
typed by hand.
"""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from harness import (
    FIXTURES,
    RpcClient,
    RpcFailed,
    http,
    new_thread,
    open_client,
    run_turn,
    start_daemon,
)
from served import base_env, kill_leftovers, open_ws, provider_pids, serve
from test_replay_recordings import check_turn, content_text, project_dir, read_recording

Json = dict[str, Any]

SUBAGENT = FIXTURES / "claude-2.1.197_subagent.jsonl"
NESTED = FIXTURES / "claude-2.1.197_subagent_nested.jsonl"
PERMISSION = FIXTURES / "claude-2.1.197_subagent_permission.jsonl"
SUBAGENTS = [SUBAGENT, NESTED, PERMISSION]


@attrs.define
class RecordedSubagent:
    tool_use_id: str
    parent: str | None  # the subagent whose line made the call (None: the main agent)
    input: Json
    texts: list[str] = attrs.Factory(list)
    tools: list[str] = attrs.Factory(list)  # tool_use_ids of its own calls, in order
    prompted: list[str] = attrs.Factory(list)  # tool names of its can_use_tool prompts
    result: str | None = None
    is_error: bool = False


def recorded_subagents(path: Path, workspace: Path) -> dict[str, RecordedSubagent]:
    """The foreground subagents of a recording by their Agent call, with what their own lines
    show (texts, tool calls, prompts) and the call's result."""
    found: dict[str, RecordedSubagent] = {}
    agents: dict[str, str] = {}  # task id -> Agent call
    tools: dict[str, str] = {}  # a subagent's own call -> its Agent call
    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.startswith(">>> ") or not raw.strip():
            continue
        line: Json = json.loads(raw.replace("/workspace", str(workspace)))
        kind, parent = line.get("type"), line.get("parent_tool_use_id")
        if kind == "system" and line.get("subtype") == "task_started":
            agents[line["task_id"]] = line["tool_use_id"]
        elif kind == "assistant":
            for block in line["message"]["content"]:
                if block["type"] == "tool_use" and block["name"] in ("Agent", "Task"):
                    found[block["id"]] = RecordedSubagent(block["id"], parent, block["input"])
                if parent in found:
                    if block["type"] == "text":
                        found[parent].texts.append(block["text"])
                    elif block["type"] == "tool_use":
                        found[parent].tools.append(block["id"])
                        tools[block["id"]] = parent
        elif kind == "user" and isinstance(line["message"]["content"], list):
            for part in line["message"]["content"]:
                if part.get("type") == "tool_result" and part["tool_use_id"] in found:
                    sub = found[part["tool_use_id"]]
                    sub.result, sub.is_error = content_text(part.get("content", "")), part.get("is_error") is True
        elif kind == "control_request" and line["request"].get("agent_id"):
            request = line["request"]
            owner = tools.get(request.get("tool_use_id")) or agents[request["agent_id"]]
            found[owner].prompted.append(request["tool_name"])
    return found


async def child_snapshot(client: RpcClient, thread_id: str) -> Json:
    snapshot: Json = await client.call("thread.snapshot", thread_id=thread_id)
    return snapshot


def call_of(items: list[Json], tool_use_id: str) -> Json:
    return next(i for i in items if i["kind"] == "tool_call" and i["data"]["tool_use_id"] == tool_use_id)


async def check_tree(client: RpcClient, parent_turn: Json, parent_items: list[Json], subs: dict[str, RecordedSubagent]) -> dict[str, Json]:
    """Every recorded subagent is a child thread of the thread whose agent called it, linked
    from that call's item, with its prompt, its own texts and tool calls as items of its one
    turn, ended as the call's result says. Returns the snapshots by Agent call."""
    assert [i for i in parent_items if i["kind"] == "background_task"] == []  # foreground: no task items
    snapshots: dict[str, Json] = {}
    items_of = {None: parent_items}
    turn_of = {None: parent_turn}
    for tool_use_id, sub in subs.items():  # in call order: a parent before its children
        call = call_of(items_of[sub.parent], tool_use_id)
        child_id = call["data"]["child_thread_id"]
        snapshot = await child_snapshot(client, child_id)
        snapshots[tool_use_id] = snapshot
        thread = snapshot["thread"]
        assert thread["parent_thread_id"] == turn_of[sub.parent]["thread_id"]
        assert thread["subagent"]["parent_turn_id"] == turn_of[sub.parent]["id"]
        assert thread["subagent"]["tool_use_id"] == tool_use_id
        assert thread["title"] == f"{sub.input['subagent_type']}: {sub.input['description']}"
        assert thread["status"] == "idle"
        [turn] = snapshot["turns"]
        assert turn["status"] == ("failed" if sub.is_error else "completed")
        assert turn["started_by"] == "provider" and turn["origin"]["kind"] == "subagent"
        items = snapshot["items"]
        assert items[0]["kind"] == "user_message" and items[0]["text"] == sub.input["prompt"]
        assert [i["text"] for i in items if i["kind"] == "assistant_message"] == sub.texts
        assert [i["data"]["tool_use_id"] for i in items if i["kind"] == "tool_call"] == sub.tools
        assert all(i["status"] not in ("streaming", "running", "pending") for i in items)
        assert [i for i in items if i["kind"] == "background_task"] == []
        assert call["status"] == ("failed" if sub.is_error else "completed")
        assert call["data"]["result"] == sub.result
        items_of[tool_use_id] = items  # type: ignore[index]
        turn_of[tool_use_id] = turn  # type: ignore[index]
    return snapshots


async def replay(tmp_path: Path, nursery: trio.Nursery, recording: Path, **settings: Any) -> tuple[Any, Path]:
    project = project_dir(tmp_path)
    daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(recording), **settings)
    return daemon, project


async def test_a_subagent_is_a_child_thread_of_its_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    """One subagent (claude-2.1.197_subagent): the parent's turn keeps only its own texts and
    calls (the Agent call linking to the child); the subagent's prompt and Read are items of a
    child thread whose parent is the thread, completed by the Agent call's result; the shell
    rows carry the tree (parent_thread_id)."""
    with trio.fail_after(40):
        daemon, project = await replay(tmp_path, nursery, SUBAGENT)
        (recorded,) = read_recording(SUBAGENT, project)
        subs = recorded_subagents(SUBAGENT, project)
        assert len(subs) == 1 and next(iter(subs.values())).tools  # the recording is as described
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            outcome = await run_turn(client, thread_id, recorded.prompt or "go")
            assert outcome.turn["status"] == "completed"
            check_turn(outcome, recorded, {})
            snapshots = await check_tree(client, outcome.turn, outcome.items, subs)
            [child] = snapshots.values()
            status, shell = await http(daemon, "GET", "/api/shell")
            assert status == 200
            rows = {row["id"]: row for row in shell["threads"]}
            assert rows[child["thread"]["id"]]["parent_thread_id"] == thread_id
            assert rows[thread_id]["parent_thread_id"] is None
        daemon.stop()


def two_at_once(path: Path) -> Path:
    """The one-subagent recording made into a turn whose agent starts two subagents in one
    message and whose subagents' lines interleave, as parallel Agent calls stream: the second
    call is the first's lines with new ids and its own description, its content block the
    next index; both prompts, then the subagents' own lines alternately, then both results."""
    raws = SUBAGENT.read_text(encoding="utf-8").splitlines()
    lines: list[Json] = [json.loads(raw.removeprefix(">>> ")) for raw in raws]
    start = next(i for i, o in enumerate(lines) if o.get("event", {}).get("content_block", {}).get("name") == "Agent")
    agent = lines[start]["event"]["content_block"]["id"]
    task = next(o["task_id"] for o in lines if o.get("subtype") == "task_started")
    tool = next(b["id"] for o in lines if o.get("parent_tool_use_id") == agent and o.get("type") == "assistant" for b in o["message"]["content"])
    message = next(o["message"]["id"] for o in lines if o.get("parent_tool_use_id") == agent and o.get("type") == "assistant")
    end = next(i for i, o in enumerate(lines) if o.get("type") == "user" and not o.get("parent_tool_use_id") and i > start)
    stop = next(i for i in range(start, end) if lines[i].get("event", {}).get("type") == "content_block_stop")
    prelude, rest = raws[start : stop + 1], raws[stop + 1 : end]
    prompt = [r for r in rest if json.loads(r).get("parent_tool_use_id") == agent and '"tool_result"' not in r and json.loads(r)["type"] == "user"]
    parent = [r for r in rest if r not in prompt and json.loads(r).get("type") == "stream_event"]  # the message's end
    own = [r for r in rest if r not in prompt and r not in parent]

    def second(raw: str) -> str:
        for old in (agent, task, tool, message):
            raw = raw.replace(old, old + "b")
        return raw.replace("Read the notes", "Read the notes again").replace('"index":1', '"index":2')

    alternate = [r for pair in zip(own, map(second, own), strict=True) for r in pair]
    out = [*raws[:start], *prelude, *map(second, prelude), *prompt, *map(second, prompt), *parent, *alternate, raws[end], second(raws[end]), *raws[end + 1 :]]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


async def test_two_subagents_at_once_stay_apart(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Two subagents started in one message, their lines interleaved: two child threads, each
    with only its own prompt, text and Read call, each completed by its own call's result; the
    parent's turn keeps its own texts and both calls."""
    recording = two_at_once(tmp_path / "two-at-once.jsonl")
    with trio.fail_after(40):
        daemon, project = await replay(tmp_path, nursery, recording)
        (recorded,) = read_recording(recording, project)
        subs = recorded_subagents(recording, project)
        assert len(subs) == 2 and all(sub.tools and sub.result for sub in subs.values())  # as described
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            outcome = await run_turn(client, thread_id, recorded.prompt or "go")
            assert outcome.turn["status"] == "completed"
            check_turn(outcome, recorded, {})
            snapshots = await check_tree(client, outcome.turn, outcome.items, subs)
            assert len({s["thread"]["id"] for s in snapshots.values()}) == 2
        daemon.stop()


async def test_nested_subagents_nest(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A subagent that starts a subagent (claude-2.1.197_subagent_nested): the inner one is a
    child of the middle one (2.1.197 streams only the inner one's task lines, so it shows its
    prompt and ends with its result); both end completed."""
    with trio.fail_after(40):
        daemon, project = await replay(tmp_path, nursery, NESTED)
        (recorded,) = read_recording(NESTED, project)
        subs = recorded_subagents(NESTED, project)
        assert [s.parent is None for s in subs.values()] == [True, False]
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            outcome = await run_turn(client, thread_id, recorded.prompt or "go")
            check_turn(outcome, recorded, {})
            snapshots = await check_tree(client, outcome.turn, outcome.items, subs)
            outer, inner = snapshots.values()
            assert inner["thread"]["parent_thread_id"] == outer["thread"]["id"]
            assert outer["thread"]["parent_thread_id"] == thread_id
            # The parent's snapshot lists its children when asked (their rows, with status).
            plain = await client.call("thread.snapshot", thread_id=thread_id)
            assert "children" not in plain
            tree = await client.call("thread.snapshot", thread_id=thread_id, children=True)
            assert [c["id"] for c in tree["children"]] == [outer["thread"]["id"]]
            assert tree["children"][0]["status"] == "idle" and tree["children"][0]["subagent"]["tool_use_id"]
            middle = await client.call("thread.snapshot", thread_id=outer["thread"]["id"], children=True)
            assert [c["id"] for c in middle["children"]] == [inner["thread"]["id"]]
            status, body = await http(daemon, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 1, "method": "thread.snapshot", "params": {"thread_id": thread_id, "children": True}})
            assert status == 200 and [c["id"] for c in body["result"]["children"]] == [outer["thread"]["id"]]
            with pytest.raises(RpcFailed) as refused:
                await client.call("thread.snapshot", thread_id=thread_id, childs=True)
            assert "childs" in str(refused.value.message)
        daemon.stop()


async def test_a_subagents_permission_prompt_is_shown_on_the_child_and_answered(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A subagent's Edit prompt (can_use_tool with agent_id) is a request of the child's turn
    (the child thread waits, not the parent's turn items); answering it lets the CLI go on,
    the subagent's edit completes and the parent's turn completes."""
    with trio.fail_after(40):
        daemon, project = await replay(tmp_path, nursery, PERMISSION)
        (recorded,) = read_recording(PERMISSION, project)
        subs = recorded_subagents(PERMISSION, project)
        [sub] = subs.values()
        assert sub.prompted == ["Edit"]
        answered: list[Json] = []
        async with open_client(daemon) as client, open_client(daemon) as answerer:

            async def answer() -> None:
                while True:
                    pending = await answerer.call("requests.pending")
                    for request in pending["requests"]:
                        await answerer.call("request.respond", request_id=request["id"], decision="allow")
                        answered.append(request)
                    await trio.sleep(0.05)

            thread_id = await new_thread(client, project)
            async with trio.open_nursery() as inner:
                inner.start_soon(answer)
                outcome = await run_turn(client, thread_id, recorded.prompt or "go")
                inner.cancel_scope.cancel()
            assert outcome.turn["status"] == "completed"
            assert outcome.of_kind("approval_request") == [] and outcome.requests == []
            snapshots = await check_tree(client, outcome.turn, outcome.items, subs)
            [child] = snapshots.values()
            [request] = answered
            assert request["thread_id"] == child["thread"]["id"] and request["turn_id"] == child["turns"][0]["id"]
            [approval] = [i for i in child["items"] if i["kind"] == "approval_request"]
            assert approval["status"] == "allowed" and approval["data"]["tool_name"] == "Edit"
            edit = call_of(child["items"], sub.tools[-1])
            assert edit["status"] == "completed"
            assert (project / "notes.txt").read_text() == "hello, world\n"  # the fake edits once allowed
        daemon.stop()


def _rewritten(source: Path, target: Path, change: Any) -> Path:
    lines = []
    for raw in source.read_text(encoding="utf-8").splitlines():
        if raw.startswith(">>> ") or not raw.strip():
            lines.append(raw)
            continue
        line = change(json.loads(raw))
        if line is not None:
            lines.append(json.dumps(line))
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


async def test_a_line_naming_no_known_subagent_is_dropped_and_logged(tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    """Subagent lines whose parent_tool_use_id names no tool call of the turn are logged (rate
    limited) and dropped: the parent's turn keeps exactly its own items and completes; the
    real subagent (its lines gone) is still a child closed by its result."""
    caplog.set_level(logging.WARNING, "t3d.providers.claude")

    def change(line: Json) -> Json:
        if line.get("parent_tool_use_id") and line.get("type") in ("assistant", "user"):
            line["parent_tool_use_id"] = "toolu_nobody"
        return line

    recording = _rewritten(SUBAGENT, tmp_path / "claude-unknown-parent.jsonl", change)
    with trio.fail_after(40):
        daemon, project = await replay(tmp_path, nursery, recording)
        (recorded,) = read_recording(recording, project)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            outcome = await run_turn(client, thread_id, recorded.prompt or "go")
            check_turn(outcome, recorded, {})  # nothing of the subagent's in the parent's turn
            [call] = outcome.of_kind("tool_call")
            child = await child_snapshot(client, call["data"]["child_thread_id"])
            assert [i["kind"] for i in child["items"]] == ["user_message"]
            assert child["turns"][0]["status"] == "completed"
        daemon.stop()
    warned = [r.getMessage() for r in caplog.records if "toolu_nobody" in r.getMessage()]
    assert warned and "started no subagent" in warned[0] and "dropped" in warned[0]


async def test_a_subagent_that_never_ends_is_closed_with_its_parents_turn(tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    """A subagent whose Agent call gets no result (the line lost) does not hold the parent: the
    parent's turn completes, and the child's turn ends with it (failed, parent_turn_ended), its
    thread idle; the session says so in the log."""
    caplog.set_level(logging.WARNING, "t3d.providers.claude")
    subs = recorded_subagents(SUBAGENT, Path("/workspace"))
    [agent_call] = subs

    def change(line: Json) -> Json | None:
        content = line.get("message", {}).get("content")
        if line.get("type") == "user" and isinstance(content, list) and any(p.get("tool_use_id") == agent_call for p in content):
            return None
        return line

    recording = _rewritten(SUBAGENT, tmp_path / "claude-no-agent-result.jsonl", change)
    with trio.fail_after(40):
        daemon, project = await replay(tmp_path, nursery, recording)
        (recorded,) = read_recording(recording, project)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            outcome = await run_turn(client, thread_id, recorded.prompt or "go")
            assert outcome.turn["status"] == "completed"
            [call] = outcome.of_kind("tool_call")
            assert call["status"] == "failed"  # it never got its result
            child = await child_snapshot(client, call["data"]["child_thread_id"])
            [turn] = child["turns"]
            assert (turn["status"], turn["reason"]) == ("failed", "parent_turn_ended")
            assert child["thread"]["status"] == "idle"
            assert all(i["status"] not in ("streaming", "running", "pending") for i in child["items"])
        daemon.stop()
    assert any("had no result when turn" in r.getMessage() for r in caplog.records)


async def test_interrupting_the_parent_ends_its_open_subagent(tmp_path: Path, nursery: trio.Nursery) -> None:
    """turn.interrupt on a subagent's thread is refused (naming its parent); interrupting the
    parent while its subagent waits on a prompt ends the parent's turn interrupted and the
    child's turn with it (interrupted), its prompt cancelled; the CLI is answered by the
    interrupt, not by a second answer."""
    with trio.fail_after(40):
        daemon, project = await replay(tmp_path, nursery, PERMISSION)
        (recorded,) = read_recording(PERMISSION, project)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            started = await client.call("turn.start", thread_id=thread_id, text=recorded.prompt or "go")
            pending: list[Json] = []
            while not pending:
                pending = (await client.call("requests.pending"))["requests"]
                await trio.sleep(0.05)
            [request] = pending
            child_id = request["thread_id"]
            with pytest.raises(RpcFailed) as refused:
                await client.call("turn.interrupt", thread_id=child_id)
            assert "subagent of thread" in str(refused.value.message) and thread_id in str(refused.value.message)
            with pytest.raises(RpcFailed) as refused:
                await client.call("turn.start", thread_id=child_id, text="hi")
            assert "subagent of thread" in str(refused.value.message)
            await client.call("turn.interrupt", thread_id=thread_id)
            while True:
                snapshot = await client.call("thread.snapshot", thread_id=thread_id)
                if snapshot["turns"][-1]["id"] == started["turn_id"] and snapshot["turns"][-1]["status"] not in ("running", "waiting", "starting"):
                    break
                await trio.sleep(0.05)
            assert snapshot["turns"][-1]["status"] == "interrupted"
            child = await child_snapshot(client, child_id)
            assert child["turns"][0]["status"] == "interrupted"
            assert child["thread"]["status"] == "idle"
            assert (await client.call("requests.pending"))["requests"] == []
        daemon.stop()


async def test_force_stopping_the_parent_ends_its_subagent_and_restart_keeps_the_tree(tmp_path: Path, nursery: trio.Nursery) -> None:
    """thread.force_stop of the subagent's own thread is refused (it runs inside the parent's
    agent), naming the thread to stop instead, and stops nothing; thread.force_stop of the
    parent while its subagent waits on a prompt ends the parent's turn cancelled (force_stop)
    and the child's turn with it, its prompt cancelled; a daemon started again on the same
    database still shows the child as a finished child of its parent."""
    with trio.fail_after(60):
        daemon, project = await replay(tmp_path, nursery, PERMISSION)
        (recorded,) = read_recording(PERMISSION, project)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            started = await client.call("turn.start", thread_id=thread_id, text=recorded.prompt or "go")
            pending: list[Json] = []
            while not pending:
                pending = (await client.call("requests.pending"))["requests"]
                await trio.sleep(0.05)
            child_id = pending[0]["thread_id"]
            with pytest.raises(RpcFailed) as refused:
                await client.call("thread.force_stop", thread_id=child_id)
            assert refused.value.code == -32002 and f"force stop thread {thread_id!r}" in str(refused.value.message)
            assert (await client.call("requests.pending"))["requests"] == pending  # nothing was stopped
            stopped = await client.call("thread.force_stop", thread_id=thread_id)
            assert stopped["turn_id"] == started["turn_id"]
            snapshot = await client.call("thread.snapshot", thread_id=thread_id, children=True)
            assert (snapshot["turns"][-1]["status"], snapshot["turns"][-1]["reason"]) == ("cancelled", "force_stop")
            child = await child_snapshot(client, child_id)
            assert (child["turns"][0]["status"], child["thread"]["status"]) == ("cancelled", "idle")
            assert [c["id"] for c in snapshot["children"]] == [child_id]
            assert (await client.call("requests.pending"))["requests"] == []
        daemon.stop()
        again = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(PERMISSION))
        async with open_client(again) as client:
            child = await child_snapshot(client, child_id)
            assert child["thread"]["parent_thread_id"] == thread_id
            assert child["turns"][0]["status"] == "cancelled"
        again.stop()


async def test_a_subagent_waiting_on_a_prompt_carries_on_across_a_daemon_restart(tmp_path: Path) -> None:
    """A daemon stopped (SIGTERM) while a subagent waits on its prompt leaves the agent running;
    the next daemon takes it over and replays the turn's output: the child thread and its turn
    are the same (no second child), its prompt is still pending, and answering it lets the
    subagent and the parent's turn complete with the tree a run without the restart has."""
    state = tmp_path / "state"
    project = project_dir(tmp_path)
    subs = recorded_subagents(PERMISSION, project)
    flags = ("--replay-fixture", str(PERMISSION), "--replay-speed", "0", "--agent-reattach-window", "60", "--checkpoints", "off")
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            async with serve(state, *flags, env=base_env()) as first:
                async with open_ws(first) as client:
                    thread_id = await new_thread(client, project)
                    started = await client.call("turn.start", thread_id=thread_id, text="go")
                    pending: list[Json] = []
                    while not pending:
                        pending = (await client.call("requests.pending"))["requests"]
                        await trio.sleep(0.05)
                pids = await provider_pids(first)
                assert len(pids) == 1
                first.process.send_signal(signal.SIGTERM)
                await first.process.wait()
            async with serve(state, *flags, env=base_env()) as second, open_ws(second) as client:
                assert [r["id"] for r in (await client.call("requests.pending"))["requests"]] == [pending[0]["id"]]
                await client.call("request.respond", request_id=pending[0]["id"], decision="allow")
                while True:
                    snapshot = await client.call("thread.snapshot", thread_id=thread_id, children=True)
                    turn = next(t for t in snapshot["turns"] if t["id"] == started["turn_id"])
                    if turn["status"] not in ("starting", "running", "waiting"):
                        break
                    await trio.sleep(0.05)
                assert turn["status"] == "completed"
                assert [c["id"] for c in snapshot["children"]] == [pending[0]["thread_id"]]
                items = [i for i in snapshot["items"] if i["turn_id"] == turn["id"]]
                await check_tree(client, turn, items, subs)
                assert sorted(await provider_pids(second)) == sorted(pids)  # taken over, not restarted
    finally:
        kill_leftovers(pids, state)


async def test_a_subagents_answer_the_cli_never_read_is_sent_again_after_a_restart(tmp_path: Path) -> None:
    """The daemon died (kill -9) after a subagent's prompt was answered in the database but
    before the answer reached the CLI: the next daemon takes the agent over, sees in the
    replay that the subagent still waits, sends the answer again, and the child and the
    parent's turn complete."""
    from reattach_support import answer_in_the_database_only

    state = tmp_path / "state"
    project = project_dir(tmp_path)
    subs = recorded_subagents(PERMISSION, project)
    flags = ("--replay-fixture", str(PERMISSION), "--replay-speed", "0", "--agent-reattach-window", "60", "--checkpoints", "off")
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            async with serve(state, *flags, env=base_env()) as first:
                async with open_ws(first) as client:
                    thread_id = await new_thread(client, project)
                    started = await client.call("turn.start", thread_id=thread_id, text="go")
                    pending: list[Json] = []
                    while not pending:
                        pending = (await client.call("requests.pending"))["requests"]
                        await trio.sleep(0.05)
                pids = await provider_pids(first)
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
            await answer_in_the_database_only(state / "t3d.sqlite", pending[0]["id"])
            async with serve(state, *flags, env=base_env()) as second, open_ws(second) as client:
                while True:
                    snapshot = await client.call("thread.snapshot", thread_id=thread_id)
                    turn = next(t for t in snapshot["turns"] if t["id"] == started["turn_id"])
                    if turn["status"] not in ("starting", "running", "waiting"):
                        break
                    await trio.sleep(0.05)
                assert turn["status"] == "completed"
                assert f"answering request {pending[0]['id']} again" in second.stderr_text()
                items = [i for i in snapshot["items"] if i["turn_id"] == turn["id"]]
                await check_tree(client, turn, items, subs)
    finally:
        kill_leftovers(pids, state)
