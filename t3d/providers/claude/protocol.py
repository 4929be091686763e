"""CLI → host side of the Claude Code stream-json protocol (PROTOCOLS.md §1.3).

Theory of operation
-------------------
The CLI writes one JSON object per line on stdout. This module does no I/O
and keeps no session state:

* `parse_line` turns one line into one event from `t3d.providers.claude.events`.
* `final_error_text` gives the message for a failed turn.

The session driver owns the pipes: it cuts stdout into lines with
`t3d.providers.lines.LineBuffer`, parses them here, correlates
``request_id`` s and writes the lines `t3d.providers.claude.encode` builds.

Rules
-----
* **Remote errors.** `parse_line` raises `ProtocolError` only for a line that
  is not a JSON object. Any object parses: an unknown ``type`` or subtype
  becomes `Unknown`, and a missing or mistyped field takes its default. Each
  CLI release adds line types and fields, so tolerance is the compatible
  choice. An event that needs a correlation key (a ``request_id``, a block
  ``index``) and lacks it comes out as `Unknown`, because it cannot be acted on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import orjson

from t3d.errors import ProtocolError
from t3d.providers.claude.events import (
    ApiRetry,
    AssistantMessage,
    BlockStarted,
    BlockStopped,
    ClaudeEvent,
    ContentBlock,
    ControlCancelled,
    ControlRequested,
    ControlResponded,
    JsonObject,
    McpServer,
    MessageDelta,
    MessageStarted,
    MessageStopped,
    OtherBlock,
    PermissionDenial,
    PermissionRequested,
    RateLimited,
    StatusChanged,
    SystemInit,
    SystemNotice,
    TaskNotification,
    TaskProgress,
    TaskStarted,
    TaskUpdated,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolInputDelta,
    ToolResult,
    ToolUseBlock,
    TurnResult,
    Unknown,
    Usage,
    UserMessage,
)
from t3d.providers.lines import preview_line

# -- defensive accessors ----------------------------------------------------------
# Each returns the field when it has the expected JSON type, else a default.
# bool is an int subclass in Python, so numeric accessors exclude it.


def _opt_str(obj: JsonObject, key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def _str(obj: JsonObject, key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _opt_int(obj: JsonObject, key: str) -> int | None:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _int(obj: JsonObject, key: str) -> int:
    value = _opt_int(obj, key)
    return 0 if value is None else value


def _opt_float(obj: JsonObject, key: str) -> float | None:
    value = obj.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _dict(obj: JsonObject, key: str) -> JsonObject:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _dicts(obj: JsonObject, key: str) -> list[JsonObject]:
    """The dict items of a list field; other items are skipped."""
    value = obj.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _strs(obj: JsonObject, key: str) -> tuple[str, ...]:
    value = obj.get(key)
    if not isinstance(value, list):
        return ()
    return tuple(item for item in value if isinstance(item, str))


def _content(message: JsonObject) -> list[JsonObject]:
    """A message's content blocks; a plain string counts as one text block."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return _dicts(message, "content")


def _flatten_text(value: object) -> str:
    """Tool-result content as text: a string as is, or the text parts of a block list."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [
            item["text"]
            for item in value
            if isinstance(item, dict)
            and item.get("type") == "text"
            and isinstance(item.get("text"), str)
        ]
        return "\n".join(parts)
    return ""


# -- parsing ----------------------------------------------------------------------


def parse_line(line: bytes) -> ClaudeEvent:
    """Decode one stdout line into an event.

    Raises `ProtocolError` if the line is not a JSON object; never for an
    object, whatever its fields.
    """
    return parse_value(decode_line(line), line)


def decode_line(line: bytes) -> object:
    """The line's JSON value; raises `ProtocolError` if it is not JSON."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(
            f"Claude Code wrote a stdout line that is not valid JSON ({exc}): {preview_line(line)}"
        ) from exc


