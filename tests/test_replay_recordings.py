"""Every Claude recording replays through the daemon to the projection the recording implies.

The expectations are read from the recording files themselves (assistant text blocks,
tool calls and their results, permission prompts, `result` lines), never typed by hand,
so the same tests hold for recordings of another CLI version. Each recording runs on the
``replay`` provider with ``replay_fixture`` set to it, through a real daemon, a real
SQLite file and the real fake-CLI subprocess.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from harness import (
    FIXTURES,
    TEST_FIXTURES,
    RpcClient,
    TurnOutcome,
    http,
    new_thread,
    open_client,
    run_turn,
    start_daemon,
)
from test_schema import validate

Json = dict[str, Any]

MULTITURN = FIXTURES / "claude-2.1.197_multiturn_tools.jsonl"
NOT_LOGGED_IN = TEST_FIXTURES / "claude-not-logged-in.stdout.jsonl"
FAKE_CLAUDE = FIXTURES.parent / "fake_claude"
DEFAULT_PROMPT = "hi"
SINGLE_TURN = [
    "claude-2.1.197_api_error_401.jsonl",
    "claude-2.1.197_resume.jsonl",
    "claude-2.1.197_flags_sessionid_model_mcp.jsonl",
    "claude-2.1.197_oneshot_bypass.stdout.jsonl",
    "claude-2.1.197_oneshot_default_noprompttool.stdout.jsonl",
    "claude-2.1.197_http529_retries.stdout.jsonl",
    "claude-2.1.197_http400.stdout.jsonl",
]


# -- reading a recording ------------------------------------------------------------------


@attrs.define
class RecordedTool:
    tool_use_id: str
    name: str
    input: Json
    result: str | None = None
    is_error: bool = False


@attrs.define
class RecordedTurn:
    """What one turn of a recording shows: from the host's user line to the CLI's `result`."""

    prompt: str | None = None
    # Text blocks of assistant lines, in order; a failure's own words too (its synthetic
    # assistant line, else its result text): a failed turn shows them as its message.
    texts: list[str] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)  # the failure's words, as the turn's error items
    tools: list[RecordedTool] = attrs.Factory(list)
    prompted: list[str] = attrs.Factory(list)  # tool names of can_use_tool prompts
    answers: list[str] = attrs.Factory(list)  # the host's allow/deny answers
    interrupted: bool = False  # the host sent an interrupt during this turn
    result: Json = attrs.Factory(dict)

    def tool(self, tool_use_id: str) -> RecordedTool:
        return next(t for t in self.tools if t.tool_use_id == tool_use_id)


def content_text(content: Any) -> str:
    """A tool result's text as the model sees it: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(
        part.get("text", "")
        for part in content
        if isinstance(part, dict) and part.get("type") == "text"
    )


def read_recording(path: Path, workspace: Path) -> list[RecordedTurn]:
    """The turns of a combined ``.jsonl`` or a ``.stdout.jsonl``, with ``/workspace`` → ``workspace``."""
    turns: list[RecordedTurn] = []
    turn = RecordedTurn()
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw.strip():
            continue
        host = raw.startswith(">>> ")
        line: Json = json.loads(raw.removeprefix(">>> ").replace("/workspace", str(workspace)))
        kind = line.get("type")
        if host:
            if kind == "user":
                turn.prompt = line["message"]["content"]
            elif kind == "control_request" and line["request"].get("subtype") == "interrupt":
                turn.interrupted = True
            elif kind == "control_response" and isinstance(line["response"].get("response"), dict):
                turn.answers.append(line["response"]["response"]["behavior"])
            continue
        if kind in ("assistant", "user") and line.get("parent_tool_use_id"):
            continue  # a subagent's line: its own work, not the turn's
        if kind == "assistant":
            message = line["message"]
            synthetic = message.get("model") == "<synthetic>" and bool(line.get("error"))
            for block in message["content"]:
                if block["type"] == "text":
                    turn.texts.append(block["text"])
                    if synthetic:
                        turn.errors.append(block["text"])
                elif block["type"] == "tool_use":
                    turn.tools.append(RecordedTool(block["id"], block["name"], block["input"]))
        elif kind == "user" and isinstance(line["message"]["content"], list):
            for part in line["message"]["content"]:
                if part.get("type") == "tool_result":
                    tool = turn.tool(part["tool_use_id"])
                    tool.result = content_text(part.get("content", ""))
                    tool.is_error = part.get("is_error") is True
        elif kind == "control_request" and line["request"].get("subtype") == "can_use_tool":
            if not line["request"].get("agent_id"):  # a subagent's prompt is its child's
                turn.prompted.append(line["request"]["tool_name"])
        elif kind == "result":
            turn.result = line
            failed = line.get("is_error") and line.get("terminal_reason") != "aborted_streaming"
            words = line.get("result") or "; ".join(line.get("errors") or [])
            if failed and not turn.errors and words:
                turn.texts.append(words)
                turn.errors.append(words)
            turns.append(turn)
            turn = RecordedTurn()
    return turns


