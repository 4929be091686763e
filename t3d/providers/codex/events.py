"""Messages and events that `t3d.providers.codex.protocol.parse_line` produces.

One class per kind of ``codex app-server`` stdout message (PROTOCOLS.md §2): the
responses to the host's requests, the server's requests (approvals and the
rest) and its notifications, the ones the daemon acts on parsed into fields.
Every class is frozen data with no behaviour. Field values come from the wire
with defensive defaults: a string field that was missing or had the wrong type
is ``""`` (or ``None`` where the wire itself uses null), a number ``0`` (or
``None``), a list ``()``.

Items (``item/started``, ``item/completed``) are parsed into one class per item
type the daemon shows; an item type this module does not model is an
`OtherItem`. Every item keeps its decoded object in ``raw``, so fields a newer
Codex adds are never lost (the adapter keeps them in the turn item's data).
Dict-valued fields make these events unhashable; compare them, don't put them
in sets.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import attrs

JsonObject: TypeAlias = dict[str, Any]
RequestId: TypeAlias = int | str


# -- JSON-RPC envelopes ----------------------------------------------------------


@attrs.frozen
class Response:
    """``{"id", "result"}``: Codex answered the host's request ``id``."""

    id: RequestId
    result: Any


@attrs.frozen
class ErrorResponse:
    """``{"id", "error": {code, message}}``: Codex refused the host's request ``id``.

    ``id`` is ``None`` when Codex could not tell which request it refused.
    """

    id: RequestId | None
    code: int | None
    message: str
    data: Any


@attrs.frozen
class OtherServerRequest:
    """A server→client request the daemon does not serve (``item/tool/requestUserInput``,
    ``item/tool/call``, ``account/chatgptAuthTokens/refresh``, an unknown method, …).

    Codex waits for an answer: reply with `encode_error` so it never hangs.
    """

    id: RequestId
    method: str
    params: JsonObject


@attrs.frozen
class OtherNotification:
    """A notification this parser does not model (``account/rateLimits/updated``,
    ``turn/diff/updated``, ``mcpServer/startupStatus/updated``, …); safe to ignore."""

    method: str
    params: JsonObject


@attrs.frozen
class Unknown:
    """A JSON object that is neither a response, a request nor a notification."""

    raw: JsonObject


# -- items ------------------------------------------------------------------------


@attrs.frozen
class UserMessageItem:
    """``userMessage``: the turn's input, echoed."""

    id: str
    raw: JsonObject


@attrs.frozen
class AgentMessageItem:
    """``agentMessage``: the model's text; ``text`` is complete on ``item/completed``."""

    id: str
    text: str
    raw: JsonObject


@attrs.frozen
class ReasoningItem:
    """``reasoning``: the model's reasoning summary and (when exposed) its raw content."""

    id: str
    summary: tuple[str, ...]
    content: tuple[str, ...]
    raw: JsonObject


@attrs.frozen
class PlanItem:
    """``plan``: the model's plan as text."""

    id: str
    text: str
    raw: JsonObject


@attrs.frozen
class CommandItem:
    """``commandExecution``: a shell command; ``status`` is ``inProgress``, ``completed``,
    ``failed`` or ``declined``; ``output`` (``aggregatedOutput``) is set once it ran."""

    id: str
    command: str
    cwd: str
    status: str
    exit_code: int | None
    output: str | None
    duration_ms: int | None
    raw: JsonObject


@attrs.frozen
class FileChange:
    """One file of a ``fileChange`` item: ``kind`` is ``add``, ``delete`` or ``update``."""

    path: str
    kind: str
    diff: str
    move_path: str | None


@attrs.frozen
class FileChangeItem:
    """``fileChange``: a patch; ``status`` as for commands."""

    id: str
    status: str
    changes: tuple[FileChange, ...]
    raw: JsonObject


@attrs.frozen
class ToolCallItem:
    """A tool call other than a command or a patch: ``mcpToolCall``, ``dynamicToolCall``,
    ``collabAgentToolCall``, ``webSearch``, ``imageView``, ``functionCallOutput``,
    ``imageGeneration``. ``name`` says which tool; ``status`` is ``""`` where the type has none."""

    id: str
    type: str
    name: str
    input: JsonObject
    status: str
    result: Any
    error: str | None
    raw: JsonObject


