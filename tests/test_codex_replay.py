"""Every Codex recording replays through the daemon to the projection the recording implies.

The expectations are read from the recording files themselves (the agent messages' final
text, the commands with their exit codes and output, the approvals and the host's
decisions, the interrupts, Codex's token totals), never typed by hand. Each recording
runs on the ``replay-codex`` provider with ``replay_codex_fixture`` set to it, through a
real daemon, a real SQLite file and the fake ``codex`` as a real subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from harness import RpcClient, TurnOutcome, new_thread, open_client, run_turn, start_daemon

Json = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
CODEX = REPO / "replay_fixtures" / "codex"
FAKE_CODEX = REPO / "replay_fixtures" / "fake_codex"
MULTITURN = CODEX / "codex-0.171.0_app-server_multiturn.jsonl"
DECLINED = CODEX / "codex-0.171.0_app-server_command_declined.jsonl"
ERROR_PATHS = CODEX / "codex-0.171.0_app-server_error_paths.jsonl"
DECISIONS = {"accept": "allow", "acceptForSession": "allow_session", "decline": "deny", "cancel": "cancel"}


# -- reading a recording ------------------------------------------------------------------


@attrs.define
class RecordedCommand:
    command: str
    status: str
    exit_code: int | None
    output: str | None


@attrs.define
class RecordedTurn:
    """One turn of a recording: from the host's turn/start to Codex's turn/completed."""

    prompt: str
    texts: list[str] = attrs.Factory(list)  # agentMessage item/completed texts, in order
    deltas: str = ""  # every agentMessage delta, joined
    commands: list[RecordedCommand] = attrs.Factory(list)
    approvals: list[str] = attrs.Factory(list)  # approval request methods
    decisions: list[str] = attrs.Factory(list)  # the host's answers to them
    interrupted: bool = False
    status: str = ""
    tokens_before: int = 0
    tokens_after: int = 0

    @property
    def tokens(self) -> int:
        return self.tokens_after - self.tokens_before


def read_recording(path: Path, workspace: Path) -> list[RecordedTurn]:
    turns: list[RecordedTurn] = []
    tokens = 0
    for raw in path.read_text().splitlines():
        host = raw.startswith(">>> ")
        line: Json = json.loads(raw.removeprefix(">>> ").replace("/workspace", str(workspace)))
        method, params = line.get("method"), line.get("params") or {}
        if host:
            if method == "turn/start":
                turns.append(RecordedTurn(params["input"][0]["text"], tokens_before=tokens, tokens_after=tokens))
            elif method == "turn/interrupt":
                turns[-1].interrupted = True
            elif "result" in line and isinstance(line["result"].get("decision"), str):
                turns[-1].decisions.append(line["result"]["decision"])
            continue
        if not turns:
            continue
        turn = turns[-1]
        if method == "item/completed" and params["item"]["type"] == "agentMessage":
            turn.texts.append(params["item"]["text"])
        elif method == "item/completed" and params["item"]["type"] == "commandExecution":
            item = params["item"]
            turn.commands.append(RecordedCommand(item["command"], item["status"], item["exitCode"], item["aggregatedOutput"]))
        elif method == "item/agentMessage/delta":
            turn.deltas += params["delta"]
        elif method and "id" in line:
            turn.approvals.append(method)
        elif method == "thread/tokenUsage/updated":
            tokens = turn.tokens_after = params["tokenUsage"]["total"]["totalTokens"]
        elif method == "turn/completed":
            turn.status = params["turn"]["status"]
    return turns


# -- checking the daemon ------------------------------------------------------------------


def decide_as_recorded(turn: RecordedTurn) -> Callable[[Json], str]:
    answers = iter(turn.decisions)
    return lambda request: DECISIONS[next(answers)]


def interrupt_on_first_text(client: RpcClient, thread_id: str, streamed: list[str]) -> Callable[[Json], Any]:
    async def on_event(data: Json) -> None:
        entity = data["entity"]
        if data["kind"] == "item.updated" and entity["kind"] == "assistant_message" and entity["status"] == "streaming":
            streamed.append(entity["text"])
            if len(streamed) == 1:
                await client.call("turn.interrupt", thread_id=thread_id)

    return on_event


def check_turn(outcome: TurnOutcome, recorded: RecordedTurn) -> None:
    """The turn's projection equals what the recording shows."""
    commands = outcome.of_kind("command")
    assert [c["title"] for c in commands] == [r.command for r in recorded.commands]
    for item, command in zip(commands, recorded.commands, strict=True):
        assert item["data"]["exit_code"] == command.exit_code
        assert item["data"]["output"] == (command.output or "")
        assert item["data"]["status"] == command.status
        assert item["status"] == ("completed" if command.status == "completed" and command.exit_code == 0 else "failed")
    approvals = outcome.of_kind("approval_request")
    assert len(approvals) == len(recorded.approvals)
    expected = ["allowed" if d in ("accept", "acceptForSession") else "denied" for d in recorded.decisions]
    assert [a["status"] for a in approvals] == expected
    assert [r["decision"] for r in outcome.requests] == [DECISIONS[d] for d in recorded.decisions]
    assert outcome.turn["usage"]["total_tokens"] == recorded.tokens
    assert outcome.turn["cost_usd"] is None  # Codex reports no cost
    assert all(item["status"] not in ("streaming", "running", "pending") for item in outcome.items)