def read_meta(recording: Path) -> Json:
    meta = recording.with_name(recording.name.split(".")[0] + ".meta.json")
    return json.loads(meta.read_text()) if meta.exists() else {}


def costs(turns: list[RecordedTurn]) -> list[float]:
    """Per-turn cost: the deltas of the CLI's cumulative ``total_cost_usd``."""
    totals = [float(t.result.get("total_cost_usd") or 0.0) for t in turns]
    return [b - a for a, b in zip([0.0, *totals], totals, strict=False)]


# -- watching the daemon ------------------------------------------------------------------


async def catch_up(client: RpcClient, seen: list[Json], sequence: int) -> None:
    """Read events until the one committed at ``sequence`` (a snapshot's) has arrived."""
    while not seen or seen[-1]["sequence"] < sequence:
        await client.wait_event(lambda d: True)


def check_turn(outcome: TurnOutcome, recorded: RecordedTurn, policy: Json) -> None:
    """The turn's projection equals what the recording shows."""
    assert outcome.assistant_text == recorded.texts
    assert [i["text"] for i in outcome.of_kind("error")] == recorded.errors
    calls = outcome.of_kind("tool_call")
    assert [c["data"]["tool_use_id"] for c in calls] == [t.tool_use_id for t in recorded.tools]
    for call, tool in zip(calls, recorded.tools, strict=True):
        assert call["title"] == tool.name
        assert call["data"]["name"] == tool.name
        assert call["data"]["input"] == tool.input
        assert call["data"]["result"] == tool.result
        assert call["data"]["is_error"] is tool.is_error
        assert call["status"] == ("failed" if tool.is_error else "completed")
    approvals = outcome.of_kind("approval_request")
    assert [a["data"]["tool_name"] for a in approvals] == recorded.prompted
    expected = [
        "allowed" if policy.get(name, "allow") == "allow" else "denied"
        for name in recorded.prompted
    ]
    assert [a["status"] for a in approvals] == expected
    # (a background task runs on after its turn: its item is the one that may still run)
    assert all(
        item["status"] not in ("streaming", "running", "pending")
        for item in outcome.items
        if item["kind"] != "background_task"
    )


def decide_by(policy: Json) -> Callable[[Json], str]:
    """Answer permission prompts as the recording host did (a tool not listed is allowed)."""
    return lambda request: str(policy.get(request["data"]["tool_name"], "allow"))


def watch_streaming(
    client: RpcClient, thread_id: str, streamed: list[str], *, interrupt: bool
) -> Callable[[Json], Any]:
    """An `on_event` that keeps the streamed assistant texts; with ``interrupt``, the first one
    sends `turn.interrupt` (as the recording host did, mid-stream)."""

    async def on_event(data: Json) -> None:
        entity = data["entity"]
        if (
            data["kind"] == "item.updated"
            and entity["kind"] == "assistant_message"
            and entity["status"] == "streaming"
        ):
            streamed.append(entity["text"])
            if interrupt and len(streamed) == 1:
                await client.call("turn.interrupt", thread_id=thread_id)

    return on_event


async def play_all_turns(
    client: RpcClient, thread_id: str, turns: list[RecordedTurn], meta: Json
) -> list[TurnOutcome]:
    """Run the recording's turns in one thread; interrupt where the recording host did."""
    outcomes = []
    policy = meta.get("policy", {})
    for number, recorded in enumerate(turns, 1):
        streamed: list[str] = []
        on_event = watch_streaming(client, thread_id, streamed, interrupt=recorded.interrupted)
        prompt = recorded.prompt or meta.get("turns", [DEFAULT_PROMPT] * number)[number - 1]
        outcome = await run_turn(
            client, thread_id, prompt, decide=decide_by(policy), on_event=on_event
        )
        if recorded.interrupted:
            assert streamed, "the interrupted turn streamed no text before its end"
            assert outcome.turn["status"] == "interrupted"
            assert outcome.turn["reason"] == "interrupt"
            (partial,) = recorded.texts
            assert all(partial.startswith(text) for text in streamed), (
                "streamed text is not a prefix of the recorded partial text"
            )
        else:
            expected = "failed" if recorded.result.get("is_error") else "completed"
            assert outcome.turn["status"] == expected, outcome.turn
        check_turn(outcome, recorded, policy)
        outcomes.append(outcome)
    return outcomes


def project_dir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    (path / "notes.txt").write_text("hello\n")
    return path.resolve()


# -- the recordings -----------------------------------------------------------------------


