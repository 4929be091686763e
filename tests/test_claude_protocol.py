"""The Claude Code stream-json core against real 2.1.197 recordings and hypothesis."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from t3d.errors import ProtocolError
from t3d.providers.claude.encode import (
    build_argv,
    encode_control_error,
    encode_initialize,
    encode_interrupt,
    encode_permission_allow,
    encode_permission_deny,
    encode_set_model,
    encode_set_permission_mode,
    encode_user_message,
)
from t3d.providers.claude.events import (
    ApiRetry,
    AssistantMessage,
    BlockStarted,
    BlockStopped,
    ClaudeEvent,
    ControlCancelled,
    ControlRequested,
    ControlResponded,
    McpServer,
    MessageDelta,
    MessageStarted,
    MessageStopped,
    OtherBlock,
    PermissionRequested,
    RateLimited,
    StatusChanged,
    SystemInit,
    SystemNotice,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolInputDelta,
    ToolUseBlock,
    TurnResult,
    Unknown,
    UserMessage,
)
from t3d.providers.claude.protocol import final_error_text, parse_line, streamed_text
from t3d.providers.lines import LineBuffer, LineTooLong

# -- recordings ----------------------------------------------------------------

_MULTITURN = "claude-2.1.197_multiturn_tools"
_SESSION = "60944ebc-54c1-4013-a3d5-b449711c64f6"


FIXTURES = Path(__file__).parent.parent / "replay_fixtures" / "claude"


def _lines(name: str) -> list[bytes]:
    return (FIXTURES / name).read_bytes().splitlines()


def _stdout(name: str) -> list[bytes]:
    """stdout lines of a recording, from its .stdout.jsonl."""
    return _lines(f"{name}.stdout.jsonl")


def _events(name: str) -> list[ClaudeEvent]:
    return [parse_line(line) for line in _stdout(name)]


def _of(kind: type[Any], events: list[ClaudeEvent]) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


def _recorded_stdout_lines() -> Iterator[tuple[str, bytes]]:
    for path in sorted(FIXTURES.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            if not line.startswith(b">>> "):
                yield path.name, line


def test_every_recorded_stdout_line_parses_to_a_modelled_event() -> None:
    # The 2.1.197 recordings hold no line type this parser leaves unmodelled.
    count = 0
    for name, line in _recorded_stdout_lines():
        event = parse_line(line)
        assert not isinstance(event, Unknown), (name, line[:200])
        count += 1
    assert count > 300


def test_streamed_deltas_add_up_to_each_assistant_block() -> None:
    events = _events(_MULTITURN)
    texts: dict[tuple[str, int], str] = {}
    inputs: dict[tuple[str, int], str] = {}
    message_id, index = "", -1
    checked = 0
    for event in events:
        if isinstance(event, MessageStarted):
            message_id = event.message_id
        elif isinstance(event, BlockStarted):
            index = event.index
        elif isinstance(event, TextDelta):
            texts[message_id, event.index] = texts.get((message_id, event.index), "") + event.text
        elif isinstance(event, ToolInputDelta):
            key = (message_id, event.index)
            inputs[key] = inputs.get(key, "") + event.partial_json
        elif isinstance(event, AssistantMessage):
            # One block per line, sent right after the block's last delta.
            assert event.message_id == message_id
            (block,) = event.blocks
            if isinstance(block, TextBlock):
                assert block.text == texts[message_id, index]
            else:
                assert isinstance(block, ToolUseBlock)
                # The CLI fills in defaults the model left out (Edit gains
                # "replace_all": false), so the streamed input is a subset.
                streamed = orjson.loads(inputs[message_id, index])
                assert streamed.items() <= block.input.items()
            checked += 1
    assert checked == 9
    assert len(_of(TextDelta, events)) + len(_of(ToolInputDelta, events)) == 66


def test_multiturn_turns_tools_and_permissions() -> None:
    events = _events(_MULTITURN)

    inits = _of(SystemInit, events)
    assert len(inits) == 5
    assert {init.session_id for init in inits} == {_SESSION}
    assert inits[0].model == "claude-opus-4-8[1m]"
    assert inits[0].permission_mode == "default"
    assert inits[0].claude_code_version == "2.1.197"
    assert "Bash" in inits[0].tools

    tool_uses = [
        b for e in _of(AssistantMessage, events) for b in e.blocks if isinstance(b, ToolUseBlock)
    ]
    assert [(t.name, t.tool_use_id) for t in tool_uses] == [
        ("Read", "toolu_mock_06d165939cbe4a7b"),
        ("Edit", "toolu_mock_8f62b39c5caa4103"),
        ("Bash", "toolu_mock_242b83ae11ad4dc2"),
    ]
    assert tool_uses[0].input == {"file_path": "/workspace/notes.txt"}

    asks = _of(PermissionRequested, events)
    assert [(a.request_id, a.tool_name, a.tool_use_id) for a in asks] == [
        ("37a06034-d329-44cb-8e0a-b8fa2e8f4446", "Edit", "toolu_mock_8f62b39c5caa4103"),
        ("1582ee73-620f-475f-8a53-284bfb1acae4", "Bash", "toolu_mock_242b83ae11ad4dc2"),
    ]
    assert asks[0].description == "notes.txt"
    assert asks[0].blocked_path is None
    assert asks[0].suggestions == (
        {"type": "setMode", "mode": "acceptEdits", "destination": "session"},
    )
    assert asks[1].blocked_path == "/workspace/created-by-bash.txt"
    assert asks[1].input["command"] == "touch created-by-bash.txt && ls"

    results = [r for e in _of(UserMessage, events) for r in e.tool_results]
    assert [(r.tool_use_id, r.is_error) for r in results] == [
        ("toolu_mock_06d165939cbe4a7b", False),
        ("toolu_mock_8f62b39c5caa4103", False),
        ("toolu_mock_242b83ae11ad4dc2", True),
    ]
    assert results[0].content_text == "1\thello\n2\t"
    assert isinstance(results[0].structured, dict)
    assert results[0].structured["file"]["content"] == "hello\n"
    assert isinstance(results[1].structured, dict)
    assert results[1].structured["structuredPatch"][0]["lines"] == ["-hello", "+hello, world"]
    assert results[2].content_text == "Denied by the recording driver (policy)."
    assert results[2].structured == "Error: Denied by the recording driver (policy)."

    notices = [e.text for e in _of(UserMessage, events) if not e.tool_results]
    assert notices == ["[Request interrupted by user]"]

    stops = [e.stop_reason for e in _of(MessageDelta, events)]
    assert stops == [
        "tool_use",
        "end_turn",
        "tool_use",
        "end_turn",
        "tool_use",
        "end_turn",
        "end_turn",
    ]
    assert len(_of(MessageStopped, events)) == len(stops)
    # The interrupted text block never gets its content_block_stop.
    assert len(_of(BlockStopped, events)) == 8
    assert _of(StatusChanged, events)[0] == StatusChanged("requesting", None)


def test_multiturn_control_responses_and_results() -> None:
    events = _events(_MULTITURN)

    init_answer, interrupt_answer = _of(ControlResponded, events)
    assert init_answer.request_id == "req_init_585302f0"
    assert init_answer.ok
    assert init_answer.response is not None
    assert {"commands", "models", "account", "pid"} <= init_answer.response.keys()
    # 2.1.197 answers an interrupt with no "response" field at all.
    assert interrupt_answer == ControlResponded("req_int_6628cf59", True, None, None)

    results = _of(TurnResult, events)
    assert len(results) == 5
    assert [r.subtype for r in results] == ["success"] * 3 + ["error_during_execution", "success"]
    assert [r.terminal_reason for r in results] == ["completed"] * 3 + [
        "aborted_streaming",
        "completed",
    ]
    assert [r.is_error for r in results] == [False, False, False, True, False]
    assert [r.num_turns for r in results] == [2, 2, 2, 2, 1]
    assert results[0].result_text == "Done. The tool returned: 1\thello | 2\t"
    assert results[0].usage.input_tokens == 642
    assert results[0].usage.output_tokens == 17
    assert results[0].total_cost_usd == pytest.approx(0.003635)
    assert results[-1].total_cost_usd == pytest.approx(0.01291)
    assert all(r.session_id == _SESSION for r in results)
    assert all(r.result_index is None for r in results)
    (denial,) = results[2].permission_denials
    assert (denial.tool_name, denial.tool_use_id) == ("Bash", "toolu_mock_242b83ae11ad4dc2")
    assert denial.tool_input["command"] == "touch created-by-bash.txt && ls"
    interrupted = results[3]
    assert interrupted.result_text is None
    assert interrupted.stop_reason is None
    assert interrupted.errors == (
        "[ede_diagnostic] result_type=user last_content_type=n/a stop_reason=null",
    )
    assert final_error_text(interrupted) == interrupted.errors[0]
    assert final_error_text(results[0]) is None

    partial = _of(AssistantMessage, events)[-2]
    assert partial.blocks == (TextBlock("".join(f"{n}\n" for n in range(1, 20))),)
    assert not partial.aborted  # 2.1.197 does not flag the partial message


def test_api_failures_are_error_results_with_their_text() -> None:
    events = _events("claude-2.1.197_http400")
    (message,) = _of(AssistantMessage, events)
    assert message.synthetic
    assert message.error == "unknown"
    assert message.blocks == (TextBlock("API Error: 400 mock: prompt is invalid"),)
    (result,) = _of(TurnResult, events)
    assert (result.subtype, result.is_error, result.api_error_status) == ("success", True, 400)
    assert final_error_text(result) == "API Error: 400 mock: prompt is invalid"

    events = _events("claude-2.1.197_http529_retries")
    assert _of(ApiRetry, events) == [
        ApiRetry(1, 2, 529, "overloaded", 520.0834425636119),
        ApiRetry(2, 2, 529, "overloaded", 1007.2748978443221),
    ]
    (message,) = _of(AssistantMessage, events)
    assert (message.synthetic, message.error) == (True, "server_error")
    (result,) = _of(TurnResult, events)
    assert result.is_error
    assert result.api_error_status is None  # only the 400 run reports a status
    text = final_error_text(result)
    assert text is not None
    assert text.startswith("API Error: Repeated 529 Overloaded errors.")


def test_not_logged_in_result_gives_its_text() -> None:
    # PROTOCOLS.md §1.5 B, without the fields that do not matter here.
    line = (
        b'{"type":"result","subtype":"success","is_error":true,"api_error_status":null,'
        b'"duration_ms":310,"duration_api_ms":0,"num_turns":1,'
        b'"result":"Not logged in \xc2\xb7 Please run /login","stop_reason":"stop_sequence",'
        b'"total_cost_usd":0,"terminal_reason":"completed"}'
    )
    result = parse_line(line)
    assert isinstance(result, TurnResult)
    assert result.total_cost_usd == 0.0
    assert final_error_text(result) == "Not logged in · Please run /login"


def test_one_shot_recordings() -> None:
    events = _events("claude-2.1.197_flags_sessionid_model_mcp")
    (init,) = _of(SystemInit, events)
    assert init.session_id == "11111111-2222-4333-8444-555555555555"
    assert init.model == "claude-sonnet-5"
    assert init.permission_mode == "acceptEdits"
    assert init.mcp_servers == (McpServer("bogus", "failed"),)
    (echo,) = _of(UserMessage, events)
    assert (echo.is_replay, echo.text, echo.tool_results) == (True, "hi", ())

    events = _events("claude-2.1.197_oneshot_bypass")
    (user,) = _of(UserMessage, events)
    (result,) = user.tool_results
    assert result.content_text == "created-by-bash.txt\nnotes.txt"
    assert not result.is_error
    assert isinstance(result.structured, dict)
    assert result.structured["stdout"] == "created-by-bash.txt\nnotes.txt"

    events = _events("claude-2.1.197_oneshot_default_noprompttool")
    (user,) = _of(UserMessage, events)
    assert user.tool_results[0].is_error
    assert "was blocked" in user.tool_results[0].content_text
    (turn,) = _of(TurnResult, events)
    assert (turn.subtype, turn.is_error) == ("success", False)
    assert [d.tool_name for d in turn.permission_denials] == ["Bash"]

    events = _events("claude-2.1.197_resume")
    assert [type(e) for e in events] == [SystemInit, AssistantMessage, TurnResult]
    assert {e.session_id for e in _of(SystemInit, events) + _of(TurnResult, events)} == {_SESSION}


def test_error_paths_log_lines() -> None:
    # stdout in this log is cut at about 600 characters: the cut lines must be
    # refused cleanly, and the whole ones must parse.
    lines = [line for line in _lines("claude-2.1.197_error_paths.txt") if line.startswith(b"{")]
    whole = cut = 0
    for line in lines:
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError:
            with pytest.raises(ProtocolError, match="not valid JSON"):
                parse_line(line)
            cut += 1
        else:
            assert not isinstance(parse_line(line), Unknown)
            whole += 1
    assert whole >= 1
    assert cut >= 2


def test_encoders_reproduce_every_recorded_stdin_line() -> None:
    # Byte for byte: the recording host wrote exactly these lines. Only the recordings
    # from ../shared/providers/fixtures/: those made with replay_fixtures/record/ were
    # written by its own host (other key order, no hooks), not by encoders like ours.
    written = 0
    for name in ("flags_sessionid_model_mcp", "multiturn_tools", "resume"):
        path = FIXTURES / f"claude-2.1.197_{name}.jsonl"
        for line in path.read_bytes().splitlines():
            if not line.startswith(b">>> "):
                continue
            sent = line.removeprefix(b">>> ")
            obj = orjson.loads(sent)
            assert _reencode(obj) == sent + b"\n"
            written += 1
    assert written == 11


def _reencode(obj: dict[str, Any]) -> bytes:
    if obj["type"] == "user":
        return encode_user_message(obj["message"]["content"], obj["session_id"])
    if obj["type"] == "control_request":
        encoders = {"initialize": encode_initialize, "interrupt": encode_interrupt}
        return encoders[obj["request"]["subtype"]](obj["request_id"])
    body = obj["response"]["response"]
    if body["behavior"] == "allow":
        return encode_permission_allow(obj["response"]["request_id"], body["updatedInput"])
    return encode_permission_deny(obj["response"]["request_id"], body["message"])


# -- lines from PROTOCOLS.md and newer CLIs --------------------------------------


def _parse(obj: dict[str, Any]) -> ClaudeEvent:
    return parse_line(orjson.dumps(obj))


def _stream(event: dict[str, Any], parent: str | None = None) -> ClaudeEvent:
    return _parse({"type": "stream_event", "event": event, "parent_tool_use_id": parent})


def test_stream_events_of_other_block_kinds() -> None:
    start = {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}}
    assert _stream(start, "toolu_1") == BlockStarted(0, "thinking", None, None, "toolu_1")
    tool = {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {}}
    start = {"type": "content_block_start", "index": 1, "content_block": tool}
    assert _stream(start) == BlockStarted(1, "tool_use", "toolu_2", "Bash", None)
    delta = {"type": "thinking_delta", "thinking": "hmm", "estimated_tokens": 3}
    event = {"type": "content_block_delta", "index": 0, "delta": delta}
    assert _stream(event) == ThinkingDelta(0, "hmm", None)
    event = {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta"}}
    assert _stream(event) == Unknown(
        "stream_event",
        "signature_delta",
        {"type": "stream_event", "event": event, "parent_tool_use_id": None},
    )
    assert isinstance(_stream({"type": "ping"}), Unknown)
    # A delta without its block index cannot be placed.
    event = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}}
    assert isinstance(_stream(event), Unknown)


def test_assistant_blocks_of_other_kinds() -> None:
    content = [
        {"type": "thinking", "thinking": "let me see", "signature": "sig"},
        {"type": "redacted_thinking", "data": "…"},
    ]
    message = {"type": "assistant", "message": {"id": "m", "content": content}, "aborted": True}
    event = _parse(message)
    assert isinstance(event, AssistantMessage)
    assert event.blocks == (
        ThinkingBlock("let me see"),
        OtherBlock("redacted_thinking", content[1]),
    )
    assert event.aborted
    assert not event.synthetic


def test_tool_result_with_a_list_of_blocks_flattens_the_text() -> None:
    content = [
        {"type": "text", "text": "line one"},
        {"type": "image", "source": {"type": "base64", "data": "…"}},
        {"type": "text", "text": "line two"},
    ]
    results = [
        {"type": "tool_result", "tool_use_id": "a", "content": content},
        {"type": "tool_result", "tool_use_id": "b", "content": "plain"},
    ]
    event = _parse({"type": "user", "message": {"content": results}, "tool_use_result": {"x": 1}})
    assert isinstance(event, UserMessage)
    assert [r.content_text for r in event.tool_results] == ["line one\nline two", "plain"]
    # One tool_use_result per line cannot belong to two results.
    assert [r.structured for r in event.tool_results] == [None, None]


def test_system_and_other_top_level_lines() -> None:
    status = {
        "type": "system",
        "subtype": "status",
        "status": None,
        "permissionMode": "acceptEdits",
    }
    assert _parse(status) == StatusChanged(None, "acceptEdits")
    hook = {"type": "system", "subtype": "hook_response", "stdout": "x" * 50_000}
    assert _parse(hook) == SystemNotice("hook_response", hook)
    limit = {"type": "rate_limit_event", "rate_limit_info": {"status": "allowed"}}
    assert _parse(limit) == RateLimited("allowed", limit)
    assert _parse({"type": "keep_alive"}) == Unknown("keep_alive", None, {"type": "keep_alive"})
    assert _parse({"type": "control_cancel_request", "request_id": "r9"}) == ControlCancelled("r9")


def test_control_lines_from_newer_clis() -> None:
    answer = {"subtype": "success", "request_id": "e1", "response": {"still_queued": []}}
    assert _parse({"type": "control_response", "response": answer}) == ControlResponded(
        "e1", True, {"still_queued": []}, None
    )
    failure = {"subtype": "error", "request_id": "r2", "error": "unknown subtype"}
    assert _parse({"type": "control_response", "response": failure}) == ControlResponded(
        "r2", False, None, "unknown subtype"
    )
    event = _parse(
        {"type": "control_response", "response": {"subtype": "error", "request_id": "r3"}}
    )
    assert isinstance(event, ControlResponded)
    assert event.error  # always says something when ok is false
    hook = {"type": "control_request", "request_id": "r4", "request": {"subtype": "hook_callback"}}
    assert _parse(hook) == ControlRequested("r4", "hook_callback", hook)
    # Without a request_id nothing can be answered.
    orphan = {
        "type": "control_request",
        "request": {"subtype": "can_use_tool", "tool_name": "Bash"},
    }
    assert isinstance(_parse(orphan), Unknown)
    result = _parse({"type": "result", "subtype": "error_max_turns", "result_index": 2})
    assert isinstance(result, TurnResult)
    assert (result.is_error, result.result_index) == (True, 2)
    assert final_error_text(result) == "error_max_turns"


# -- parse_line robustness --------------------------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_KNOWN_TYPES = [
    "system", "stream_event", "assistant", "user", "result", "rate_limit_event",
    "control_request", "control_response", "control_cancel_request",
]  # fmt: skip
_FIELD_NAMES = [
    "type", "subtype", "event", "message", "content", "request", "response", "request_id",
    "index", "delta", "content_block", "text", "tool_use_result", "tool_use_id",
    "is_error", "usage", "errors", "permission_denials", "mcp_servers", "tools", "model",
]  # fmt: skip


def _shaped(depth: int) -> st.SearchStrategy[Any]:
    """Objects built from the protocol's own field names, so the parsers' branches get hit."""
    leaf = _json | st.sampled_from(
        [*_KNOWN_TYPES, "text_delta", "tool_use", "tool_result", "can_use_tool", "init", "success"]
    )
    if depth == 0:
        return leaf
    child = _shaped(depth - 1)
    return (
        leaf
        | st.lists(child, max_size=3)
        | st.dictionaries(st.sampled_from(_FIELD_NAMES), child, max_size=5)
    )


_envelopes = st.builds(
    lambda kind, fields: {**fields, "type": kind},
    st.sampled_from(_KNOWN_TYPES),
    st.dictionaries(st.sampled_from(_FIELD_NAMES), _shaped(3), max_size=6),
)


@given(st.dictionaries(st.text(max_size=8), _json, max_size=6) | _envelopes)
def test_any_json_object_parses_to_an_event(obj: dict[str, Any]) -> None:
    event = parse_line(orjson.dumps(obj))
    assert event is not None


_Path = tuple[str | int, ...]


def _paths(value: Any, prefix: _Path = ()) -> list[_Path]:
    """Every key or index path inside a decoded JSON value."""
    if isinstance(value, dict):
        items: list[tuple[str | int, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return []
    paths: list[_Path] = []
    for key, child in items:
        paths.append((*prefix, key))
        paths += _paths(child, (*prefix, key))
    return paths


_ONE_OF_EACH_LINE = sorted(
    {line for _, line in _recorded_stdout_lines() if len(line) < 2000} if FIXTURES else set()
)


@given(st.data())
def test_damaged_recorded_lines_still_parse(data: st.DataObject) -> None:
    # Real lines with fields deleted or replaced by random JSON: the shapes a
    # newer or buggy CLI might send, deep inside the structures the parsers walk.
    obj = orjson.loads(data.draw(st.sampled_from(_ONE_OF_EACH_LINE)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(obj)
        if not paths:
            break
        *parents, key = data.draw(st.sampled_from(paths))
        container = obj
        for step in parents:
            container = container[step]
        if data.draw(st.booleans()):
            container[key] = data.draw(_json)
        else:
            del container[key]
    assert parse_line(orjson.dumps(obj)) is not None


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"this is not json",
        b'{"type":"result"',
        b"\xff\xfe",
        b'{"a":NaN}',
        b"[1,2]",
        b'"text"',
        b"null",
        b"[" * 2000 + b"]" * 2000,
    ],
)
def test_lines_that_are_not_json_objects_raise_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_line(line)
    assert len(str(info.value)) < 400


def test_protocol_error_names_the_start_of_the_line() -> None:
    line = b'{"type":"assistant","message":' + b"x" * 10_000
    with pytest.raises(ProtocolError, match="not valid JSON") as info:
        parse_line(line)
    assert '{"type":"assistant"' in str(info.value)
    assert len(str(info.value)) < 400


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"type": 5}, Unknown(None, None, {"type": 5})),
        (
            {"type": "system", "subtype": 7},
            Unknown("system", None, {"type": "system", "subtype": 7}),
        ),
        ({"type": "assistant", "message": "x"}, AssistantMessage("", (), None, False, None, False)),
        ({"type": "user", "message": "x"}, UserMessage(None, (), "", False)),
        (
            {"type": "user", "message": {"content": "typed text"}},
            UserMessage(None, (), "typed text", False),
        ),
        (
            {"type": "system", "subtype": "api_retry", "attempt": True, "retry_delay_ms": "soon"},
            ApiRetry(0, 0, None, "", 0.0),
        ),
    ],
)
def test_wrong_field_types_give_the_best_event(obj: dict[str, Any], expected: ClaudeEvent) -> None:
    assert _parse(obj) == expected


def test_result_with_mistyped_fields_is_still_the_end_of_the_turn() -> None:
    obj = {
        "type": "result",
        "is_error": "yes",
        "usage": [],
        "errors": ["a", 3, "b"],
        "num_turns": 1.5,
    }
    result = _parse(obj)
    assert isinstance(result, TurnResult)
    assert (result.subtype, result.is_error, result.errors, result.num_turns) == (
        "",
        True,
        ("a", "b"),
        0,
    )
    assert final_error_text(result) == "a; b"


# -- LineBuffer ---------------------------------------------------------------------


def _normalise(items: list[bytes | LineTooLong]) -> list[bytes | tuple[str, int]]:
    return [("too long", item.length) if isinstance(item, LineTooLong) else item for item in items]


def _drain(
    buffer: LineBuffer, chunks: list[bytes] | list[bytearray]
) -> list[bytes | tuple[str, int]]:
    items: list[bytes | LineTooLong] = []
    for chunk in chunks:
        items += buffer.feed(chunk)
    tail = buffer.eof()
    if tail is not None:
        items.append(tail)
    return _normalise(items)


def _oracle(data: bytes, max_line: int) -> list[bytes | tuple[str, int]]:
    out: list[bytes | tuple[str, int]] = []
    for raw in data.split(b"\n"):
        if len(raw) > max_line:
            out.append(("too long", len(raw)))
        elif raw.removesuffix(b"\r"):
            out.append(raw.removesuffix(b"\r"))
    return out


@given(
    data=st.lists(
        st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"{}", b"\xff"]), max_size=60
    ).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10),
    max_line=st.integers(min_value=1, max_value=12),
)
def test_any_chunking_gives_the_same_lines(data: bytes, cuts: list[int], max_line: int) -> None:
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    whole = _drain(LineBuffer(max_line), [data])
    assert _drain(LineBuffer(max_line), chunks) == whole
    assert _drain(LineBuffer(max_line), [bytearray([b]) for b in data]) == whole
    assert whole == _oracle(data, max_line)


def _drain_as_output_does(buffer: LineBuffer, chunks: list[bytes]) -> list[bytes | tuple[str, int]]:
    """What `ProviderOutput` takes: each complete line with `complete`, the rest fed."""
    items: list[bytes | LineTooLong] = []
    for chunk in chunks:
        begin = 0
        while (newline := chunk.find(b"\n", begin)) != -1:
            line = buffer.complete(chunk, begin, newline)
            if line is not None:
                items.append(line)
            begin = newline + 1
        if begin < len(chunk):
            items += buffer.feed(chunk[begin:])
    tail = buffer.eof()
    if tail is not None:
        items.append(tail)
    return _normalise(items)


@given(
    data=st.lists(
        st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"{}", b"\xff"]), max_size=60
    ).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10),
    max_line=st.integers(min_value=1, max_value=12),
)
def test_complete_gives_the_lines_feed_gives(data: bytes, cuts: list[int], max_line: int) -> None:
    """`LineBuffer.complete` (a line cut straight out of the chunk) gives, for any chunking,
    the same lines, over-long lines and their lengths as `feed`."""
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    assert _drain_as_output_does(LineBuffer(max_line), chunks) == _oracle(data, max_line)


def test_a_200_kb_line_in_small_chunks() -> None:
    line = orjson.dumps({"type": "system", "subtype": "hook_response", "stdout": "y" * 200_000})
    data = line + b"\r\n" + b'{"type":"keep_alive"}\n'
    buffer = LineBuffer()
    items: list[bytes | LineTooLong] = []
    for start in range(0, len(data), 4096):
        items += buffer.feed(data[start : start + 4096])
    assert items == [line, b'{"type":"keep_alive"}']
    assert buffer.eof() is None
    event = parse_line(line)
    assert isinstance(event, SystemNotice)


def test_an_over_long_line_is_reported_in_place_and_the_next_line_survives() -> None:
    buffer = LineBuffer(max_line=1000)
    head = b'{"type":"user","huge":"'
    items = buffer.feed(b"first\n" + head + b"z" * 700)
    assert items == [b"first"]
    items = buffer.feed(b"z" * 700 + b'"}\nnext\n')
    assert items[1:] == [b"next"]
    (too_long,) = items[:1]
    assert isinstance(too_long, LineTooLong)
    assert isinstance(too_long, ProtocolError)
    assert too_long.length == len(head) + 1400 + 2
    assert too_long.head.startswith(head)
    assert "1000 bytes" in str(too_long)
    assert '{"type":"user"' in str(too_long)


def test_eof_returns_the_unterminated_tail_once() -> None:
    buffer = LineBuffer(max_line=5)
    assert buffer.feed(b"ok\nlast\r") == [b"ok"]
    assert buffer.eof() == b"last"
    assert buffer.eof() is None
    buffer.feed(b"123456")
    tail = buffer.eof()
    assert isinstance(tail, LineTooLong)
    assert tail.length == 6


def test_max_line_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_line"):
        LineBuffer(max_line=0)


# -- encoders -----------------------------------------------------------------------


def test_encoders_match_the_documented_shapes() -> None:
    cases: list[tuple[bytes, dict[str, Any]]] = [
        (
            encode_user_message("hi", "s1"),
            {"type": "user", "message": {"role": "user", "content": "hi"}, "parent_tool_use_id": None, "session_id": "s1"},
        ),
        (
            encode_user_message("hi"),
            {"type": "user", "message": {"role": "user", "content": "hi"}, "parent_tool_use_id": None, "session_id": ""},
        ),
        (
            encode_initialize("req_1"),
            {"type": "control_request", "request_id": "req_1", "request": {"subtype": "initialize", "hooks": None}},
        ),
        (
            encode_set_permission_mode("req_2", "acceptEdits"),
            {"type": "control_request", "request_id": "req_2", "request": {"subtype": "set_permission_mode", "mode": "acceptEdits"}},
        ),
        (
            encode_interrupt("req_3"),
            {"type": "control_request", "request_id": "req_3", "request": {"subtype": "interrupt"}},
        ),
        (
            encode_set_model("req_4", "sonnet"),
            {"type": "control_request", "request_id": "req_4", "request": {"subtype": "set_model", "model": "sonnet"}},
        ),
        (
            encode_permission_allow("u1", {"command": "ls"}),
            {"type": "control_response", "response": {"subtype": "success", "request_id": "u1", "response": {"behavior": "allow", "updatedInput": {"command": "ls"}}}},
        ),
        (
            encode_permission_deny("u2", "no"),
            {"type": "control_response", "response": {"subtype": "success", "request_id": "u2", "response": {"behavior": "deny", "message": "no"}}},
        ),
        (
            encode_control_error("u3", "unsupported"),
            {"type": "control_response", "response": {"subtype": "error", "request_id": "u3", "error": "unsupported"}},
        ),
    ]  # fmt: skip
    for line, shape in cases:
        assert line.endswith(b"\n")
        assert b"\n" not in line[:-1]
        assert orjson.loads(line) == shape


@given(st.text())
def test_any_user_text_is_one_line_of_valid_json(text: str) -> None:
    line = encode_user_message(text, "s")
    assert line.count(b"\n") == 1
    assert line.endswith(b"\n")
    assert orjson.loads(line)["message"]["content"] == text


def test_awkward_user_text_round_trips() -> None:
    text = 'say "hi"\nthen\r\n\ttab \\ back \u2028 sep \u00e9 \U0001f600 \x00'
    line = encode_user_message(text)
    assert line.count(b"\n") == 1
    assert orjson.loads(line)["message"]["content"] == text


def test_an_unencodable_value_raises_instead_of_writing_a_bad_line() -> None:
    with pytest.raises(TypeError):
        encode_user_message("lone \ud800 surrogate")
    with pytest.raises(TypeError):
        encode_permission_allow("r", {"when": object()})


# -- argv ------------------------------------------------------------------------------

_BASE = [
    "claude", "--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
    "--include-partial-messages", "--permission-prompt-tool", "stdio",
]  # fmt: skip


def test_build_argv() -> None:
    assert build_argv("claude") == _BASE
    assert build_argv(
        "claude", model="sonnet", permission_mode="default", resume="abc", extra=["--add-dir", "/x"]
    ) == [
        *_BASE,
        "--permission-mode",
        "default",
        "--model",
        "sonnet",
        "--resume",
        "abc",
        "--add-dir",
        "/x",
    ]
    assert build_argv("claude", session_id="11111111-2222-4333-8444-555555555555")[-2:] == [
        "--session-id",
        "11111111-2222-4333-8444-555555555555",
    ]


def test_build_argv_matches_the_recorded_spawn() -> None:
    meta = orjson.loads((FIXTURES / f"{_MULTITURN}.meta.json").read_bytes())
    assert build_argv("claude", permission_mode="default") == meta["argv"]


def test_build_argv_refuses_contradictions() -> None:
    with pytest.raises(ValueError, match="resume or session_id"):
        build_argv("claude", resume="a", session_id="b")
    with pytest.raises(TypeError, match="sequence"):
        build_argv("claude", extra="--verbose")


def _as_delta(event: ClaudeEvent) -> tuple[int, str, bool] | None:
    """What the hot path takes: the main agent's text and thinking deltas (a subagent's
    line, with a parent tool call, goes the slow way)."""
    if getattr(event, "parent_tool_use_id", None):
        return None
    if isinstance(event, TextDelta):
        return (event.index, event.text, False)
    if isinstance(event, ThinkingDelta):
        return (event.index, event.text, True)
    return None


def test_the_hot_path_reads_every_recorded_delta_as_parse_line_does() -> None:
    """`streamed_text` (the session's shortcut for the main agent's text and thinking
    deltas) gives what `parse_line`'s TextDelta / ThinkingDelta hold for every recorded
    line, and None for every line that is not one, a subagent's delta included."""
    deltas = 0
    for name, line in _recorded_stdout_lines():
        expected = _as_delta(parse_line(line))
        assert streamed_text(orjson.loads(line)) == expected, (name, line[:200])
        deltas += expected is not None
    assert deltas > 50