def streamed_text(obj: object) -> tuple[int, str, bool] | None:
    """For the main agent's text or thinking delta (most of a turn's lines): (block index,
    text, thinking?), what `parse_line` would put in its `TextDelta` or `ThinkingDelta`;
    None for any other value, a subagent's delta included (one with a
    ``parent_tool_use_id``: the session routes those itself). The session's hot path: no
    event object is built."""
    if type(obj) is not dict or obj.get("type") != "stream_event":
        return None
    parent = obj.get("parent_tool_use_id")
    if type(parent) is str and parent:
        return None
    event = obj.get("event")
    if type(event) is not dict or event.get("type") != "content_block_delta":
        return None
    index, delta = event.get("index"), event.get("delta")
    if type(index) is not int or type(delta) is not dict:
        return None
    kind = delta.get("type")
    if kind == "text_delta":
        text, thinking = delta.get("text"), False
    elif kind == "thinking_delta":
        text, thinking = delta.get("thinking"), True
    else:
        return None
    return (index, text, thinking) if type(text) is str else None


def parse_value(obj: object, line: bytes) -> ClaudeEvent:
    """`parse_line` for a line already decoded (``obj``; ``line`` names it in an error)."""
    if not isinstance(obj, dict):
        raise ProtocolError(
            f"Claude Code wrote a JSON {type(obj).__name__} where an object was expected: "
            f"{preview_line(line)}"
        )
    kind = _opt_str(obj, "type")
    parser = _PARSERS.get(kind) if kind is not None else None
    if parser is None:
        return Unknown(kind, _opt_str(obj, "subtype"), obj)
    return parser(obj)


def _parse_system(obj: JsonObject) -> ClaudeEvent:
    subtype = _opt_str(obj, "subtype")
    if subtype == "init":
        return SystemInit(
            session_id=_str(obj, "session_id"),
            model=_str(obj, "model"),
            cwd=_str(obj, "cwd"),
            tools=_strs(obj, "tools"),
            permission_mode=_str(obj, "permissionMode"),
            claude_code_version=_str(obj, "claude_code_version"),
            api_key_source=_str(obj, "apiKeySource"),
            mcp_servers=tuple(
                McpServer(_str(server, "name"), _str(server, "status"))
                for server in _dicts(obj, "mcp_servers")
            ),
        )
    if subtype == "status":
        return StatusChanged(_opt_str(obj, "status"), _opt_str(obj, "permissionMode"))
    if subtype == "api_retry":
        return ApiRetry(
            attempt=_int(obj, "attempt"),
            max_retries=_int(obj, "max_retries"),
            error_status=_opt_int(obj, "error_status"),
            error=_str(obj, "error"),
            retry_delay_ms=_opt_float(obj, "retry_delay_ms") or 0.0,
        )
    if subtype is None:
        return Unknown("system", None, obj)
    if subtype in _TASK_PARSERS:
        if not _str(obj, "task_id"):
            return Unknown("system", subtype, obj)  # no task to act on
        return _TASK_PARSERS[subtype](obj)
    return SystemNotice(subtype, obj)


def _parse_task_started(obj: JsonObject) -> ClaudeEvent:
    return TaskStarted(
        task_id=_str(obj, "task_id"),
        tool_use_id=_opt_str(obj, "tool_use_id"),
        task_type=_str(obj, "task_type"),
        description=_str(obj, "description"),
        subagent_type=_opt_str(obj, "subagent_type"),
        prompt=_opt_str(obj, "prompt"),
    )


def _parse_task_progress(obj: JsonObject) -> ClaudeEvent:
    return TaskProgress(
        task_id=_str(obj, "task_id"),
        tool_use_id=_opt_str(obj, "tool_use_id"),
        description=_str(obj, "description"),
        last_tool_name=_opt_str(obj, "last_tool_name"),
        usage=_dict(obj, "usage"),
    )


def _parse_task_updated(obj: JsonObject) -> ClaudeEvent:
    patch = _dict(obj, "patch")
    return TaskUpdated(task_id=_str(obj, "task_id"), status=_opt_str(patch, "status"), patch=patch)