async def replay_multiturn(
    tmp_path: Path, nursery: trio.Nursery, recording: Path
) -> list[TurnOutcome]:
    project = project_dir(tmp_path)
    turns = read_recording(recording, project)
    meta = read_meta(MULTITURN)  # prompts and policy; a variant of it has no meta file of its own
    daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(recording))
    async with open_client(daemon) as client:
        seen = client.record_events()
        thread_id = await new_thread(client, project)
        outcomes = await play_all_turns(client, thread_id, turns, meta)

        # The stored thread is what the live events said, item for item.
        snapshot = await client.call("thread.snapshot", thread_id=thread_id)
        await catch_up(client, seen, snapshot["sequence"])
    live_items: dict[str, Json] = {}
    live_turns: dict[str, Json] = {}
    for data in seen:
        if data["kind"] == "item.updated":
            live_items[data["entity"]["id"]] = data["entity"]
        elif data["kind"] == "turn.updated":
            live_turns[data["entity"]["id"]] = data["entity"]
    assert snapshot["items"] == sorted(
        live_items.values(),
        key=lambda i: ([t["id"] for t in snapshot["turns"]].index(i["turn_id"]), i["ordinal"]),
    )
    assert snapshot["turns"] == sorted(live_turns.values(), key=lambda t: t["ordinal"])
    assert snapshot["requests"] == []

    # Costs are per turn, although the CLI reports a running total.
    assert [o.turn["cost_usd"] for o in outcomes] == [
        pytest.approx(c, abs=1e-9) for c in costs(turns)
    ]
    daemon.stop()
    return outcomes


async def test_multiturn_tools_replays_every_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    """The five-turn recording (Read; Edit allowed; Bash denied; COUNT interrupted; ok) projects
    to its texts, tool calls, approvals and per-turn costs, and the snapshot equals the live events."""
    with trio.fail_after(30):
        turns = read_recording(MULTITURN, Path("/w"))
        # The recording is the one described in its README.
        assert [[tool.name for tool in t.tools] for t in turns] == [
            ["Read"],
            ["Edit"],
            ["Bash"],
            [],
            [],
        ]
        assert [t.prompted for t in turns] == [[], ["Edit"], ["Bash"], [], []]
        assert [t.interrupted for t in turns] == [False, False, False, True, False]
        assert turns[0].result["total_cost_usd"] == 0.003635
        outcomes = await replay_multiturn(tmp_path, nursery, MULTITURN)
        assert outcomes[0].turn["cost_usd"] == pytest.approx(0.003635)
        assert outcomes[2].of_kind("tool_call")[0]["data"]["is_error"] is True


async def test_a_looping_replay_plays_the_recording_again(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The replay provider loops: turns 6-10 of a thread replay turns 1-5 with the same texts,
    tool calls and prompts, although the recording's permission-prompt ids repeat."""
    with trio.fail_after(30):
        project = project_dir(tmp_path)
        turns = read_recording(MULTITURN, project)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(MULTITURN))
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            outcomes = await play_all_turns(client, thread_id, turns + turns, read_meta(MULTITURN))
        requests = [r["id"] for o in outcomes for r in o.requests]
        assert len(requests) == len(set(requests)) == 4
        daemon.stop()


@pytest.mark.parametrize("name", SINGLE_TURN)
async def test_single_turn_recording_replays(
    tmp_path: Path, nursery: trio.Nursery, name: str
) -> None:
    """A one-turn recording ends as its `result` says (completed, or failed with the result
    text as the error) with the recorded assistant text, error text and tool calls."""
    with trio.fail_after(15):
        recording = FIXTURES / name
        project = project_dir(tmp_path)
        (recorded,) = read_recording(recording, project)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(recording))
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            outcome = await run_turn(
                client,
                thread_id,
                recorded.prompt or DEFAULT_PROMPT,
                decide=decide_by(read_meta(recording).get("policy", {})),
            )
        if recorded.result["is_error"]:
            assert outcome.turn["status"] == "failed"
            assert outcome.turn["error"] == recorded.result["result"]
            # The reason names the failure, never the result's "success" subtype.
            assert outcome.turn["reason"] and "success" not in outcome.turn["reason"].split(":")
        else:
            assert outcome.turn["status"] == "completed"
            assert outcome.turn["error"] is None
        check_turn(outcome, recorded, read_meta(recording).get("policy", {}))
        assert outcome.turn["cost_usd"] == pytest.approx(costs([recorded])[0])
        daemon.stop()


def test_every_recording_has_a_replay_test() -> None:
    """Every Claude recording in replay_fixtures/claude/ is replayed by a test here."""

    def run(path: Path) -> str:
        return path.name.removesuffix(".jsonl").removesuffix(".stdout")

    covered = (
        {run(MULTITURN)}
        | {run(Path(name)) for name in SINGLE_TURN}
        | {run(p) for p in BACKGROUND}
        | {run(Path(name)) for name in SUBAGENTS}
    )
    assert {run(p) for p in FIXTURES.glob("*.jsonl")} == covered


# -- background work: wakes, tasks, steering ------------------------------------------------