def test_the_hot_path_leaves_a_subagents_delta_to_the_slow_path() -> None:
    """A delta with a parent tool call is a subagent's (a background one's is its task's
    output, not the turn's text): `streamed_text` gives None for it, as for any non-delta,
    while the same delta without a parent (or with an empty one) is the main agent's."""
    line = {
        "type": "stream_event",
        "event": {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        "parent_tool_use_id": "toolu_01",
    }
    assert streamed_text(line) is None
    assert getattr(parse_line(orjson.dumps(line)), "parent_tool_use_id", None) == "toolu_01"
    assert streamed_text({**line, "parent_tool_use_id": None}) == (0, "hi", False)
    assert streamed_text({**line, "parent_tool_use_id": ""}) == (0, "hi", False)


@given(st.data())
def test_the_hot_path_agrees_with_parse_line_on_damaged_lines(data: st.DataObject) -> None:
    """Recorded lines with fields deleted or replaced: `streamed_text` and `parse_line`
    still agree (a shortcut that read a damaged delta differently would show here)."""
    obj = orjson.loads(data.draw(st.sampled_from([line for line in _ONE_OF_EACH_LINE if b"_delta" in line])))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(obj)
        if not paths:
            break
        *parents, key = data.draw(st.sampled_from(paths))
        container = obj
        for step in parents:
            container = container[step]
        if data.draw(st.booleans()):
            container[key] = data.draw(_json)
        else:
            del container[key]
    assert streamed_text(obj) == _as_delta(parse_line(orjson.dumps(obj)))
