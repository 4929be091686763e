"""Events that `t3d.providers.claude.protocol.parse_line` produces.

One class per kind of Claude Code stdout line (PROTOCOLS.md §1.3). Every class
is frozen data with no behaviour. Field values come from the wire with
defensive defaults: a string field that was missing or had the wrong type is
``""`` (or ``None`` where the wire itself uses null), a number is ``0`` (or
``None``), a list is ``()``.

``raw`` fields hold the decoded line (or the relevant part of it) by
reference, only on events whose shape is open-ended, so that callers can look
further without the parser guessing for them. Dict-valued fields make these
events unhashable; compare them, don't put them in sets.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import attrs

JsonObject: TypeAlias = dict[str, Any]


# -- content blocks ----------------------------------------------------------


@attrs.frozen
class TextBlock:
    """Model text, complete."""

    text: str


@attrs.frozen
class ToolUseBlock:
    """A tool call with its complete input."""

    tool_use_id: str
    name: str
    input: JsonObject


@attrs.frozen
class ThinkingBlock:
    """The model's visible reasoning, complete."""

    text: str


@attrs.frozen
class OtherBlock:
    """A content block of a type this parser does not model (image, redacted_thinking, …)."""

    kind: str
    raw: JsonObject


ContentBlock: TypeAlias = TextBlock | ToolUseBlock | ThinkingBlock | OtherBlock


@attrs.frozen
class ToolResult:
    """The outcome of one tool call, as fed back to the model.

    ``content_text`` is the text the model sees (text parts joined by
    newlines; images are left out). ``structured`` is the line's
    ``tool_use_result``: a dict whose shape depends on the tool, an
    ``"Error: …"`` string, or ``None``. It is only set when the line carries
    exactly one tool result, because the CLI gives one value per line.
    """

    tool_use_id: str
    content_text: str
    is_error: bool
    structured: JsonObject | str | None


@attrs.frozen
class McpServer:
    """One MCP server as listed by ``system/init``; ``status`` is e.g. ``connected`` or ``failed``."""

    name: str
    status: str


@attrs.frozen
class PermissionDenial:
    """A tool call that was refused during the turn, listed in ``result.permission_denials``."""

    tool_name: str
    tool_use_id: str
    tool_input: JsonObject


@attrs.frozen
class Usage:
    """Token counts of one turn (not cumulative, unlike ``total_cost_usd``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


# -- system lines -------------------------------------------------------------


@attrs.frozen
class SystemInit:
    """``system/init``: a user turn has started; repeats for every turn of the process."""

    session_id: str
    model: str
    cwd: str
    tools: tuple[str, ...]
    permission_mode: str
    claude_code_version: str
    api_key_source: str
    mcp_servers: tuple[McpServer, ...]


@attrs.frozen
class StatusChanged:
    """``system/status``: ``requesting`` before each API call; the mode after ``set_permission_mode``."""

    status: str | None
    permission_mode: str | None


@attrs.frozen
class ApiRetry:
    """``system/api_retry``: the CLI is about to retry a failed API call."""

    attempt: int
    max_retries: int
    error_status: int | None
    error: str
    retry_delay_ms: float


@attrs.frozen
class SystemNotice:
    """Any other ``system`` subtype (hooks, tasks, thinking_tokens, compact_boundary, …)."""

    subtype: str
    raw: JsonObject


@attrs.frozen
class TaskStarted:
    """``system/task_started``: a task began (a subagent, a background Bash command, a monitor).

    ``task_type`` is e.g. ``local_agent`` or ``local_bash``; ``tool_use_id`` names the tool
    call that started it (an ``Agent`` or ``Bash`` call).
    """

    task_id: str
    tool_use_id: str | None
    task_type: str
    description: str
    subagent_type: str | None
    prompt: str | None


@attrs.frozen
class TaskProgress:
    """``system/task_progress``: what a running task does now (``description``, its last tool)."""

    task_id: str
    tool_use_id: str | None
    description: str
    last_tool_name: str | None
    usage: JsonObject


@attrs.frozen
class TaskUpdated:
    """``system/task_updated``: a change to a task's state; ``status`` from its ``patch``
    (``completed``, ``failed``, ``killed``…) when the patch has one."""

    task_id: str
    status: str | None
    patch: JsonObject


@attrs.frozen
class TaskNotification:
    """``system/task_notification``: a task ended and the agent is told (it may wake up and
    write a turn of its own). ``status`` is e.g. ``completed``, ``failed`` or ``stopped``."""

    task_id: str
    tool_use_id: str | None
    status: str
    summary: str
    output_file: str | None
    usage: JsonObject


# -- stream_event lines (only with --include-partial-messages) ----------------


@attrs.frozen
class MessageStarted:
    """``message_start``: a model call began streaming a message."""

    message_id: str
    model: str
    parent_tool_use_id: str | None


@attrs.frozen
class BlockStarted:
    """``content_block_start``; ``kind`` is ``text``, ``tool_use``, ``thinking`` or another block type.

    ``tool_use_id`` and ``tool_name`` are set only for ``tool_use`` blocks.
    """

    index: int
    kind: str
    tool_use_id: str | None
    tool_name: str | None
    parent_tool_use_id: str | None


@attrs.frozen
class TextDelta:
    """``text_delta``: more text for block ``index``."""

    index: int
    text: str
    parent_tool_use_id: str | None


@attrs.frozen
class ThinkingDelta:
    """``thinking_delta``: more reasoning text for block ``index``."""

    index: int
    text: str
    parent_tool_use_id: str | None


@attrs.frozen
class ToolInputDelta:
    """``input_json_delta``: a piece of the tool input's JSON text for block ``index``."""

    index: int
    partial_json: str
    parent_tool_use_id: str | None


