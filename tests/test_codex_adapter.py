"""The pure mapper from Codex app-server events to domain changes, on the recorded lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from t3d.providers.codex import events as ce
from t3d.providers.codex.adapter import (
    OUTPUT_LIMIT,
    Change,
    ItemChanged,
    PermissionAsked,
    TurnEnded,
    TurnMapper,
)
from t3d.providers.codex.protocol import parse_line

CODEX = Path(__file__).resolve().parents[1] / "replay_fixtures" / "codex"
MULTITURN = CODEX / "codex-0.171.0_app-server_multiturn.jsonl"

Json = dict[str, Any]


def turns(path: Path = MULTITURN) -> list[list[bytes]]:
    """The recording's stdout lines of each turn: from its turn/start to its turn/completed."""
    out: list[list[bytes]] = []
    for raw in path.read_text().splitlines():
        if raw.startswith(">>> ") and '"method":"turn/start"' in raw:
            out.append([])
        elif out and not raw.startswith(">>> "):
            out[-1].append(raw.encode())
    return out


def feed(mapper: TurnMapper, lines: list[bytes]) -> list[Change]:
    return [change for line in lines for change in mapper.feed(parse_line(line))]


def final_items(changes: list[Change]) -> list[ItemChanged]:
    return [c for c in changes if isinstance(c, ItemChanged) and c.final]


def event(method: str, **params: Any) -> object:
    return parse_line(orjson.dumps({"method": method, "params": {"threadId": "t", "turnId": "u", **params}}))


def test_streamed_text_and_the_completed_item_are_one_assistant_item() -> None:
    """The first turn's deltas grow one assistant item, whose completed state is the
    recorded final text; the userMessage echo is not mapped; the turn completes once."""
    changes = feed(TurnMapper("th", "tu", lambda: 0.0), turns()[0])
    texts = [c for c in changes if isinstance(c, ItemChanged)]
    assert {c.item.id for c in texts} == {"tu:msg_mock_a562378a79f8"}
    assert [c.item.text for c in texts] == ["pong fro", "pong from the mo", "pong from the mock model", "pong from the mock model"]
    assert [c.final for c in texts] == [False, False, False, True]
    ends = [c for c in changes if isinstance(c, TurnEnded)]
    assert ends == [TurnEnded("completed", None, None, ends[0].usage)]
    assert ends[0].usage == {"input_tokens": 1200, "cached_input_tokens": 1000, "output_tokens": 20, "reasoning_output_tokens": 0, "total_tokens": 1220}


def test_a_command_with_approval_maps_to_a_command_item_and_a_prompt() -> None:
    """The SHELL turn: a running command item, an approval prompt naming the command, then the
    completed command with its exit code and output; unmapped fields are kept under codex."""
    changes = feed(TurnMapper("th", "tu", lambda: 0.0), turns()[1])
    (asked,) = [c for c in changes if isinstance(c, PermissionAsked)]
    assert asked.request_id == "0" and asked.request.kind == "command"
    assert asked.item.kind == "approval_request" and asked.item.status == "pending"
    assert asked.data["input"] == {"command": "/bin/bash -lc 'touch created-by-codex.txt && ls'", "cwd": "/workspace"}
    commands = [c.item for c in changes if isinstance(c, ItemChanged) and c.item.kind == "command"]
    assert [c.status for c in commands] == ["running", "completed"]
    done = commands[-1]
    assert done.title == "/bin/bash -lc 'touch created-by-codex.txt && ls'"
    assert done.data is not None
    assert (done.data["exit_code"], done.data["output"]) == (0, "README.md\ncreated-by-codex.txt\n")
    assert done.data["codex"]["source"] == "unifiedExecStartup"
    assert done.data["codex"]["commandActions"] == [{"type": "unknown", "command": "touch created-by-codex.txt && ls"}]


def test_usage_is_the_growth_of_the_thread_total_over_the_turn() -> None:
    """Turn 2 made two model calls (2 x 1220 tokens); the interrupted turn 4 repeats the
    previous total, so it used nothing."""
    recorded = turns()
    total: ce.Usage | None = None
    usages = []
    for lines in recorded:
        mapper = TurnMapper("th", "tu", lambda: 0.0, total)
        (end,) = [c for c in feed(mapper, lines) if isinstance(c, TurnEnded)]
        usages.append(end.usage["total_tokens"] if end.usage else None)
        total = mapper.usage_total
    assert usages == [1220, 2440, 2440, 0, 1220]


def test_the_interrupted_turn_ends_interrupted_when_asked_else_as_aborted() -> None:
    """turn/completed interrupted is the user's interrupt if one was asked for, else the provider's."""
    asked = TurnMapper("th", "tu", lambda: 0.0)
    asked.interrupt_requested = True
    (end,) = [c for c in feed(asked, turns()[3]) if isinstance(c, TurnEnded)]
    assert (end.status, end.reason) == ("interrupted", "interrupt")
    (end,) = [c for c in feed(TurnMapper("th", "tu", lambda: 0.0), turns()[3]) if isinstance(c, TurnEnded)]
    assert (end.status, end.reason) == ("interrupted", "provider_aborted")
    stopped = TurnMapper("th", "tu", lambda: 0.0)
    stopped.fail_with = ("it was stuck", "provider_retrying")
    (end,) = [c for c in feed(stopped, turns()[3]) if isinstance(c, TurnEnded)]
    assert (end.status, end.error, end.reason) == ("failed", "it was stuck", "provider_retrying")