def _parse_task_notification(obj: JsonObject) -> ClaudeEvent:
    return TaskNotification(
        task_id=_str(obj, "task_id"),
        tool_use_id=_opt_str(obj, "tool_use_id"),
        status=_str(obj, "status"),
        summary=_str(obj, "summary"),
        output_file=_opt_str(obj, "output_file") or None,
        usage=_dict(obj, "usage"),
    )


_TASK_PARSERS: Mapping[str, Callable[[JsonObject], ClaudeEvent]] = {
    "task_started": _parse_task_started,
    "task_progress": _parse_task_progress,
    "task_updated": _parse_task_updated,
    "task_notification": _parse_task_notification,
}


def _parse_stream_event(obj: JsonObject) -> ClaudeEvent:
    parent = _opt_str(obj, "parent_tool_use_id")
    event = _dict(obj, "event")
    kind = _opt_str(event, "type")
    if kind == "message_start":
        message = _dict(event, "message")
        return MessageStarted(_str(message, "id"), _str(message, "model"), parent)
    if kind == "message_delta":
        return MessageDelta(_opt_str(_dict(event, "delta"), "stop_reason"), parent)
    if kind == "message_stop":
        return MessageStopped(parent)
    index = _opt_int(event, "index")
    if index is None:
        return Unknown("stream_event", kind, obj)
    if kind == "content_block_start":
        block = _dict(event, "content_block")
        block_kind = _str(block, "type")
        if block_kind == "tool_use":
            return BlockStarted(index, block_kind, _str(block, "id"), _str(block, "name"), parent)
        return BlockStarted(index, block_kind, None, None, parent)
    if kind == "content_block_stop":
        return BlockStopped(index, parent)
    if kind == "content_block_delta":
        return _parse_delta(obj, _dict(event, "delta"), index, parent)
    return Unknown("stream_event", kind, obj)


def _parse_delta(obj: JsonObject, delta: JsonObject, index: int, parent: str | None) -> ClaudeEvent:
    kind = _opt_str(delta, "type")
    if kind == "text_delta" and (text := _opt_str(delta, "text")) is not None:
        return TextDelta(index, text, parent)
    if kind == "thinking_delta" and (text := _opt_str(delta, "thinking")) is not None:
        return ThinkingDelta(index, text, parent)
    if kind == "input_json_delta" and (text := _opt_str(delta, "partial_json")) is not None:
        return ToolInputDelta(index, text, parent)
    # signature_delta, citations_delta, …: nothing the host shows.
    return Unknown("stream_event", kind or "content_block_delta", obj)


def _parse_block(block: JsonObject) -> ContentBlock:
    kind = _str(block, "type")
    if kind == "text":
        return TextBlock(_str(block, "text"))
    if kind == "tool_use":
        return ToolUseBlock(_str(block, "id"), _str(block, "name"), _dict(block, "input"))
    if kind == "thinking":
        return ThinkingBlock(_str(block, "thinking"))
    return OtherBlock(kind, block)


def _parse_assistant(obj: JsonObject) -> ClaudeEvent:
    message = _dict(obj, "message")
    return AssistantMessage(
        message_id=_str(message, "id"),
        blocks=tuple(_parse_block(block) for block in _content(message)),
        error=_opt_str(obj, "error"),
        synthetic=message.get("model") == "<synthetic>",
        parent_tool_use_id=_opt_str(obj, "parent_tool_use_id"),
        aborted=obj.get("aborted") is True,
    )


def _parse_user(obj: JsonObject) -> ClaudeEvent:
    blocks = _content(_dict(obj, "message"))
    results = [block for block in blocks if block.get("type") == "tool_result"]
    structured = obj.get("tool_use_result")
    if len(results) != 1 or not isinstance(structured, dict | str):
        structured = None
    texts = [_str(block, "text") for block in blocks if block.get("type") == "text"]
    return UserMessage(
        parent_tool_use_id=_opt_str(obj, "parent_tool_use_id"),
        tool_results=tuple(
            ToolResult(
                tool_use_id=_str(block, "tool_use_id"),
                content_text=_flatten_text(block.get("content")),
                is_error=block.get("is_error") is True,
                structured=structured,
            )
            for block in results
        ),
        text="\n".join(texts),
        is_replay=obj.get("isReplay") is True,
        subagent_type=_opt_str(obj, "subagent_type"),
    )


