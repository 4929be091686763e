"""The pure mapper from Claude protocol events to domain changes."""

from __future__ import annotations

from pathlib import Path

import orjson

from t3d.providers.claude.adapter import (
    ItemChanged,
    PermissionAsked,
    SessionSeen,
    TurnEnded,
    TurnMapper,
)
from t3d.providers.claude.protocol import failure_reason, parse_line

RECORDING = (
    Path(__file__).resolve().parent.parent
    / "replay_fixtures"
    / "claude"
    / "claude-2.1.197_multiturn_tools.stdout.jsonl"
)


def _turns() -> list[list[bytes]]:
    """The recording's stdout, cut after each result line."""
    turns: list[list[bytes]] = [[]]
    for line in RECORDING.read_bytes().splitlines():
        turns[-1].append(line)
        if b'"type":"result"' in line:
            turns.append([])
    return [t for t in turns if t]


def _feed(mapper: TurnMapper, lines: list[bytes]) -> list[object]:
    return [change for line in lines for change in mapper.feed(parse_line(line))]


def test_streamed_text_and_the_final_block_are_one_item() -> None:
    """Deltas and the complete assistant line of a block update the same item; the final one is marked final."""
    changes = _feed(TurnMapper("th", "tu", lambda: 0.0), _turns()[0])
    texts = [
        c for c in changes if isinstance(c, ItemChanged) and c.item.kind == "assistant_message"
    ]
    by_id: dict[str, list[ItemChanged]] = {}
    for change in texts:
        by_id.setdefault(change.item.id, []).append(change)
    assert [updates[-1].item.text for updates in by_id.values()] == [
        "I'll read the file.",
        "Done. The tool returned: 1\thello | 2\t",
    ]
    assert all(
        updates[-1].final and updates[-1].item.status == "completed" for updates in by_id.values()
    )
    assert all(i.id.startswith("tu:") for i in (c.item for c in texts)), (
        "item ids are scoped by turn"
    )
    assert any(isinstance(c, SessionSeen) for c in changes)
    assert isinstance(changes[-1], TurnEnded) and changes[-1].status == "completed"


def test_a_tool_call_appears_with_its_whole_input_then_its_result() -> None:
    """No tool item with empty input is emitted; the result completes it."""
    changes = _feed(TurnMapper("th", "tu", lambda: 0.0), _turns()[0])
    tools = [c.item for c in changes if isinstance(c, ItemChanged) and c.item.kind == "tool_call"]
    assert tools[0].data is not None and tools[0].data["input"] == {
        "file_path": "/workspace/notes.txt"
    }
    assert (
        tools[-1].status == "completed"
        and tools[-1].data is not None
        and tools[-1].data["result"] == "1\thello\n2\t"
    )


def test_a_permission_prompt_becomes_a_pending_approval() -> None:
    """can_use_tool gives a PermissionAsked with the input to echo back on allow."""
    changes = _feed(TurnMapper("th", "tu", lambda: 0.0), _turns()[1])
    (asked,) = [c for c in changes if isinstance(c, PermissionAsked)]
    assert asked.item.kind == "approval_request" and asked.item.status == "pending"
    assert asked.data["tool_name"] == "Edit" and asked.data["input"]["new_string"] == "hello, world"


def test_an_abort_nobody_asked_for_is_not_blamed_on_the_user() -> None:
    """aborted_streaming ends the turn interrupted; the reason says who stopped it."""
    interrupted_turn = _turns()[3]
    asked = TurnMapper("th", "tu", lambda: 0.0)
    asked.interrupt_requested = True
    by_user = _feed(asked, interrupted_turn)[-1]
    assert isinstance(by_user, TurnEnded)
    assert (by_user.status, by_user.error, by_user.reason) == (
        "interrupted",
        "interrupted by the user",
        "interrupt",
    )
    unasked = _feed(TurnMapper("th", "tu", lambda: 0.0), interrupted_turn)[-1]
    assert (
        isinstance(unasked, TurnEnded)
        and unasked.status == "interrupted"
        and unasked.reason == "provider_aborted"
    )