async def play_all_turns(client: RpcClient, thread_id: str, turns: list[RecordedTurn]) -> list[TurnOutcome]:
    outcomes = []
    for recorded in turns:
        streamed: list[str] = []
        on_event = interrupt_on_first_text(client, thread_id, streamed) if recorded.interrupted else None
        outcome = await run_turn(client, thread_id, recorded.prompt, decide=decide_as_recorded(recorded), on_event=on_event)
        if recorded.interrupted:
            assert streamed, "the interrupted turn streamed no text before its end"
            assert (outcome.turn["status"], outcome.turn["reason"]) == ("interrupted", "interrupt")
            (partial,) = outcome.assistant_text
            assert partial and recorded.deltas.startswith(partial)
        else:
            assert outcome.turn["status"] == recorded.status == "completed", outcome.turn
            assert outcome.assistant_text == recorded.texts
        check_turn(outcome, recorded)
        outcomes.append(outcome)
    return outcomes


def project_dir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    (path / "README.md").write_text("hello\n")
    return path.resolve()


async def replay(tmp_path: Path, nursery: trio.Nursery, recording: Path, **settings: Any) -> list[TurnOutcome]:
    project = project_dir(tmp_path)
    turns = read_recording(recording, project)
    daemon = await start_daemon(nursery, tmp_path / "state", replay_codex_fixture=str(recording), **settings)
    async with open_client(daemon) as client:
        seen = client.record_events()
        thread_id = await new_thread(client, project, provider="replay-codex")
        outcomes = await play_all_turns(client, thread_id, turns)
        snapshot = await client.call("thread.snapshot", thread_id=thread_id)
        while not seen or seen[-1]["sequence"] < snapshot["sequence"]:
            await client.wait_event(lambda d: True)
    live_items = {d["entity"]["id"]: d["entity"] for d in seen if d["kind"] == "item.updated"}
    turn_order = [t["id"] for t in snapshot["turns"]]
    assert snapshot["items"] == sorted(live_items.values(), key=lambda i: (turn_order.index(i["turn_id"]), i["ordinal"]))
    assert snapshot["requests"] == []
    sessions = [d["entity"] for d in seen if d["kind"] == "session.updated"]
    assert len({s["id"] for s in sessions}) == 1, "one app-server process served every turn"
    assert sessions[-1]["provider"] == "replay-codex" and sessions[-1]["native_session_id"]
    daemon.stop()
    return outcomes


