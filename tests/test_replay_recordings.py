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

Json = dict[str, Any]

MULTITURN = FIXTURES / "claude-2.1.197_multiturn_tools.jsonl"
NOT_LOGGED_IN = TEST_FIXTURES / "claude-not-logged-in.stdout.jsonl"
FAKE_CLAUDE = FIXTURES.parent / "fake_claude"
DEFAULT_PROMPT = "hi"
SINGLE_TURN = [
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
    texts: list[str] = attrs.Factory(list)  # text blocks of real assistant lines, in order
    errors: list[str] = attrs.Factory(list)  # text of synthetic (error) assistant lines
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
        if kind == "assistant":
            message = line["message"]
            synthetic = message.get("model") == "<synthetic>" and bool(line.get("error"))
            for block in message["content"]:
                if block["type"] == "text":
                    (turn.errors if synthetic else turn.texts).append(block["text"])
                elif block["type"] == "tool_use":
                    turn.tools.append(RecordedTool(block["id"], block["name"], block["input"]))
        elif kind == "user" and isinstance(line["message"]["content"], list):
            for part in line["message"]["content"]:
                if part.get("type") == "tool_result":
                    tool = turn.tool(part["tool_use_id"])
                    tool.result = content_text(part.get("content", ""))
                    tool.is_error = part.get("is_error") is True
        elif kind == "control_request" and line["request"].get("subtype") == "can_use_tool":
            turn.prompted.append(line["request"]["tool_name"])
        elif kind == "result":
            turn.result = line
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
    assert all(item["status"] not in ("streaming", "running", "pending") for item in outcome.items)


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

    covered = {run(MULTITURN)} | {run(Path(name)) for name in SINGLE_TURN}
    assert {run(p) for p in FIXTURES.glob("*.jsonl")} == covered


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
            assert outcome.assistant_text == []

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
