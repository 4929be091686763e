"""Codex app-server → host side of the protocol (PROTOCOLS.md §2.2-§2.6). Sans-IO.

Theory of operation
-------------------
``codex app-server`` speaks JSON-RPC 2.0 as newline-delimited JSON on stdio and
leaves the ``"jsonrpc"`` field out of its own messages. This module does no I/O:

* `parse_line` turns one stdout line into one event from
  `t3d.providers.codex.events`: a `Response` or `ErrorResponse` to a host
  request (matched by ``id``), a server→client request (an `ApprovalRequested`,
  or an `OtherServerRequest` the host must refuse), or a notification (the
  thread, turn, item, delta, error and usage ones parsed into fields, the rest
  `OtherNotification`).
* `ClientCalls` picks the host's request ids and matches responses to the
  requests they answer; after a daemon restart it counts on from the ids the
  previous daemon used (`ClientCalls.skip_past`).
* `turn_error_text` gives the message for a failed turn or error notice.

The session driver owns the pipes: it cuts stdout into lines with
`t3d.providers.lines.LineBuffer`, parses them here and writes the lines that
`t3d.providers.codex.encode` builds.

Rules
-----
* **Remote errors.** `parse_line` raises `ProtocolError` only for a line that
  is not a JSON object. Any object parses: a message with both ``method`` and
  ``id`` is a server request, with ``method`` only a notification, with
  ``result`` or ``error`` and an ``id`` a response. An unknown method becomes
  `OtherServerRequest` or `OtherNotification`, an unknown item type `OtherItem`,
  and a missing or mistyped field takes its default: each Codex release adds
  methods, item types and fields, so tolerance is the compatible choice. A
  notification that lacks the ids it is routed by (``threadId``, ``itemId``)
  still parses, with ``""`` in their place.
* **Multiplexing.** Every turn-scoped event carries its ``thread_id`` and
  ``turn_id``; one app-server process can serve many threads, and the caller
  routes by them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson

from t3d.errors import ProtocolError
from t3d.providers.codex.events import (
    AgentMessageItem,
    ApprovalRequested,
    CodexEvent,
    CodexItem,
    CommandItem,
    ErrorNotice,
    ErrorResponse,
    FileChange,
    FileChangeItem,
    ItemCompleted,
    ItemStarted,
    JsonObject,
    OtherItem,
    OtherNotification,
    OtherServerRequest,
    PlanItem,
    ReasoningItem,
    RequestId,
    RequestResolved,
    Response,
    TextDelta,
    ThreadStarted,
    TokenUsageUpdated,
    ToolCallItem,
    TurnCompleted,
    TurnStarted,
    Unknown,
    Usage,
    UserMessageItem,
    WarningNotice,
)
from t3d.providers.lines import preview_line

# -- defensive accessors ----------------------------------------------------------


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


def _dict(obj: JsonObject, key: str) -> JsonObject:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _dicts(obj: JsonObject, key: str) -> list[JsonObject]:
    value = obj.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _strs(obj: JsonObject, key: str) -> tuple[str, ...]:
    value = obj.get(key)
    if not isinstance(value, list):
        return ()
    return tuple(item for item in value if isinstance(item, str))


def _request_id(value: object) -> RequestId | None:
    """A JSON-RPC id: an integer or a string (Codex uses integers from 0)."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