def _parse_result(obj: JsonObject) -> ClaudeEvent:
    subtype = _str(obj, "subtype")
    is_error = obj.get("is_error")
    usage = _dict(obj, "usage")
    return TurnResult(
        subtype=subtype,
        is_error=is_error if isinstance(is_error, bool) else subtype != "success",
        result_text=_opt_str(obj, "result"),
        session_id=_str(obj, "session_id"),
        stop_reason=_opt_str(obj, "stop_reason"),
        terminal_reason=_opt_str(obj, "terminal_reason"),
        total_cost_usd=_opt_float(obj, "total_cost_usd"),
        usage=Usage(
            input_tokens=_int(usage, "input_tokens"),
            output_tokens=_int(usage, "output_tokens"),
            cache_read_input_tokens=_int(usage, "cache_read_input_tokens"),
            cache_creation_input_tokens=_int(usage, "cache_creation_input_tokens"),
        ),
        num_turns=_int(obj, "num_turns"),
        duration_ms=_int(obj, "duration_ms"),
        api_error_status=_opt_int(obj, "api_error_status"),
        errors=_strs(obj, "errors"),
        permission_denials=tuple(
            PermissionDenial(
                _str(denial, "tool_name"), _str(denial, "tool_use_id"), _dict(denial, "tool_input")
            )
            for denial in _dicts(obj, "permission_denials")
        ),
        result_index=_opt_int(obj, "result_index"),
        origin_kind=_opt_str(_dict(obj, "origin"), "kind"),
    )


def _parse_rate_limit(obj: JsonObject) -> ClaudeEvent:
    return RateLimited(_opt_str(_dict(obj, "rate_limit_info"), "status"), obj)


def _parse_control_request(obj: JsonObject) -> ClaudeEvent:
    request = _dict(obj, "request")
    subtype = _opt_str(request, "subtype")
    request_id = _opt_str(obj, "request_id")
    if request_id is None or subtype is None:
        return Unknown("control_request", subtype, obj)
    if subtype == "can_use_tool":
        return PermissionRequested(
            request_id=request_id,
            tool_name=_str(request, "tool_name"),
            display_name=_str(request, "display_name") or _str(request, "tool_name"),
            input=_dict(request, "input"),
            tool_use_id=_opt_str(request, "tool_use_id"),
            description=_opt_str(request, "description"),
            blocked_path=_opt_str(request, "blocked_path"),
            suggestions=tuple(_dicts(request, "permission_suggestions")),
            agent_id=_opt_str(request, "agent_id"),
        )
    return ControlRequested(request_id, subtype, obj)


def _parse_control_response(obj: JsonObject) -> ClaudeEvent:
    response = _dict(obj, "response")
    subtype = _opt_str(response, "subtype")
    request_id = _opt_str(response, "request_id")
    if request_id is None:
        return Unknown("control_response", subtype, obj)
    ok = subtype == "success"
    body = response.get("response")
    error = None
    if not ok:
        error = _opt_str(response, "error") or f"the CLI answered {subtype!r} with no error text"
    return ControlResponded(request_id, ok, body if isinstance(body, dict) else None, error)


def _parse_control_cancel(obj: JsonObject) -> ClaudeEvent:
    request_id = _opt_str(obj, "request_id")
    if request_id is None:
        return Unknown("control_cancel_request", None, obj)
    return ControlCancelled(request_id)


_PARSERS: Mapping[str, Callable[[JsonObject], ClaudeEvent]] = {
    "system": _parse_system,
    "stream_event": _parse_stream_event,
    "assistant": _parse_assistant,
    "user": _parse_user,
    "result": _parse_result,
    "rate_limit_event": _parse_rate_limit,
    "control_request": _parse_control_request,
    "control_response": _parse_control_response,
    "control_cancel_request": _parse_control_cancel,
}


