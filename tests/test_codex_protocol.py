"""The sans-IO Codex app-server protocol core: parsing Codex's lines, encoding the host's.

Every recorded stdout line of the bundled Codex recordings is parsed; hand-made lines
cover what the recordings lack (errors, unknown methods and item types, newer fields).
The encoded lines are checked against the app-server's own JSON Schema (codex 0.171.0)
where the shared fixtures are on this machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from t3d.errors import ProtocolError
from t3d.providers.codex import events as ce
from t3d.providers.codex.encode import (
    RUNTIME_MODES,
    approval_result,
    build_argv,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
    thread_resume_params,
    thread_start_params,
    turn_interrupt_params,
    turn_start_params,
)
from t3d.providers.codex.protocol import ClientCalls, parse_line, turn_error_text

REPO = Path(__file__).resolve().parents[1]
CODEX = REPO / "replay_fixtures" / "codex"
MULTITURN = CODEX / "codex-0.171.0_app-server_multiturn.jsonl"
DECLINED = CODEX / "codex-0.171.0_app-server_command_declined.jsonl"
ERROR_PATHS = CODEX / "codex-0.171.0_app-server_error_paths.jsonl"
SCHEMA = Path("/work/shared/providers/fixtures/codex/schema-0.171.0")

Json = dict[str, Any]


def stdout_lines(path: Path) -> list[bytes]:
    return [
        raw.encode() for raw in path.read_text().splitlines() if raw and not raw.startswith(">>> ")
    ]


def line(obj: Json) -> bytes:
    return orjson.dumps(obj)


def test_every_recorded_line_parses_to_a_modelled_event() -> None:
    """No recorded line is Unknown; notifications the daemon ignores are OtherNotification,
    and each kind the recordings hold comes out as its class with the recorded fields."""
    events = [parse_line(raw) for path in (MULTITURN, DECLINED, ERROR_PATHS) for raw in stdout_lines(path)]
    assert not [e for e in events if isinstance(e, ce.Unknown)]
    kinds = {type(e).__name__ for e in events}
    assert {
        "Response", "ErrorResponse", "ThreadStarted", "TurnStarted", "TurnCompleted", "ItemStarted",
        "ItemCompleted", "TextDelta", "WarningNotice", "TokenUsageUpdated", "RequestResolved",
        "ApprovalRequested", "OtherNotification",
    } <= kinds  # fmt: skip
    others = {e.method for e in events if isinstance(e, ce.OtherNotification)}
    assert others == {"remoteControl/status/changed", "thread/status/changed", "account/rateLimits/updated"}

    approval, declined_approval = [e for e in events if isinstance(e, ce.ApprovalRequested)]
    assert declined_approval.id == 0  # each recording's server requests count from 0
    assert approval.id == 0 and approval.kind == "command" and not approval.legacy
    assert approval.command == "/bin/bash -lc 'touch created-by-codex.txt && ls'"
    assert approval.available == ("accept", "cancel")  # the amendment object is not a plain decision
    commands = [e.item for e in events if isinstance(e, ce.ItemCompleted) and isinstance(e.item, ce.CommandItem)]
    assert [(c.status, c.exit_code) for c in commands] == [("completed", 0), ("declined", None)]
    assert commands[0].output == "README.md\ncreated-by-codex.txt\n"
    ends = [e for e in events if isinstance(e, ce.TurnCompleted)]
    assert [e.status for e in ends] == ["completed"] * 3 + ["interrupted", "completed", "completed"]
    errors = [e for e in events if isinstance(e, ce.ErrorResponse)]
    assert [(e.id, e.code, e.message[:20]) for e in errors] == [
        (1, -32600, "Not initialized"),
        (3, -32600, "Already initialized"),
        (4, -32600, "no rollout found for"),
    ]


def test_lines_that_are_not_json_objects_raise_protocol_errors_naming_the_line() -> None:
    """Invalid JSON, a list, a string and invalid UTF-8 raise ProtocolError with a preview."""
    for raw in (b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe"):
        with pytest.raises(ProtocolError, match="Codex wrote"):
            parse_line(raw)


def test_unknown_methods_requests_and_item_types_parse_and_keep_their_fields() -> None:
    """An unknown notification, an unknown server request, an item type of a newer Codex and
    mistyped fields all parse (with defaults), never raise, and keep the object they came in."""
    note = parse_line(line({"method": "thread/goal/updated", "params": {"goal": "x"}}))
    assert note == ce.OtherNotification("thread/goal/updated", {"goal": "x"})
    request = parse_line(line({"method": "item/tool/requestUserInput", "id": 7, "params": {"q": 1}}))
    assert request == ce.OtherServerRequest(7, "item/tool/requestUserInput", {"q": 1})
    item = {"type": "hologram", "id": "h1", "beam": [1, 2]}
    started = parse_line(line({"method": "item/started", "params": {"threadId": "t", "turnId": "u", "item": item}}))
    assert started == ce.ItemStarted("t", "u", ce.OtherItem("h1", "hologram", item))
    mistyped = parse_line(line({"method": "item/agentMessage/delta", "params": {"threadId": 5, "delta": ["x"]}}))
    assert mistyped == ce.TextDelta("", "", "", "agentMessage", "", 0)
    assert isinstance(parse_line(line({"id": 3})), ce.Unknown)
    assert isinstance(parse_line(line({"method": "x", "id": None})), ce.Unknown)  # cannot be answered


def test_errors_with_and_without_will_retry_and_a_failed_turn() -> None:
    """`error` notifications carry willRetry, details and Codex's error code; a failed
    turn/completed carries its error; turn_error_text joins message and details once."""
    retry = parse_line(line({"method": "error", "params": {
        "error": {"message": "Reconnecting... 2/5", "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": None}},
                  "additionalDetails": "stream disconnected"},
        "willRetry": True, "threadId": "t", "turnId": "u"}}))  # fmt: skip
    assert retry == ce.ErrorNotice("t", "u", "Reconnecting... 2/5", "stream disconnected", "responseStreamDisconnected", True)
    failed = parse_line(line({"method": "turn/completed", "params": {"threadId": "t", "turn": {
        "id": "u", "status": "failed", "error": {"message": "unexpected status 401", "codexErrorInfo": "unauthorized"}}}}))  # fmt: skip
    assert failed == ce.TurnCompleted("t", "u", "failed", "unexpected status 401", None, "unauthorized", None)
    assert turn_error_text("boom", "details") == "boom (details)"
    assert turn_error_text("boom: details", "details") == "boom: details"
    assert turn_error_text("boom", None) == "boom"


def test_approval_requests_of_every_kind() -> None:
    """File-change, permissions and legacy approvals parse with their kind and ids."""
    change = parse_line(line({"method": "item/fileChange/requestApproval", "id": 1, "params": {
        "itemId": "c1", "threadId": "t", "turnId": "u", "reason": "write outside", "startedAtMs": 1}}))  # fmt: skip
    assert isinstance(change, ce.ApprovalRequested)
    assert (change.kind, change.item_id, change.reason, change.available) == ("file_change", "c1", "write outside", None)
    legacy = parse_line(line({"method": "execCommandApproval", "id": "a", "params": {
        "conversationId": "t", "callId": "c2", "command": ["ls", "-l"], "cwd": "/w"}}))  # fmt: skip
    assert isinstance(legacy, ce.ApprovalRequested)
    assert (legacy.legacy, legacy.thread_id, legacy.item_id, legacy.command) == (True, "t", "c2", "ls -l")
    perms = parse_line(line({"method": "item/permissions/requestApproval", "id": 2, "params": {"permissions": {"network": {"enabled": True}}}}))
    assert isinstance(perms, ce.ApprovalRequested) and perms.kind == "permissions"


def approval(kind: str, *, legacy: bool = False, available: tuple[str, ...] | None = None) -> ce.ApprovalRequested:
    params = {"permissions": {"network": {"enabled": True}}} if kind == "permissions" else {}
    return ce.ApprovalRequested(0, "m", kind, legacy, "t", "u", "i", None, None, None, available, params)


def test_decisions_map_onto_each_kind_of_approval() -> None:
    """allow/allow_session/deny/cancel become accept/acceptForSession/decline/cancel (accept
    when the session-wide one is not offered), the legacy spellings, or a permissions grant."""
    command = approval("command")
    assert [approval_result(command, d)["decision"] for d in ("allow", "allow_session", "deny", "cancel")] == [
        "accept", "acceptForSession", "decline", "cancel",
    ]  # fmt: skip
    offered = approval("command", available=("accept", "cancel"))
    assert approval_result(offered, "allow_session") == {"decision": "accept"}
    legacy = approval("command", legacy=True)
    assert approval_result(legacy, "allow") == {"decision": "approved"}
    assert approval_result(legacy, "allow_session") == {"decision": "approved_for_session"}
    assert approval_result(legacy, "deny", "no") == {"decision": {"denied": {"rejection": "no"}}}
    assert approval_result(legacy, "cancel") == {"decision": "abort"}
    perms = approval("permissions")
    assert approval_result(perms, "allow_session") == {"permissions": {"network": {"enabled": True}}, "scope": "session"}
    assert approval_result(perms, "deny") == {"permissions": {}}


def test_client_calls_match_responses_to_their_requests() -> None:
    """Ids count up from 1; a response settles its request once; unknown ids settle nothing."""
    calls = ClientCalls()
    assert (calls.start("initialize"), calls.start("thread/start")) == (1, 2)
    assert calls.settle(2) == "thread/start" and calls.settle(2) is None
    assert calls.settle("x") is None and calls.settle(None) is None
    assert calls.forget() == [1] and calls.open == 0


def test_encoded_lines_are_single_json_lines_the_server_accepts() -> None:
    """Requests, notifications, results and errors are one line each, with jsonrpc 2.0."""
    for encoded in (
        encode_request(4, "turn/start", turn_start_params("t", "line1\nline2")),
        encode_notification("initialized"),
        encode_result(0, {"decision": "accept"}),
        encode_error(3, "t3d does not support 'x'"),
    ):
        assert encoded.endswith(b"\n") and encoded.count(b"\n") == 1
        assert json.loads(encoded)["jsonrpc"] == "2.0"
    assert json.loads(encode_error(3, "no"))["error"] == {"code": -32601, "message": "no"}
    assert build_argv("codex", overrides=["model=o3"]) == ["codex", "app-server", "-c", "model=o3"]
    with pytest.raises(TypeError):
        build_argv("codex", overrides="model=o3")


def test_runtime_modes_map_onto_approval_policy_and_sandbox() -> None:
    """Each runtime mode gives its approval policy and sandbox; an unknown one the default."""
    assert thread_start_params("/w", "full-access", "o3") == {
        "cwd": "/w", "approvalPolicy": "never", "sandbox": "danger-full-access", "model": "o3",
    }  # fmt: skip
    assert thread_start_params("/w", None, None) == {"cwd": "/w", "approvalPolicy": "untrusted", "sandbox": "workspace-write"}
    assert thread_resume_params("id", "/w", "auto-accept-edits", None)["approvalPolicy"] == "on-request"
    assert turn_interrupt_params("t", "u") == {"threadId": "t", "turnId": "u"}


def _definitions() -> Json:
    bundle = SCHEMA / "codex_app_server_protocol.v2.schemas.json"
    if not bundle.exists():
        pytest.skip(f"the Codex schema is not on this machine ({SCHEMA})")
    return json.loads(bundle.read_text())["definitions"]  # type: ignore[no-any-return]


def _enum(definition: Json) -> set[str]:
    values: set[str] = set(definition.get("enum", []))
    for option in definition.get("oneOf", []) + definition.get("anyOf", []):
        values |= set(option.get("enum", []))
    return values


def test_what_t3d_sends_is_in_the_app_servers_own_schema() -> None:
    """Every approval policy, sandbox and approval decision t3d sends is a value codex 0.171.0's
    generated JSON Schema allows, and the request params use its field names."""
    defs = _definitions()
    assert {policy for policy, _ in RUNTIME_MODES.values()} <= _enum(defs["AskForApproval"])
    assert {sandbox for _, sandbox in RUNTIME_MODES.values()} <= _enum(defs["SandboxMode"])
    command_decisions = json.loads((SCHEMA / "CommandExecutionRequestApprovalResponse.json").read_text())
    file_decisions = json.loads((SCHEMA / "FileChangeRequestApprovalResponse.json").read_text())
    for schema, kind in ((command_decisions, "CommandExecutionApprovalDecision"), (file_decisions, "FileChangeApprovalDecision")):
        allowed = _enum(schema["definitions"][kind])
        for decision in ("allow", "allow_session", "deny", "cancel"):
            assert approval_result(approval("command"), decision)["decision"] in allowed
    for name, params in (
        ("ThreadStartParams", thread_start_params("/w", "full-access", "m")),
        ("ThreadResumeParams", thread_resume_params("t", "/w", None, "m")),
        ("TurnStartParams", turn_start_params("t", "x")),
        ("TurnInterruptParams", turn_interrupt_params("t", "u")),
    ):
        assert set(params) <= set(defs[name]["properties"]), name