def _error_info(value: object) -> str | None:
    """The name of a ``codexErrorInfo``: the string itself, or the key of a one-key object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and value:
        return str(next(iter(value)))
    return None


# -- parsing ----------------------------------------------------------------------


def parse_line(line: bytes) -> CodexEvent:
    """Decode one stdout line into an event.

    Raises `ProtocolError` if the line is not a JSON object; never for an
    object, whatever its fields.
    """
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(
            f"Codex wrote a stdout line that is not valid JSON ({exc}): {preview_line(line)}"
        ) from exc
    if not isinstance(obj, dict):
        raise ProtocolError(
            f"Codex wrote a JSON {type(obj).__name__} where an object was expected: "
            f"{preview_line(line)}"
        )
    method = _opt_str(obj, "method")
    request_id = _request_id(obj.get("id"))
    if method is not None:
        params = _dict(obj, "params")
        if "id" in obj:
            if request_id is None:
                return Unknown(obj)  # a request that cannot be answered
            return _parse_request(request_id, method, params)
        parser = _NOTIFICATIONS.get(method)
        return parser(params) if parser is not None else OtherNotification(method, params)
    if "error" in obj:
        error = _dict(obj, "error")
        return ErrorResponse(
            request_id,
            _opt_int(error, "code"),
            _str(error, "message") or "Codex refused the request with no message",
            error.get("data"),
        )
    if "result" in obj and request_id is not None:
        return Response(request_id, obj["result"])
    return Unknown(obj)


# -- server requests ---------------------------------------------------------------------

# method -> (kind, legacy)
_APPROVALS: Mapping[str, tuple[str, bool]] = {
    "item/commandExecution/requestApproval": ("command", False),
    "item/fileChange/requestApproval": ("file_change", False),
    "item/permissions/requestApproval": ("permissions", False),
    "execCommandApproval": ("command", True),
    "applyPatchApproval": ("file_change", True),
}


def approval_kind(method: str) -> tuple[str, bool] | None:
    """An approval request method's (kind, legacy), or None when ``method`` is no approval."""
    return _APPROVALS.get(method)


def _parse_request(request_id: RequestId, method: str, params: JsonObject) -> CodexEvent:
    approval = _APPROVALS.get(method)
    if approval is None:
        return OtherServerRequest(request_id, method, params)
    kind, legacy = approval
    command = params.get("command")
    if isinstance(command, list):  # the legacy request gives argv
        command = " ".join(str(part) for part in command)
    available = params.get("availableDecisions")
    return ApprovalRequested(
        id=request_id,
        method=method,
        kind=kind,
        legacy=legacy,
        thread_id=_str(params, "threadId") or _str(params, "conversationId"),
        turn_id=_str(params, "turnId"),
        item_id=_str(params, "itemId") or _str(params, "callId"),
        command=command if isinstance(command, str) else None,
        cwd=_opt_str(params, "cwd"),
        reason=_opt_str(params, "reason"),
        available=_strs(params, "availableDecisions") if isinstance(available, list) else None,
        params=params,
    )


# -- notifications -------------------------------------------------------------------


def _ids(params: JsonObject) -> tuple[str, str]:
    return _str(params, "threadId"), _str(params, "turnId")


def _parse_thread_started(params: JsonObject) -> CodexEvent:
    thread = _dict(params, "thread")
    return ThreadStarted(_str(thread, "id"), thread)


def _parse_turn_started(params: JsonObject) -> CodexEvent:
    return TurnStarted(_str(params, "threadId"), _str(_dict(params, "turn"), "id"))


def _parse_turn_completed(params: JsonObject) -> CodexEvent:
    turn = _dict(params, "turn")
    error = turn.get("error")
    error = error if isinstance(error, dict) else None
    return TurnCompleted(
        thread_id=_str(params, "threadId"),
        turn_id=_str(turn, "id"),
        status=_str(turn, "status"),
        error=None if error is None else _str(error, "message") or "the turn failed",
        details=None if error is None else _opt_str(error, "additionalDetails"),
        info=None if error is None else _error_info(error.get("codexErrorInfo")),
        duration_ms=_opt_int(turn, "durationMs"),
    )


def _parse_item_event(
    make: Callable[[str, str, CodexItem], CodexEvent],
) -> Callable[[JsonObject], CodexEvent]:
    def parse(params: JsonObject) -> CodexEvent:
        thread_id, turn_id = _ids(params)
        return make(thread_id, turn_id, parse_item(_dict(params, "item")))

    return parse


def _delta(stream: str, index_key: str | None = None) -> Callable[[JsonObject], CodexEvent]:
    def parse(params: JsonObject) -> CodexEvent:
        thread_id, turn_id = _ids(params)
        index = _int(params, index_key) if index_key else 0
        return TextDelta(
            thread_id, turn_id, _str(params, "itemId"), stream, _str(params, "delta"), index
        )

    return parse