# -- the recordings -----------------------------------------------------------------------


async def test_multiturn_replays_every_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    """The five-turn recording (text; a command approved and run; an unsupported patch; a slow
    count interrupted; text again) projects to its texts, commands, approvals and per-turn
    token counts, in one app-server process, and the snapshot equals the live events."""
    with trio.fail_after(60):
        turns = read_recording(MULTITURN, Path("/w"))
        # The recording is the one described in the fixtures' README.
        assert [len(t.commands) for t in turns] == [0, 1, 0, 0, 0]
        assert [t.decisions for t in turns] == [[], ["accept"], [], [], []]
        assert [t.interrupted for t in turns] == [False, False, False, True, False]
        outcomes = await replay(tmp_path, nursery, MULTITURN)
        assert outcomes[1].of_kind("command")[0]["data"]["output"] == "README.md\ncreated-by-codex.txt\n"
        assert [o.turn["usage"]["total_tokens"] for o in outcomes] == [1220, 2440, 2440, 0, 1220]


async def test_a_looping_replay_plays_the_recording_again(tmp_path: Path, nursery: trio.Nursery) -> None:
    """replay-codex loops: turns 6-10 of a thread replay turns 1-5 with the same texts,
    commands and prompts, although Codex's server request ids count on."""
    with trio.fail_after(60):
        project = project_dir(tmp_path)
        turns = read_recording(MULTITURN, project)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_codex_fixture=str(MULTITURN))
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project, provider="replay-codex")
            outcomes = await play_all_turns(client, thread_id, turns + turns)
        requests = [r["id"] for o in outcomes for r in o.requests]
        assert len(requests) == len(set(requests)) == 2
        daemon.stop()


async def test_a_declined_command_replays_as_declined(tmp_path: Path, nursery: trio.Nursery) -> None:
    """The declined recording: the approval answered deny reaches Codex as decline, the command
    item ends failed with Codex's status declined, and the turn completes with the reply."""
    with trio.fail_after(30):
        (recorded,) = read_recording(DECLINED, Path("/w"))
        assert recorded.decisions == ["decline"] and recorded.commands[0].status == "declined"
        (outcome,) = await replay(tmp_path, nursery, DECLINED)
        (command,) = outcome.of_kind("command")
        assert command["status"] == "failed" and command["data"]["status"] == "declined"


def fake(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(FAKE_CODEX), *args], cwd=cwd, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_the_error_paths_recording_replays_codexs_own_answers(tmp_path: Path) -> None:
    """Played by the fake, the error-paths recording answers as recorded: a request before
    initialize gets 'Not initialized', initialize its result (home rewritten), a second one
    'Already initialized', and resuming the recorded unknown thread 'no rollout found'."""
    recorded = [json.loads(raw) for raw in ERROR_PATHS.read_text().splitlines()]
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "T3D_REPLAY_SPEED": "0"}
    env.pop("CODEX_HOME", None)
    sent = [
        {"id": 1, "method": "thread/start", "params": {}},
        {"id": 2, "method": "initialize", "params": {"clientInfo": {"name": "x", "version": "0"}}},
        {"id": 3, "method": "initialize", "params": {"clientInfo": {"name": "x", "version": "0"}}},
        {"id": 4, "method": "thread/resume", "params": {"threadId": "00000000-0000-0000-0000-000000000000"}},
    ]
    process = fake("app-server", "--replay-fixture", str(ERROR_PATHS), cwd=tmp_path, env=env)
    out, err = process.communicate("".join(json.dumps(m) + "\n" for m in sent).encode(), timeout=20)
    answers = [json.loads(raw) for raw in out.decode().splitlines()]
    expected = json.loads(json.dumps(recorded).replace("/home/user", str(home)))
    assert answers == expected, err.decode()
    assert process.returncode == 0