def test_a_bare_result_line_fails_the_turn_with_a_clear_error_and_a_reason() -> None:
    """``{"type":"result"}`` (no subtype, no text, no errors) ends the turn failed with an
    error that says what the CLI sent and a reason that is never empty; a result with text
    but no subtype shows the text, still with that reason."""
    *shown, ended = TurnMapper("th", "tu", lambda: 0.0).feed(parse_line(b'{"type":"result"}'))
    assert isinstance(ended, TurnEnded)
    assert ended.status == "failed"
    assert ended.error == "claude ended the turn with a result line that carries no subtype or text"
    assert ended.reason == "result_without_subtype"
    *shown, ended = TurnMapper("th", "tu", lambda: 0.0).feed(
        parse_line(b'{"type":"result","is_error":true,"result":"quota exceeded"}')
    )
    # The CLI's words are the turn's assistant message and its error item.
    assert [(c.item.kind, c.item.text) for c in shown if isinstance(c, ItemChanged)] == [
        ("assistant_message", "quota exceeded"), ("error", "quota exceeded")
    ]
    assert isinstance(ended, TurnEnded)
    assert (ended.status, ended.error, ended.reason) == ("failed", "quota exceeded", "result_without_subtype")
    *shown, ended = TurnMapper("th", "tu", lambda: 0.0).feed(parse_line(b'{"type":"result","is_error":false,"result":"done?"}'))
    assert isinstance(ended, TurnEnded)
    assert ended.error == "claude ended the turn with a result line that carries no subtype: done?"
    assert ended.reason


def _result(**fields: object) -> bytes:
    base = {"type": "result", "subtype": "success", "is_error": False, "session_id": "s", "usage": {"input_tokens": 10, "output_tokens": 2}}
    return orjson.dumps({**base, **fields})


def test_a_steered_turn_goes_on_until_the_steered_messages_result() -> None:
    """With a steered message pending, the first result does not end the turn (2.1.197 runs the
    message after it); the next one does, with both results' usage added up."""
    mapper = TurnMapper("th", "tu", lambda: 0.0)
    mapper.steers_pending = 1
    assert mapper.feed(parse_line(_result(total_cost_usd=0.1))) == []
    [ended] = mapper.feed(parse_line(_result(total_cost_usd=0.3)))
    assert isinstance(ended, TurnEnded) and ended.status == "completed"
    assert (ended.usage or {})["input_tokens"] == 20 and ended.total_cost_usd == 0.3


def test_a_wakes_result_inside_a_user_turn_does_not_end_it() -> None:
    """A user message that reaches the CLI as a background task ends: the CLI runs the wake
    first, and its result (origin task-notification) is not the user turn's end; a turn the
    provider started ends at its own such result."""
    wake_result = _result(origin={"kind": "task-notification"})
    user = TurnMapper("th", "tu", lambda: 0.0)
    assert user.feed(parse_line(wake_result)) == []
    assert isinstance(user.feed(parse_line(_result()))[-1], TurnEnded)
    provider = TurnMapper("th", "tw", lambda: 0.0)
    provider.user_turn = False
    assert isinstance(provider.feed(parse_line(wake_result))[-1], TurnEnded)


def test_a_failed_result_is_named_by_its_failure_never_success() -> None:
    """The reason of a failed turn: the subtype unless success, api_error_<status> from the
    status or the text, and a category from the status, the synthetic line or the text."""
    cases = [
        ({"is_error": True, "api_error_status": 401, "result": "Invalid API key · Fix external API key"}, None, "api_error_401:auth_error"),
        ({"is_error": True, "api_error_status": 400, "result": "API Error: 400 mock: prompt is invalid"}, "unknown", "api_error_400:invalid_request"),
        ({"is_error": True, "result": "API Error: Repeated 529 Overloaded errors."}, "server_error", "api_error_529:overloaded"),
        ({"is_error": True, "result": "Not logged in · Please run /login"}, "authentication_failed", "auth_error"),
        ({"is_error": True, "result": "Failed to authenticate. API Error: 401 {...}"}, None, "api_error_401:auth_error"),
        ({"subtype": "error_during_execution", "is_error": True, "errors": ["No conversation found with session ID: x"]}, None, "error_during_execution:session_not_found"),
        ({"subtype": "error_max_turns", "is_error": True}, None, "error_max_turns"),
        ({"is_error": True, "result": "something odd"}, None, "error_result"),
    ]
    for fields, synthetic, reason in cases:
        assert failure_reason(parse_line(_result(**fields)), synthetic) == reason, fields  # type: ignore[arg-type]