def _parse_error(params: JsonObject) -> CodexEvent:
    thread_id, turn_id = _ids(params)
    error = _dict(params, "error")
    return ErrorNotice(
        thread_id=thread_id,
        turn_id=turn_id,
        message=_str(error, "message") or "Codex reported an error with no message",
        details=_opt_str(error, "additionalDetails"),
        info=_error_info(error.get("codexErrorInfo")),
        will_retry=params.get("willRetry") is True,
    )


def _parse_warning(params: JsonObject) -> CodexEvent:
    return WarningNotice(
        _str(params, "threadId"), _str(params, "message") or _str(params, "summary")
    )


def _usage(obj: JsonObject) -> Usage:
    return Usage(
        input_tokens=_int(obj, "inputTokens"),
        cached_input_tokens=_int(obj, "cachedInputTokens"),
        output_tokens=_int(obj, "outputTokens"),
        reasoning_output_tokens=_int(obj, "reasoningOutputTokens"),
        total_tokens=_int(obj, "totalTokens"),
    )


def _parse_token_usage(params: JsonObject) -> CodexEvent:
    thread_id, turn_id = _ids(params)
    usage = _dict(params, "tokenUsage")
    return TokenUsageUpdated(
        thread_id, turn_id, _usage(_dict(usage, "total")), _usage(_dict(usage, "last"))
    )


def _parse_resolved(params: JsonObject) -> CodexEvent:
    request_id = _request_id(params.get("requestId"))
    if request_id is None:
        return OtherNotification("serverRequest/resolved", params)
    return RequestResolved(_str(params, "threadId"), request_id)


_NOTIFICATIONS: Mapping[str, Callable[[JsonObject], CodexEvent]] = {
    "thread/started": _parse_thread_started,
    "turn/started": _parse_turn_started,
    "turn/completed": _parse_turn_completed,
    "item/started": _parse_item_event(ItemStarted),
    "item/completed": _parse_item_event(ItemCompleted),
    "item/agentMessage/delta": _delta("agentMessage"),
    "item/reasoning/summaryTextDelta": _delta("reasoningSummary", "summaryIndex"),
    "item/reasoning/textDelta": _delta("reasoningText", "contentIndex"),
    "item/plan/delta": _delta("plan"),
    "item/commandExecution/outputDelta": _delta("commandOutput"),
    "item/fileChange/outputDelta": _delta("fileChangeOutput"),
    "error": _parse_error,
    "warning": _parse_warning,
    "configWarning": _parse_warning,
    "thread/tokenUsage/updated": _parse_token_usage,
    "serverRequest/resolved": _parse_resolved,
}


# -- items ------------------------------------------------------------------------------


def _texts(value: object) -> tuple[str, ...]:
    """Reasoning parts: strings, or objects with a ``text``."""
    if not isinstance(value, list):
        return ()
    parts = []
    for part in value:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return tuple(parts)


def _file_changes(item: JsonObject) -> tuple[FileChange, ...]:
    changes = []
    for change in _dicts(item, "changes"):
        kind = change.get("kind")
        kind_name = kind if isinstance(kind, str) else _str(_dict(change, "kind"), "type")
        move = _opt_str(_dict(change, "kind"), "move_path")
        changes.append(FileChange(_str(change, "path"), kind_name, _str(change, "diff"), move))
    return tuple(changes)