async def test_a_thread_codex_cannot_resume_continues_in_a_new_codex_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart with another CODEX_HOME, thread/resume of the stored Codex thread gets
    Codex's 'no rollout found for thread id …': the turn goes on in a new Codex thread (a new
    native session id) and says so in a failed error item with Codex's message."""
    project = project_dir(tmp_path)
    state = tmp_path / "state"
    with trio.fail_after(60):
        monkeypatch.setenv("CODEX_HOME", str(tmp_path / "home-1"))
        async with trio.open_nursery() as first:
            daemon = await start_daemon(first, state, replay_codex_fixture=str(MULTITURN))
            async with open_client(daemon) as client:
                seen = client.record_events()
                thread_id = await new_thread(client, project, provider="replay-codex")
                assert (await run_turn(client, thread_id, "ping")).turn["status"] == "completed"
            (before,) = {d["entity"]["native_session_id"] for d in seen if d["kind"] == "session.updated"} - {None}
            daemon.stop()
        monkeypatch.setenv("CODEX_HOME", str(tmp_path / "home-2"))
        async with trio.open_nursery() as second:
            daemon = await start_daemon(second, state, replay_codex_fixture=str(MULTITURN))
            async with open_client(daemon) as client:
                seen = client.record_events()
                await client.call("subscribe.thread", thread_id=thread_id)
                outcome = await run_turn(client, thread_id, "ping")
            daemon.stop()
    assert outcome.turn["status"] == "completed"
    (notice,) = outcome.of_kind("error")
    assert f"no rollout found for thread id {before}" in notice["text"] and notice["status"] == "failed"
    assert outcome.assistant_text == read_recording(MULTITURN, project)[0].texts
    after = {d["entity"]["native_session_id"] for d in seen if d["kind"] == "session.updated"} - {None, before}
    assert len(after) == 1


def test_every_codex_recording_has_a_replay_test() -> None:
    """Every Codex recording bundled in replay_fixtures/codex/ is replayed by a test here."""
    covered = {MULTITURN.name, DECLINED.name, ERROR_PATHS.name}
    assert {p.name for p in CODEX.glob("*.jsonl")} == covered


async def test_a_message_steered_into_a_codex_turn_goes_through_turn_steer(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """turn.start with delivery steer on a Codex thread whose turn waits on an approval:
    the message goes to Codex as turn/steer with the running turn as expectedTurnId (0.171.0's
    schema has it), shows in that turn, and the turn goes on to its end."""
    log = tmp_path / "host.log"
    monkeypatch.setenv("T3D_REPLAY_HOST_LOG", str(log))
    with trio.fail_after(60):
        project = project_dir(tmp_path)
        turns = read_recording(MULTITURN, project)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_codex_fixture=str(MULTITURN))
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project, provider="replay-codex")
            await run_turn(client, thread_id, turns[0].prompt)
            started = await client.call("turn.start", thread_id=thread_id, text=turns[1].prompt)
            request = await client.wait_event(lambda d: d["kind"] == "request.updated" and d["entity"]["status"] == "pending")
            reply = await client.call("turn.start", thread_id=thread_id, text="and say hi", delivery="steer")
            assert (reply["delivery"], reply["turn_id"]) == ("steer", started["turn_id"])
            await client.call("request.respond", request_id=request["entity"]["id"], decision="allow")
            await client.wait_event(lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == started["turn_id"] and d["entity"]["status"] == "completed")
            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
        assert [t["id"] for t in snapshot["turns"]] == [snapshot["turns"][0]["id"], started["turn_id"]]
        users = [i["text"] for i in snapshot["items"] if i["turn_id"] == started["turn_id"] and i["kind"] == "user_message"]
        assert users == [turns[1].prompt, "and say hi"]
        sent = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        [steer] = [m for m in sent if m.get("method") == "turn/steer"]
        assert steer["params"]["input"][0]["text"] == "and say hi" and steer["params"]["expectedTurnId"]
        assert len([m for m in sent if m.get("method") == "turn/start"]) == 2  # no turn of its own
        daemon.stop()