@attrs.frozen
class BlockStopped:
    """``content_block_stop``: block ``index`` is complete."""

    index: int
    parent_tool_use_id: str | None


@attrs.frozen
class MessageDelta:
    """``message_delta``: carries the message's final ``stop_reason`` (``end_turn``, ``tool_use``, …)."""

    stop_reason: str | None
    parent_tool_use_id: str | None = None


@attrs.frozen
class MessageStopped:
    """``message_stop``: the streamed message is complete."""

    parent_tool_use_id: str | None = None


# -- conversation lines -------------------------------------------------------


@attrs.frozen
class AssistantMessage:
    """``assistant``: complete content of one message; the CLI sends one line per block.

    ``synthetic`` marks a message the CLI made up to report a failure (model
    ``<synthetic>``); ``error`` then names it (``authentication_failed``,
    ``server_error``, ``unknown``, …). ``aborted`` marks a partial message cut
    by an interrupt, where the CLI says so.
    """

    message_id: str
    blocks: tuple[ContentBlock, ...]
    error: str | None
    synthetic: bool
    parent_tool_use_id: str | None
    aborted: bool


@attrs.frozen
class UserMessage:
    """``user``: tool results fed back to the model, an interrupt notice, or a replayed prompt.

    ``text`` joins the text of the content that is not a tool result, e.g.
    ``[Request interrupted by user]`` or the echoed prompt when ``is_replay``.
    """

    parent_tool_use_id: str | None
    tool_results: tuple[ToolResult, ...]
    text: str
    is_replay: bool
    # On a subagent's prompt line: the subagent's type and task description.
    subagent_type: str | None = None


@attrs.frozen
class TurnResult:
    """``result``: the turn is over. Exactly one per turn, except with background tasks.

    ``total_cost_usd`` is cumulative for the process; ``usage`` covers this
    turn. An API or auth failure has ``subtype == "success"`` and
    ``is_error``; an interrupt has ``terminal_reason == "aborted_streaming"``.
    ``result_index`` is absent (``None``) before Claude Code 2.1.276.
    """

    subtype: str
    is_error: bool
    result_text: str | None
    session_id: str
    stop_reason: str | None
    terminal_reason: str | None
    total_cost_usd: float | None
    usage: Usage
    num_turns: int
    duration_ms: int
    api_error_status: int | None
    errors: tuple[str, ...]
    permission_denials: tuple[PermissionDenial, ...]
    result_index: int | None
    # What started the turn when it was not a user message: ``task-notification`` (a wake).
    origin_kind: str | None = None


@attrs.frozen
class RateLimited:
    """``rate_limit_event``: subscription rate-limit state; ``status`` is e.g. ``allowed``."""

    status: str | None
    raw: JsonObject


# -- control lines --------------------------------------------------------------


@attrs.frozen
class PermissionRequested:
    """``control_request`` ``can_use_tool``: the CLI waits for an allow or deny answer.

    ``input`` is what `encode_permission_allow` should send back unchanged
    when the host does not edit it. ``suggestions`` are the CLI's proposed
    ``PermissionUpdate`` rules (e.g. "allow this command for the session").
    """

    request_id: str
    tool_name: str
    display_name: str
    input: JsonObject
    tool_use_id: str | None
    description: str | None
    blocked_path: str | None
    suggestions: tuple[JsonObject, ...]
    # Set when the prompt comes from inside a subagent: the subagent's task id.
    agent_id: str | None = None


@attrs.frozen
class ControlRequested:
    """Any other ``control_request`` from the CLI (hook_callback, mcp_message, …).

    The CLI may wait for an answer; reply with `encode_control_error` if the
    host does not support ``subtype``.
    """

    request_id: str
    subtype: str
    raw: JsonObject


@attrs.frozen
class ControlResponded:
    """``control_response``: the CLI answered the host's request ``request_id``.

    ``response`` is ``None`` when the CLI sent none (2.1.197 answers
    ``interrupt`` that way). ``error`` is set when ``ok`` is false.
    """

    request_id: str
    ok: bool
    response: JsonObject | None
    error: str | None


@attrs.frozen
class ControlCancelled:
    """``control_cancel_request``: the CLI withdrew its request ``request_id``; don't answer it."""

    request_id: str


@attrs.frozen
class Unknown:
    """A line of a type or subtype this parser does not model; safe to ignore.

    ``type`` is ``None`` when the line had no string ``type``; ``subtype`` is
    the ``subtype``, stream event type or control subtype when there is one.
    """

    type: str | None
    subtype: str | None
    raw: JsonObject


ClaudeEvent: TypeAlias = (
    SystemInit
    | StatusChanged
    | ApiRetry
    | SystemNotice
    | TaskStarted
    | TaskProgress
    | TaskUpdated
    | TaskNotification
    | MessageStarted
    | BlockStarted
    | TextDelta
    | ThinkingDelta
    | ToolInputDelta
    | BlockStopped
    | MessageDelta
    | MessageStopped
    | AssistantMessage
    | UserMessage
    | TurnResult
    | RateLimited
    | PermissionRequested
    | ControlRequested
    | ControlResponded
    | ControlCancelled
    | Unknown
)