def final_error_text(result: TurnResult) -> str | None:
    """The message to show for a failed turn, or ``None`` if it succeeded.

    For an ``is_error`` result this is the ``result`` text (``Not logged in ·
    Please run /login``, ``API Error: 400 …``); failing that the ``errors``
    list (``No conversation found with session ID: …``), then the subtype; a result
    line with none of these (a bare ``{"type":"result"}``) says so. An
    interrupted turn only carries a CLI diagnostic in ``errors``; callers that
    sent the interrupt should check ``terminal_reason == "aborted_streaming"``
    first.
    """
    if not result.is_error and result.subtype == "success":
        return None
    if result.is_error and result.result_text:
        return result.result_text
    if result.errors:
        return "; ".join(result.errors)
    if result.subtype:
        return result.subtype
    if result.result_text:
        return f"claude ended the turn with a result line that carries no subtype: {result.result_text[:500]}"
    return "claude ended the turn with a result line that carries no subtype or text"


# -- why a turn failed --------------------------------------------------------------------

# The reason of a turn failed by a result line without a subtype.
NO_SUBTYPE = "result_without_subtype"
_STATUS_IN_TEXT = re.compile(r"API Error: (?:Repeated )?(\d{3})\b")
_TEXT_CATEGORIES = (
    ("Not logged in", "auth_error"),
    ("Invalid API key", "auth_error"),
    ("Failed to authenticate", "auth_error"),
    ("authentication", "auth_error"),
    ("rate limit", "rate_limited"),
    ("Overloaded", "overloaded"),
    ("No conversation found", "session_not_found"),
)
# The ``error`` of a synthetic assistant line (PROTOCOLS.md §1.3) as a category.
_SYNTHETIC_CATEGORIES = {
    "authentication_failed": "auth_error",
    "billing_error": "billing_error",
    "rate_limit": "rate_limited",
    "server_error": "server_error",
    "invalid_request": "invalid_request",
}


def _status_category(status: int) -> str | None:
    if status in (401, 403):
        return "auth_error"
    if status == 429:
        return "rate_limited"
    if status == 529:
        return "overloaded"
    if status >= 500:
        return "server_error"
    if status == 400:
        return "invalid_request"
    return None


def failure_reason(result: TurnResult, synthetic_error: str | None = None) -> str:
    """A machine name for a failed turn: its parts joined by ``:``, most specific first.

    The parts are the result's subtype (left out when it is ``success``, as an API or auth
    failure's is), ``api_error_<status>`` from ``api_error_status`` or the text (``API Error:
    401 …``), and a category (``auth_error``, ``rate_limited``, ``overloaded``,
    ``server_error``, ``invalid_request``, ``session_not_found``…) from the status, the
    synthetic assistant line's ``error`` or the text: ``api_error_401:auth_error``,
    ``error_during_execution:session_not_found``, ``error_max_turns``. Never ``success``,
    never empty (`NO_SUBTYPE` for a result line without a subtype).
    """
    text = " ".join(filter(None, (result.result_text, *result.errors)))
    parts = []
    if not result.subtype:
        parts.append(NO_SUBTYPE)
    elif result.subtype != "success":
        parts.append(result.subtype)
    status = result.api_error_status
    if status is None and (found := _STATUS_IN_TEXT.search(text)):
        status = int(found.group(1))
    if status is not None:
        parts.append(f"api_error_{status}")
    category = _status_category(status) if status is not None else None
    category = category or _SYNTHETIC_CATEGORIES.get(synthetic_error or "")
    if category is None:
        lowered = text.lower()
        category = next((c for needle, c in _TEXT_CATEGORIES if needle.lower() in lowered), None)
    if category is not None and category not in parts:
        parts.append(category)
    return ":".join(parts) or "error_result"