def test_retries_are_one_error_item_closed_when_codex_moves_on() -> None:
    """Three willRetry errors update one streaming error item (3 attempts, the last message);
    the next item closes it; a final error is a failed error item and the turn's error."""
    mapper = TurnMapper("th", "tu", lambda: 0.0)
    retry = {"message": "Reconnecting... {}/5", "additionalDetails": "stream disconnected"}
    changes: list[Change] = []
    for n in (2, 3, 4):
        error = {**retry, "message": retry["message"].format(n)}
        changes += mapper.feed(event("error", error=error, willRetry=True))
    assert mapper.retrying and mapper.retry_text == "Reconnecting... 4/5 (stream disconnected)"
    items = [c.item for c in changes if isinstance(c, ItemChanged)]
    assert {i.id for i in items} == {"tu:retry:0"} and not any(c.final for c in changes if isinstance(c, ItemChanged))
    assert items[-1].data is not None and items[-1].data["attempts"] == 3
    moved = mapper.feed(event("item/agentMessage/delta", itemId="m1", delta="hi"))
    assert [(c.item.id, c.item.status, c.final) for c in moved if isinstance(c, ItemChanged)] == [
        ("tu:retry:0", "completed", True),
        ("tu:m1", "streaming", False),
    ]
    assert not mapper.retrying
    failed = mapper.feed(event("error", error={"message": "quota exceeded"}, willRetry=False))
    assert [(c.item.kind, c.item.status, c.item.text) for c in final_items(failed)] == [("error", "failed", "quota exceeded")]
    (end,) = mapper.feed(parse_line(orjson.dumps({"method": "turn/completed", "params": {"threadId": "t", "turn": {"id": "u", "status": "failed"}}})))
    assert isinstance(end, TurnEnded) and (end.status, end.error) == ("failed", "quota exceeded")


def test_items_of_a_newer_codex_are_kept_in_data() -> None:
    """Unknown fields of a known item and an unknown item type end up in the item's data
    (under codex), so nothing a newer Codex sends is lost."""
    mapper = TurnMapper("th", "tu", lambda: 0.0)
    message = {"type": "agentMessage", "id": "m", "text": "hi", "sentiment": "warm", "phase": None}
    (changed,) = mapper.feed(event("item/completed", item=message))
    assert isinstance(changed, ItemChanged) and changed.item.data == {"codex": {"sentiment": "warm", "phase": None}}
    hologram = {"type": "hologram", "id": "h", "beam": [1, 2]}
    (changed,) = mapper.feed(event("item/completed", item=hologram))
    assert isinstance(changed, ItemChanged)
    assert (changed.item.kind, changed.item.title, changed.item.status) == ("tool_call", "hologram", "completed")
    assert changed.item.data is not None and changed.item.data["codex"] == hologram


def test_file_changes_reasoning_tools_and_long_output() -> None:
    """A fileChange is a file_change item titled with its paths; reasoning summary deltas
    join by part; an MCP call is a tool_call; command output is kept to OUTPUT_LIMIT."""
    mapper = TurnMapper("th", "tu", lambda: 0.0)
    patch = {"type": "fileChange", "id": "p", "status": "completed", "changes": [
        {"path": "a.txt", "kind": {"type": "add"}, "diff": "new\n"},
        {"path": "b.txt", "kind": {"type": "update", "move_path": None}, "diff": "@@ -1 +1 @@\n-x\n+y\n"}]}  # fmt: skip
    (changed,) = mapper.feed(event("item/completed", item=patch))
    assert isinstance(changed, ItemChanged) and changed.item.title == "Edit a.txt, b.txt"
    assert changed.item.kind == "file_change" and changed.item.data is not None
    assert [c["kind"] for c in changed.item.data["changes"]] == ["add", "update"]
    for n, piece in enumerate(["first", " part", "second"]):
        index = 0 if n < 2 else 1
        last = mapper.feed(event("item/reasoning/summaryTextDelta", itemId="r", delta=piece, summaryIndex=index))
    assert isinstance(last[0], ItemChanged) and last[0].item.text == "first part\n\nsecond"
    mcp = {"type": "mcpToolCall", "id": "c", "server": "docs", "tool": "search", "status": "failed",
           "arguments": {"q": "x"}, "error": {"message": "down"}}  # fmt: skip
    (changed,) = mapper.feed(event("item/completed", item=mcp))
    assert isinstance(changed, ItemChanged) and changed.item.data is not None
    assert (changed.item.kind, changed.item.title, changed.item.status) == ("tool_call", "docs/search", "failed")
    assert (changed.item.data["input"], changed.item.data["error"]) == ({"q": "x"}, "down")
    command = {"type": "commandExecution", "id": "x", "command": "yes", "cwd": "/w", "status": "inProgress"}
    mapper.feed(event("item/started", item=command))
    for _ in range(3):
        mapper.feed(event("item/commandExecution/outputDelta", itemId="x", delta="y\n" * (OUTPUT_LIMIT // 4)))
    current = next(i for i in mapper.open_items() if i.kind == "command")
    assert current.data is not None
    assert len(current.data["output"]) == OUTPUT_LIMIT and current.data["output_truncated"] is True