BASH_WAKE = FIXTURES / "claude-2.1.197_background_bash_wake.jsonl"
AGENT_REPORT = FIXTURES / "claude-2.1.197_background_agent_report.jsonl"
STOP_RESUME = FIXTURES / "claude-2.1.197_background_agent_stop_resume.jsonl"
STEER_INTERRUPTED = FIXTURES / "claude-2.1.197_steer_interrupted.jsonl"
NESTED_WAKE = FIXTURES / "claude-2.1.197_background_nested_wake.jsonl"
STEER = FIXTURES / "claude-2.1.197_steer.jsonl"
BACKGROUND = [BASH_WAKE, AGENT_REPORT, STOP_RESUME, NESTED_WAKE, STEER, STEER_INTERRUPTED]
# Foreground subagents as child threads: replayed in test_subagent_threads.py.
SUBAGENTS = [
    "claude-2.1.197_subagent.jsonl",
    "claude-2.1.197_subagent_nested.jsonl",
    "claude-2.1.197_subagent_permission.jsonl",
]
# The CLI's task states as item statuses (t3d/providers/claude/tasks.py).
TASK_STATUS = {
    "completed": "completed",
    "failed": "failed",
    "killed": "stopped",
    "stopped": "stopped",
}


@attrs.define
class RecordedTask:
    task_id: str
    description: str
    status: str  # the last state the recording gives it (task_updated, task_notification)


def recorded_tasks(path: Path) -> list[RecordedTask]:
    """The background tasks a recording starts, in order, with their final states."""
    tasks: dict[str, RecordedTask] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.startswith(">>> ") or not raw.strip():
            continue
        line = json.loads(raw)
        if line.get("type") != "system":
            continue
        task_id = line.get("task_id")
        if line.get("subtype") == "task_started":
            tasks[task_id] = RecordedTask(task_id, line["description"], "running")
        elif line.get("subtype") == "task_updated" and "status" in line["patch"]:
            tasks[task_id].status = line["patch"]["status"]
        elif line.get("subtype") == "task_notification":
            tasks[task_id].status = line["status"]
    return list(tasks.values())


class Watched:
    """Every turn and item of a thread as the live events say, kept while the test runs."""

    def __init__(self, client: RpcClient) -> None:
        self.client = client
        self.seen = client.record_events()
        self.daemon: Any = None

    def turns(self) -> list[Json]:
        latest: dict[str, Json] = {}
        for data in self.seen:
            if data["kind"] == "turn.updated":
                latest[data["entity"]["id"]] = data["entity"]
        return sorted(latest.values(), key=lambda t: t["ordinal"])

    def items(self, turn_id: str | None = None, kind: str | None = None) -> list[Json]:
        latest: dict[str, Json] = {}
        for data in self.seen:
            if data["kind"] == "item.updated":
                latest[data["entity"]["id"]] = data["entity"]
        found = [
            i
            for i in latest.values()
            if turn_id in (None, i["turn_id"]) and kind in (None, i["kind"])
        ]
        return sorted(found, key=lambda i: (i["turn_id"], i["ordinal"]))

    def threads(self) -> list[Json]:
        return [d["entity"] for d in self.seen if d["kind"] == "thread.updated"]

    async def until(self, done: Callable[[Watched], bool]) -> None:
        while not done(self):
            await self.client.wait_event(lambda d: True)

    async def finished_turns(self, count: int) -> list[Json]:
        """Wait until ``count`` turns have ended; return every turn."""
        await self.until(
            lambda w: sum(t["status"] in TERMINAL_STATUSES for t in w.turns()) >= count
        )
        return self.turns()


TERMINAL_STATUSES = {"completed", "failed", "interrupted", "cancelled"}


def texts_of(watched: Watched, turn: Json) -> list[str]:
    return [i["text"] for i in watched.items(turn["id"], "assistant_message")]


async def replay_background(
    tmp_path: Path, nursery: trio.Nursery, recording: Path, **settings: Any
) -> tuple[list[RecordedTurn], Watched, str, RpcClient]:
    project = project_dir(tmp_path)
    turns = read_recording(recording, project)
    daemon = await start_daemon(
        nursery, tmp_path / "state", replay_fixture=str(recording), **settings
    )
    client = await nursery_client(nursery, daemon)
    watched = Watched(client)
    watched.daemon = daemon
    thread_id = await new_thread(client, project)
    return turns, watched, thread_id, client


async def nursery_client(nursery: trio.Nursery, daemon: Any) -> RpcClient:
    """A client that lives as long as the test's nursery (closed before the daemon stops)."""

    async def hold(task_status: trio.TaskStatus[RpcClient] = trio.TASK_STATUS_IGNORED) -> None:
        async with open_client(daemon) as client:
            task_status.started(client)
            await trio.sleep_forever()

    return await nursery.start(hold)  # type: ignore[no-any-return]


def check_provider_turns(
    watched: Watched, recorded: list[RecordedTurn], *, wakes: int
) -> list[Json]:
    """Every recorded `result` is one turn, in order: the user's as prompted, the wakes as
    turns the provider started, each with the recorded texts and per-turn costs."""
    turns = watched.turns()
    assert len(turns) == len(recorded)
    assert [t["started_by"] for t in turns] == [
        "user" if r.prompt else "provider" for r in recorded
    ]
    assert sum(t["started_by"] == "provider" for t in turns) == wakes
    for turn, want in zip(turns, recorded, strict=True):
        assert turn["status"] == "completed", turn
        assert texts_of(watched, turn) == want.texts
    assert [t["cost_usd"] for t in turns] == [pytest.approx(c, abs=1e-9) for c in costs(recorded)]
    return turns