@attrs.frozen
class OtherItem:
    """An item type this parser does not model (``contextCompaction``, ``hookPrompt``,
    ``enteredReviewMode``, ``sleep``, or one a newer Codex adds)."""

    id: str
    type: str
    raw: JsonObject


CodexItem: TypeAlias = (
    UserMessageItem
    | AgentMessageItem
    | ReasoningItem
    | PlanItem
    | CommandItem
    | FileChangeItem
    | ToolCallItem
    | OtherItem
)


# -- notifications ------------------------------------------------------------------


@attrs.frozen
class ThreadStarted:
    """``thread/started``: a thread exists (after ``thread/start``, ``thread/fork``, …)."""

    thread_id: str
    raw: JsonObject


@attrs.frozen
class TurnStarted:
    thread_id: str
    turn_id: str


@attrs.frozen
class TurnCompleted:
    """``turn/completed``: the turn is over; ``status`` is ``completed``, ``interrupted`` or
    ``failed`` (then ``error`` says why, with ``details`` and Codex's error code ``info``)."""

    thread_id: str
    turn_id: str
    status: str
    error: str | None
    details: str | None
    info: str | None
    duration_ms: int | None


@attrs.frozen
class ItemStarted:
    thread_id: str
    turn_id: str
    item: CodexItem


@attrs.frozen
class ItemCompleted:
    """``item/completed``: the item's final state, authoritative over its deltas."""

    thread_id: str
    turn_id: str
    item: CodexItem


@attrs.frozen
class TextDelta:
    """A streamed piece of an item's text. ``stream`` is ``agentMessage``, ``reasoningSummary``,
    ``reasoningText``, ``plan``, ``commandOutput`` or ``fileChangeOutput``; ``index`` is the
    summary or content part it belongs to (0 where the stream has none)."""

    thread_id: str
    turn_id: str
    item_id: str
    stream: str
    delta: str
    index: int = 0


@attrs.frozen
class ErrorNotice:
    """``error``: something failed in the turn. With ``will_retry`` Codex retries by itself
    (``Reconnecting... 2/5``); without it the turn fails."""

    thread_id: str
    turn_id: str
    message: str
    details: str | None
    info: str | None
    will_retry: bool


@attrs.frozen
class WarningNotice:
    """``warning`` or ``configWarning``: advice that changes nothing in the turn."""

    thread_id: str
    message: str


@attrs.frozen
class Usage:
    """Token counts, as Codex reports them (``total`` is cumulative for the thread)."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0
    total_tokens: int = 0


@attrs.frozen
class TokenUsageUpdated:
    """``thread/tokenUsage/updated``: ``total`` for the thread so far, ``last`` for the last call."""

    thread_id: str
    turn_id: str
    total: Usage
    last: Usage


@attrs.frozen
class RequestResolved:
    """``serverRequest/resolved``: Codex's request ``request_id`` needs no answer any more."""

    thread_id: str
    request_id: RequestId


# -- server requests ------------------------------------------------------------------


@attrs.frozen
class ApprovalRequested:
    """A server→client approval request; Codex waits for the decision.

    ``kind`` is ``command`` (``item/commandExecution/requestApproval``, legacy
    ``execCommandApproval``), ``file_change`` (``item/fileChange/requestApproval``, legacy
    ``applyPatchApproval``) or ``permissions`` (``item/permissions/requestApproval``).
    ``legacy`` marks the v1 methods, whose decisions are spelled differently.
    ``available`` lists the decisions Codex offers, when it says (strings only).
    """

    id: RequestId
    method: str
    kind: str
    legacy: bool
    thread_id: str
    turn_id: str
    item_id: str
    command: str | None
    cwd: str | None
    reason: str | None
    available: tuple[str, ...] | None
    params: JsonObject


CodexEvent: TypeAlias = (
    Response
    | ErrorResponse
    | ThreadStarted
    | TurnStarted
    | TurnCompleted
    | ItemStarted
    | ItemCompleted
    | TextDelta
    | ErrorNotice
    | WarningNotice
    | TokenUsageUpdated
    | RequestResolved
    | ApprovalRequested
    | OtherServerRequest
    | OtherNotification
    | Unknown
)