def _tool_call(item: JsonObject, kind: str, item_id: str) -> ToolCallItem:
    arguments = item.get("arguments")
    tool_input: JsonObject = arguments if isinstance(arguments, dict) else {}
    result = item.get("result")
    error = item.get("error")
    error_text = error if isinstance(error, str) else _opt_str(_dict(item, "error"), "message")
    if kind == "mcpToolCall":
        name = f"{_str(item, 'server')}/{_str(item, 'tool')}"
    elif kind == "dynamicToolCall":
        namespace = _str(item, "namespace")
        name = f"{namespace}/{_str(item, 'tool')}" if namespace else _str(item, "tool")
        result = item.get("contentItems")
        if item.get("success") is False and error_text is None:
            error_text = "the tool call failed"
    elif kind == "collabAgentToolCall":
        name = _str(item, "tool") or kind
        tool_input = {
            "prompt": item.get("prompt"),
            "receiverThreadIds": item.get("receiverThreadIds"),
        }
    elif kind == "webSearch":
        name, tool_input, result = "web_search", {"query": _str(item, "query")}, item.get("results")
    elif kind == "imageView":
        name, tool_input = "view_image", {"path": _str(item, "path")}
    elif kind == "functionCallOutput":
        name, result = _str(item, "name") or kind, item.get("output")
    else:  # imageGeneration
        name, tool_input = kind, {"prompt": item.get("revisedPrompt")}
        result = item.get("savedPath")
        error_text = error_text or _opt_str(item, "failure")
    return ToolCallItem(
        item_id, kind, name, tool_input, _str(item, "status"), result, error_text, item
    )


_TOOL_CALLS = frozenset(
    {
        "mcpToolCall",
        "dynamicToolCall",
        "collabAgentToolCall",
        "webSearch",
        "imageView",
        "functionCallOutput",
        "imageGeneration",
    }
)


def parse_item(item: JsonObject) -> CodexItem:
    """One ``ThreadItem`` object; an unknown ``type`` gives an `OtherItem`."""
    kind = _str(item, "type")
    item_id = _str(item, "id")
    if kind == "userMessage":
        return UserMessageItem(item_id, item)
    if kind == "agentMessage":
        return AgentMessageItem(item_id, _str(item, "text"), item)
    if kind == "reasoning":
        return ReasoningItem(
            item_id, _texts(item.get("summary")), _texts(item.get("content")), item
        )
    if kind == "plan":
        return PlanItem(item_id, _str(item, "text"), item)
    if kind == "commandExecution":
        return CommandItem(
            id=item_id,
            command=_str(item, "command"),
            cwd=_str(item, "cwd"),
            status=_str(item, "status"),
            exit_code=_opt_int(item, "exitCode"),
            output=_opt_str(item, "aggregatedOutput"),
            duration_ms=_opt_int(item, "durationMs"),
            raw=item,
        )
    if kind == "fileChange":
        return FileChangeItem(item_id, _str(item, "status"), _file_changes(item), item)
    if kind in _TOOL_CALLS:
        return _tool_call(item, kind, item_id)
    return OtherItem(item_id, kind, item)


# -- the host's requests ---------------------------------------------------------------


class ClientCalls:
    """The host's requests in flight: picks their ids and matches responses to them.

    Bounded by the caller: every request is answered or `forget` is called
    (a session forgets them all when its process goes).
    """

    def __init__(self, next_id: int = 1) -> None:
        self._next = next_id
        self._open: dict[RequestId, str] = {}

    @property
    def next_id(self) -> int:
        """The id the next request gets."""
        return self._next

    def skip_past(self, request_id: RequestId | None) -> None:
        """Never hand out ``request_id`` or anything below it again (an id a previous daemon
        used on the same process, seen in a response)."""
        if isinstance(request_id, int) and not isinstance(request_id, bool) and request_id >= self._next:
            self._next = request_id + 1

    def start(self, method: str) -> int:
        """The id for a new request of ``method``."""
        request_id = self._next
        self._next += 1
        self._open[request_id] = method
        return request_id

    def settle(self, request_id: RequestId | None) -> str | None:
        """The method a response answers (now settled), or None if no open request has that id."""
        if request_id is None:
            return None
        return self._open.pop(request_id, None)

    def forget(self) -> list[RequestId]:
        """Drop every open request (their process is gone); returns their ids."""
        ids = list(self._open)
        self._open.clear()
        return ids

    @property
    def open(self) -> int:
        return len(self._open)


def turn_error_text(message: str, details: str | None) -> str:
    """Codex's words for a failure: the message, then the details when they add anything."""
    if details and details not in message:
        return f"{message} ({details})"
    return message