def check_tasks(
    watched: Watched, recording: Path, *, running: set[str] = frozenset()
) -> list[Json]:  # type: ignore[assignment]
    """Every background task of the recording is an item with its final status, and the thread
    lists the ones still running."""
    tasks = watched.items(kind="background_task")
    expected = recorded_tasks(recording)
    assert [t["data"]["task_id"] for t in sorted(tasks, key=lambda t: t["updated_at"])] != []
    by_id = {t["data"]["task_id"]: t for t in tasks}
    assert sorted(by_id) == sorted(t.task_id for t in expected)
    for want in expected:
        item = by_id[want.task_id]
        assert item["title"] == want.description
        status = "running" if want.task_id in running else TASK_STATUS[want.status]
        assert item["status"] == status, (want, item)
    listed = watched.threads()[-1]["running_tasks"]
    assert sorted(listed) == sorted(by_id[t]["id"] for t in running)
    return tasks


async def test_a_background_bash_commands_wake_is_a_turn_the_provider_started(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Background Bash (PROTOCOLS.md §1.3 task lines): the turn ends with the command running
    (a background task item, listed by the thread); the command's end completes the item, and
    the CLI's wake after it (no user message before it) is a turn started by the provider,
    recorded and streamed like any turn, its origin the task's notification, ended by its
    result."""
    with trio.fail_after(30):
        recorded, watched, thread_id, client = await replay_background(tmp_path, nursery, BASH_WAKE)
        first = await run_turn(client, thread_id, recorded[0].prompt or "")
        check_turn(first, recorded[0], {})
        [task] = first.of_kind("background_task")
        assert task["status"] == "running" and task["data"]["task_type"] == "local_bash"
        await watched.finished_turns(2)
        turns = check_provider_turns(watched, recorded, wakes=1)
        wake = turns[1]
        [(task_id, summary)] = [(t.task_id, t.description) for t in recorded_tasks(BASH_WAKE)]
        assert wake["origin"]["kind"] == "task_notification"
        assert [t["task_id"] for t in wake["origin"]["tasks"]] == [task_id]
        [notice] = watched.items(wake["id"], "wake")
        assert notice["ordinal"] == 1 and summary in notice["title"]
        [done] = check_tasks(watched, BASH_WAKE)
        assert done["turn_id"] == first.turn["id"]  # in the turn that started it
        assert "completed" in done["text"]
        # A task listed while it ran, then no longer.
        assert {tuple(t["running_tasks"]) for t in watched.threads()} == {(task["id"],), ()}
        snapshot = await client.call("thread.snapshot", thread_id=thread_id)
        assert snapshot["tasks"] == [] and snapshot["thread"]["status"] == "idle"
        assert [t["started_by"] for t in snapshot["turns"]] == ["user", "provider"]


async def test_a_background_agent_reports_through_its_task_and_a_wake(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A background subagent keeps writing after its turn's result (lines with its
    parent_tool_use_id): that is its task's output, not a turn; its end completes the task and
    the wake that follows is a provider-started turn whose origin is the agent's notification
    (not the notification of a command the agent ran itself)."""
    with trio.fail_after(30):
        recorded, watched, thread_id, client = await replay_background(
            tmp_path, nursery, AGENT_REPORT
        )
        first = await run_turn(client, thread_id, recorded[0].prompt or "")
        check_turn(first, recorded[0], {})
        await watched.finished_turns(2)
        turns = check_provider_turns(watched, recorded, wakes=1)
        tasks = check_tasks(watched, AGENT_REPORT)
        agent = next(t for t in tasks if t["data"]["task_type"] == "local_agent")
        assert agent["data"]["output"] == "Waiting a moment.\nThe slow check is done: slow-done"
        assert {t["turn_id"] for t in tasks} == {first.turn["id"]}
        assert [t["task_id"] for t in turns[1]["origin"]["tasks"]] == [agent["data"]["task_id"]]


async def test_a_background_agent_stopped_and_resumed(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A long background agent is listed by the thread (the snapshot's tasks, the shell row)
    after its turn ended; TaskStop makes it stopped, SendMessage makes it run again until it
    completes; each end wakes the agent (a provider-started turn)."""
    with trio.fail_after(45):
        recorded, watched, thread_id, client = await replay_background(
            tmp_path, nursery, STOP_RESUME
        )
        prompts = [t.prompt for t in recorded if t.prompt]
        first = await run_turn(client, thread_id, prompts[0] or "")
        [agent] = [
            t for t in first.of_kind("background_task") if t["data"]["task_type"] == "local_agent"
        ]
        # Its turn is over and the thread idle, but the thread lists what still runs on it.
        snapshot = await client.call("thread.snapshot", thread_id=thread_id)
        assert agent["id"] in [t["id"] for t in snapshot["tasks"]]
        assert (
            snapshot["thread"]["status"] == "idle"
            and agent["id"] in snapshot["thread"]["running_tasks"]
        )
        status, shell = await http(watched.daemon, "GET", "/api/shell")
        assert status == 200
        [row] = [t for t in shell["threads"] if t["id"] == thread_id]
        assert agent["id"] in row["running_tasks"]
        await run_turn(client, thread_id, prompts[1] or "")
        await watched.finished_turns(3)  # and the wake the stop causes
        third = await run_turn(client, thread_id, prompts[2] or "")
        await watched.finished_turns(len(recorded))
        turns = check_provider_turns(watched, recorded, wakes=2)
        assert turns[3]["id"] == third.turn["id"]
        check_tasks(watched, STOP_RESUME)
        statuses = [
            d["entity"]["status"]
            for d in watched.seen
            if d["kind"] == "item.updated" and d["entity"]["id"] == agent["id"]
        ]
        assert "stopped" in statuses and statuses[-1] == "completed"
        assert statuses.index("stopped") < len(statuses) - 1 - statuses[::-1].index("running")
        assert [t["status"] for t in turns[2]["origin"]["tasks"]] == ["stopped"]
        assert [t["status"] for t in turns[4]["origin"]["tasks"]] == ["completed"]


async def test_an_idle_agent_with_a_task_running_is_not_stopped_for_idleness(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """provider_idle_timeout counts only while no background task runs: after its turn, an
    agent whose background subagent still works keeps its process well past the timeout; once
    the task is stopped (and its wake is over) the idle agent is stopped as usual."""
    with trio.fail_after(45):
        recorded, watched, thread_id, client = await replay_background(
            tmp_path, nursery, STOP_RESUME, provider_idle_timeout=0.3
        )
        prompts = [t.prompt for t in recorded if t.prompt]

        def exited(w: Watched) -> bool:
            return any(
                d["kind"] == "session.updated" and d["entity"]["status"] == "exited" for d in w.seen
            )

        await run_turn(client, thread_id, prompts[0] or "")
        with trio.move_on_after(3.0):  # ten idle timeouts
            await watched.until(exited)
        assert not exited(watched), "an agent with a background task running was stopped as idle"
        assert watched.threads()[-1]["running_tasks"]
        await run_turn(client, thread_id, prompts[1] or "")  # TaskStop: the task ends, a wake
        await watched.until(lambda w: not w.threads()[-1]["running_tasks"])
        await watched.finished_turns(3)
        await watched.until(exited)


async def test_a_wake_that_starts_background_work_wakes_again(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Nested wakes: a wake starts another background command, whose end wakes the agent
    again: three results for one user message are three turns, the second task in the wake
    that started it."""
    with trio.fail_after(30):
        recorded, watched, thread_id, client = await replay_background(
            tmp_path, nursery, NESTED_WAKE
        )
        first = await run_turn(client, thread_id, recorded[0].prompt or "")
        await watched.finished_turns(3)
        turns = check_provider_turns(watched, recorded, wakes=2)
        tasks = sorted(
            check_tasks(watched, NESTED_WAKE),
            key=lambda t: t["data"]["task_id"] != recorded_tasks(NESTED_WAKE)[0].task_id,
        )
        assert [t["turn_id"] for t in tasks] == [first.turn["id"], turns[1]["id"]]
        assert [[t["task_id"] for t in turn["origin"]["tasks"]] for turn in turns[1:]] == [
            [t.task_id for t in recorded_tasks(NESTED_WAKE)][:1],
            [t.task_id for t in recorded_tasks(NESTED_WAKE)][1:],
        ]


async def test_a_message_steered_into_a_running_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    """turn.start with delivery steer on a busy thread writes the message at once and shows it
    in the running turn; 2.1.197 answers it after the running turn's result, so the turn goes
    on until the steered message's own result: one turn, both answers, both results' cost."""
    with trio.fail_after(30):
        recorded, _, thread_id, client = await replay_background(tmp_path, nursery, STEER)
        steered_text = STEER.read_text().splitlines()
        steered = [
            json.loads(line[4:])["message"]["content"]
            for line in steered_text
            if line.startswith('>>> {"type":"user"')
        ][1]
        replies: list[Json] = []

        async def steer_once(data: Json) -> None:
            if (
                data["kind"] == "item.updated"
                and data["entity"]["kind"] == "assistant_message"
                and not replies
            ):
                replies.append(
                    await client.call(
                        "turn.start", thread_id=thread_id, text=steered, delivery="steer"
                    )
                )

        outcome = await run_turn(client, thread_id, recorded[0].prompt or "", on_event=steer_once)
        [reply] = replies
        assert reply["delivery"] == "steer" and reply["turn_id"] == outcome.turn["id"]
        assert outcome.turn["status"] == "completed"
        assert outcome.assistant_text == recorded[0].texts + recorded[1].texts
        users = outcome.of_kind("user_message")
        assert [u["text"] for u in users] == [recorded[0].prompt, steered]
        assert users[1]["id"] == reply["item_id"] and users[1]["data"]["delivery"] == "steer"
        assert outcome.turn["cost_usd"] == pytest.approx(sum(costs(recorded)))
        snapshot = await client.call("thread.snapshot", thread_id=thread_id)
        assert len(snapshot["turns"]) == 1
        # Steering a thread with no running turn starts an ordinary turn, and says so.
        idle = await client.call("turn.start", thread_id=thread_id, text="Say ok", delivery="steer")
        assert idle["delivery"] == "queue" and "no running turn" in idle["note"]
        for result in (reply, idle):  # both shapes as the API's schema has them
            validate("TurnStartResult", result)


async def test_a_steered_message_the_cli_answers_after_an_interrupt_is_a_wake(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A message is steered into a turn, which is then interrupted before its result (the
    recording shows 2.1.197 still answers the message afterwards, as a turn of its own with no
    user message before it): the turn ends interrupted, and the answer is not dropped: a turn
    the provider started, whose origin says it answers a steered message."""
    with trio.fail_after(45):
        recorded, watched, thread_id, client = await replay_background(
            tmp_path, nursery, STEER_INTERRUPTED
        )
        steered = [
            json.loads(line[4:])["message"]["content"]
            for line in STEER_INTERRUPTED.read_text().splitlines()
            if line.startswith('>>> {"type":"user"')
        ][1]
        replies: list[Json] = []

        async def steer_then_interrupt(data: Json) -> None:
            if (
                data["kind"] == "item.updated"
                and data["entity"]["kind"] == "assistant_message"
                and not replies
            ):
                replies.append(
                    await client.call(
                        "turn.start", thread_id=thread_id, text=steered, delivery="steer"
                    )
                )
                await client.call("turn.interrupt", thread_id=thread_id)

        outcome = await run_turn(
            client, thread_id, recorded[0].prompt or "", on_event=steer_then_interrupt
        )
        assert replies[0]["delivery"] == "steer"
        assert outcome.turn["status"] == "interrupted"
        [_, steer_item] = outcome.of_kind("user_message")
        assert steer_item["text"] == steered
        turns = await watched.finished_turns(2)
        assert [t["started_by"] for t in turns] == ["user", "provider"]
        assert turns[1]["origin"] == {"kind": "steered_message"}
        assert turns[1]["status"] == "completed"
        [notice] = watched.items(turns[1]["id"], "wake")
        assert "steered" in notice["title"]
        assert texts_of(watched, turns[1]) == ["ok"]  # the recorded answer


async def test_an_api_error_speaks_in_the_clis_own_words(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A 401 from the model API: the CLI's text is the turn's assistant message and its error
    item, the turn's error, and the reason names it (api_error_401:auth_error), never success."""
    with trio.fail_after(20):
        recording = FIXTURES / "claude-2.1.197_api_error_401.jsonl"
        project = project_dir(tmp_path)
        (recorded,) = read_recording(recording, project)
        assert (
            recorded.result["subtype"] == "success" and recorded.result["api_error_status"] == 401
        )
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(recording))
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            outcome = await run_turn(client, thread_id, recorded.prompt or "")
        words = recorded.result["result"]
        assert (outcome.turn["status"], outcome.turn["error"], outcome.turn["reason"]) == (
            "failed",
            words,
            "api_error_401:auth_error",
        )
        assert outcome.assistant_text == [words]
        [error] = outcome.of_kind("error")
        assert (error["text"], error["status"], error["data"]["error"]) == (
            words,
            "failed",
            "authentication_failed",
        )
        daemon.stop()


# -- no credentials -------------------------------------------------------------------------


def write_fake_claude(tmp_path: Path, fixture: Path) -> Path:
    """A `claude` binary that replays ``fixture`` at full speed (for the ``claude`` provider)."""
    script = tmp_path / "claude"
    script.write_text(
        f"#!/bin/sh\nT3D_REPLAY_FIXTURE='{fixture}' T3D_REPLAY_SPEED=0 exec '{sys.executable}' '{FAKE_CLAUDE}' \"$@\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


async def test_not_logged_in_fails_the_turn_and_the_daemon_stays_healthy(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A CLI without credentials (PROTOCOLS.md §1.5) fails the turn with its own words as the
    error; the daemon keeps serving: health is 200 and another thread still completes a turn."""
    with trio.fail_after(20):
        project = project_dir(tmp_path)
        (recorded,) = read_recording(NOT_LOGGED_IN, project)
        daemon = await start_daemon(
            nursery, tmp_path / "state", claude_bin=str(write_fake_claude(tmp_path, NOT_LOGGED_IN))
        )
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project, provider="claude")
            outcome = await run_turn(client, thread_id, "hello")
            assert outcome.turn["status"] == "failed"
            assert (
                outcome.turn["error"]
                == "Not logged in · Please run /login"
                == recorded.result["result"]
            )
            assert [i["text"] for i in outcome.of_kind("error")] == [
                "Not logged in · Please run /login"
            ]
            # The CLI's own words are the turn's message, and the reason names the failure.
            assert outcome.assistant_text == ["Not logged in · Please run /login"]
            assert outcome.turn["reason"] == "auth_error"

            status, body = await http(daemon, "GET", "/api/health", token=False)
            assert status == 200, body
            other = await new_thread(client, project)
            healthy = await run_turn(client, other, "Please READ notes.txt")
            assert healthy.turn["status"] == "completed"
            assert healthy.assistant_text == read_recording(MULTITURN, project)[0].texts
        daemon.stop()


# -- another CLI version --------------------------------------------------------------------

# ~39 KB: SessionStart hook output can be tens of KB per line (PROTOCOLS.md §1.7).
HOOK_OUTPUT = "hook says hi\n" * 3000


def newer_cli_variant(original: Path, target: Path) -> int:
    """Rewrite a 2.1.197 transcript the way later CLIs (2.1.276+, PROTOCOLS.md §1.3) write theirs:
    new fields on init/assistant/result/tool blocks, hook and thinking-token system lines, a
    `rate_limit_event`, unknown `keep_alive` lines and the newer interrupt reply shape."""
    out: list[str] = []
    result_index = 0
    for raw in original.read_text(encoding="utf-8").splitlines():
        if raw.startswith(">>> "):
            out.append(raw)
            continue
        line: Json = json.loads(raw)
        kind, subtype = line.get("type"), line.get("subtype")
        session = line.get("session_id", "")
        if kind == "system" and subtype == "init":
            for hook in ("hook_started", "hook_progress", "hook_response"):
                out.append(
                    json.dumps(
                        {
                            "type": "system",
                            "subtype": hook,
                            "hook_id": "h1",
                            "hook_name": "SessionStart:startup",
                            "hook_event": "SessionStart",
                            "output": HOOK_OUTPUT,
                            "stdout": HOOK_OUTPUT,
                            "stderr": "",
                            "exit_code": 0,
                            "outcome": "success",
                            "uuid": f"u-{hook}",
                            "session_id": session,
                        }
                    )
                )
            line |= {
                "capabilities": [
                    "interrupt_receipt_v1",
                    "interrupt_cancel_queued_v1",
                    "msg_lifecycle_v1",
                ],
                "terminal_slash_commands": ["exit", "quit"],
                "messaging_socket_path": "/tmp/claude-msg.sock",
                "fast_mode_disabled_reason": None,
                "per_turn_effort_active": False,
                "view_mode": "default",
            }
            out.append(json.dumps(line))
            out.append(
                json.dumps(
                    {
                        "type": "rate_limit_event",
                        "rate_limit_info": {
                            "status": "allowed",
                            "resetsAt": 1900000000,
                            "rateLimitType": "five_hour",
                            "unifiedWindows": {},
                        },
                        "uuid": "u-rl",
                        "session_id": session,
                    }
                )
            )
            out.append(json.dumps({"type": "keep_alive"}))
            continue
        if kind == "system" and subtype == "status":
            out.append(json.dumps(line))
            out.append(
                json.dumps(
                    {
                        "type": "system",
                        "subtype": "thinking_tokens",
                        "estimated_tokens": 50,
                        "estimated_tokens_delta": 50,
                        "session_id": session,
                    }
                )
            )
            out.append(json.dumps({"type": "keep_alive"}))
            continue
        if kind == "stream_event":
            block = line["event"].get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                block["caller"] = {"type": "direct"}
        elif kind == "assistant":
            line["timestamp"] = "2027-01-01T00:00:00.000Z"
            line["wire_tool_inputs"] = {}
            for block in line["message"]["content"]:
                if block.get("type") == "tool_use":
                    block["caller"] = {"type": "direct"}
        elif kind == "control_response" and "response" not in line["response"]:
            line["response"]["response"] = {"still_queued": []}  # how 2.1.276 answers an interrupt
        elif kind == "result":
            line |= {
                "result_index": result_index,
                "queued_turn_count": 0,
                "subagent_stats": {},
                "fast_mode_disabled_reason": None,
                "output_tokens_details": {"thinking_tokens": 0},
                "first_content_frame_ms": 12,
                "structured_output": None,
            }
            result_index += 1
        out.append(json.dumps(line, ensure_ascii=False))
    text = "\n".join(out) + "\n"
    target.write_text(text, encoding="utf-8")
    return len(text) - len(original.read_text(encoding="utf-8"))  # characters added


async def test_a_newer_cli_transcript_replays_to_the_same_projection(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Fields and line types a newer CLI adds (result_index, capabilities, hook lines of ~40 KB,
    keep_alive, rate_limit_event, the newer interrupt reply) change nothing in what users see."""
    with trio.fail_after(30):
        variant = tmp_path / "claude-2.1.284_multiturn_tools.jsonl"
        added = newer_cli_variant(MULTITURN, variant)
        assert added > 5 * 3 * len(HOOK_OUTPUT)  # five turns, three hook lines each
        before, after = read_recording(MULTITURN, tmp_path), read_recording(variant, tmp_path)
        assert [(t.texts, t.tools, t.prompted, t.interrupted) for t in after] == [
            (t.texts, t.tools, t.prompted, t.interrupted) for t in before
        ]
        outcomes = await replay_multiturn(tmp_path, nursery, variant)
        assert [o.turn["status"] for o in outcomes] == [
            "completed",
            "completed",
            "completed",
            "interrupted",
            "completed",
        ]
