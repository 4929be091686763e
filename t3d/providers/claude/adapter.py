"""Claude provider events → domain changes, for one turn. Pure.

Theory of operation: the session driver feeds every parsed stdout event of a
turn to `TurnMapper.feed`, which returns what changed in domain terms:
item upserts (`ItemChanged`, marked ``final`` when the item will not stream
further), permission prompts (`PermissionAsked`), the native session id
(`SessionSeen`) and the turn's end (`TurnEnded`).

Item ids are ``<turn_id>:<key>`` so they are unique across threads: text and
thinking blocks are keyed by message id and block index, tool calls by
``tool_use_id``, prompts by the CLI's request id. In 2.1.197 the complete
``assistant`` line for a block arrives before its ``content_block_stop``;
the k-th assistant block of a message is the block at stream index k.
"""

from __future__ import annotations

from typing import Any

import attrs

from t3d.domain.model import ItemKind, ItemStatus, JsonDict, TurnItem
from t3d.providers.claude import events as ce
from t3d.providers.claude.protocol import NO_SUBTYPE, failure_reason, final_error_text

RESULT_PREVIEW = 16 * 1024
__all__ = ["NO_SUBTYPE", "TurnMapper"]


@attrs.frozen
class ItemChanged:
    item: TurnItem
    final: bool


@attrs.frozen
class PermissionAsked:
    request_id: str
    item: TurnItem
    data: JsonDict


@attrs.frozen
class SessionSeen:
    native_session_id: str
    model: str


@attrs.frozen
class TurnEnded:
    status: str
    error: str | None
    reason: str | None
    usage: JsonDict | None
    total_cost_usd: float | None


Change = ItemChanged | PermissionAsked | SessionSeen | TurnEnded


class TurnMapper:
    def __init__(self, thread_id: str, turn_id: str, clock: Any) -> None:
        self.thread_id = thread_id
        self.turn_id = turn_id
        self._clock = clock
        self._items: dict[str, TurnItem] = {}
        self._message_id = ""
        self._block_keys: dict[int, str] = {}  # stream index -> item key, current message
        self._assistant_blocks: dict[str, int] = {}  # message id -> blocks seen on assistant lines
        self.interrupt_requested = False
        self.last_error: str | None = None
        # The ``error`` of the CLI's synthetic failure line, if one came (auth, server...).
        self.synthetic_error: str | None = None
        # Messages steered into this turn whose own result is still to come: 2.1.197 runs a
        # steered message after the running turn's result, so the turn goes on until then.
        self.steers_pending = 0
        # Started by a user message (a wake's own result carries its origin).
        self.user_turn = True
        self._results = 0
        self._usage: JsonDict | None = None
        # A turn the provider started that was cancelled before it could run: its output
        # is read (to its result) but not recorded.
        self.discard = False
        # Subagent calls of this turn's agent -> the child thread each opened (subagents.py).
        self.children: dict[str, str] = {}

    # --- items ---------------------------------------------------------------------

    def _item(self, key: str, kind: ItemKind, **fields: Any) -> TurnItem:
        item_id = f"{self.turn_id}:{key}"
        current = self._items.get(item_id)
        if current is None:
            current = TurnItem(
                id=item_id,
                thread_id=self.thread_id,
                turn_id=self.turn_id,
                ordinal=0,  # assigned by the domain
                kind=kind,
                status="streaming",
                title=None,
                text=None,
                data=None,
                updated_at=self._clock(),
            )
        updated = attrs.evolve(current, updated_at=self._clock(), **fields)
        self._items[item_id] = updated
        return updated

    def _text_key(self, index: int) -> str:
        return f"{self._message_id}:{index}"

    # --- events ----------------------------------------------------------------------

    def feed(self, event: object) -> list[Change]:
        handler = getattr(self, f"_on_{type(event).__name__}", None)
        return handler(event) if handler is not None else []

    def _on_SystemInit(self, e: ce.SystemInit) -> list[Change]:
        return [SessionSeen(e.session_id, e.model)] if e.session_id else []

    def _on_MessageStarted(self, e: ce.MessageStarted) -> list[Change]:
        self._message_id = e.message_id
        self._block_keys = {}
        return []

    def _on_BlockStarted(self, e: ce.BlockStarted) -> list[Change]:
        # A tool call is recorded once its input is whole (its assistant line),
        # so no client ever sees a call with empty arguments.
        if e.kind == "tool_use" and e.tool_use_id:
            self._block_keys[e.index] = e.tool_use_id
        elif e.kind in ("text", "thinking"):
            self._block_keys[e.index] = self._text_key(e.index)
        return []

    def _stream_text(self, index: int, text: str, kind: ItemKind) -> list[Change]:
        key = self._block_keys.get(index) or self._text_key(index)
        self._block_keys[index] = key
        item_id = f"{self.turn_id}:{key}"
        current = self._items.get(item_id)
        if current is None:
            item = self._item(key, kind, status="streaming", text=text)
        else:  # the hot path (a delta of a streaming block): built directly, not evolved
            c = current
            item = TurnItem(c.id, c.thread_id, c.turn_id, c.ordinal, c.kind, "streaming", c.title, (c.text or "") + text, c.data, self._clock())
            self._items[item_id] = item
        return [ItemChanged(item, False)]

    def _on_TextDelta(self, e: ce.TextDelta) -> list[Change]:
        return self._stream_text(e.index, e.text, "assistant_message")

    def stream_delta(self, index: int, text: str, thinking: bool) -> TurnItem:
        """A `TextDelta` (or, ``thinking``, a `ThinkingDelta`) fed without building the event:
        the streaming item's new state (the same as `feed` gives)."""
        [change] = self._stream_text(index, text, "reasoning" if thinking else "assistant_message")
        assert isinstance(change, ItemChanged)
        return change.item

    def _on_ThinkingDelta(self, e: ce.ThinkingDelta) -> list[Change]:
        return self._stream_text(e.index, e.text, "reasoning")

    def _on_AssistantMessage(self, e: ce.AssistantMessage) -> list[Change]:
        changes: list[Change] = []
        if e.message_id and e.message_id != self._message_id and not self._block_keys:
            self._message_id = e.message_id
        for block in e.blocks:
            index = self._assistant_blocks.get(e.message_id, 0)
            self._assistant_blocks[e.message_id] = index + 1
            if isinstance(block, ce.TextBlock):
                key = f"{e.message_id}:{index}"
                changes.append(
                    ItemChanged(self._item(key, "assistant_message", status="completed", text=block.text), final=True)
                )
                if e.synthetic and e.error:  # the CLI's own words for a failure: shown, and an error
                    self.last_error, self.synthetic_error = block.text, e.error
                    error = self._item(f"{key}:error", "error", status="failed", text=block.text, data={"error": e.error})
                    changes.append(ItemChanged(error, final=True))
            elif isinstance(block, ce.ThinkingBlock):
                key = f"{e.message_id}:{index}"
                changes.append(
                    ItemChanged(
                        self._item(key, "reasoning", status="completed", text=block.text),
                        final=True,
                    )
                )
            elif isinstance(block, ce.ToolUseBlock):
                data = dict(
                    self._tool_data(block.tool_use_id),
                    tool_use_id=block.tool_use_id,
                    name=block.name,
                    input=block.input,
                )
                if block.tool_use_id in self.children:  # a subagent's call: it links to the child
                    data["child_thread_id"] = self.children[block.tool_use_id]
                item = self._item(
                    block.tool_use_id, "tool_call", status="running", title=block.name, data=data
                )
                changes.append(ItemChanged(item, final=True))
        return changes

    def _tool_data(self, tool_use_id: str) -> JsonDict:
        current = self._items.get(f"{self.turn_id}:{tool_use_id}")
        if current is not None and current.data is not None:
            return dict(current.data)
        return {
            "tool_use_id": tool_use_id,
            "name": None,
            "input": {},
            "result": None,
            "is_error": False,
        }

    def _on_UserMessage(self, e: ce.UserMessage) -> list[Change]:
        changes: list[Change] = []
        for result in e.tool_results:
            data = self._tool_data(result.tool_use_id)
            text = result.content_text
            data.update(
                result=text[:RESULT_PREVIEW],
                result_truncated=len(text) > RESULT_PREVIEW,
                is_error=result.is_error,
            )
            status: ItemStatus = "failed" if result.is_error else "completed"
            item = self._item(result.tool_use_id, "tool_call", status=status, data=data)
            changes.append(ItemChanged(item, final=True))
        return changes

    def _on_PermissionRequested(self, e: ce.PermissionRequested) -> list[Change]:
        data = {"tool_name": e.tool_name, "input": e.input, "tool_use_id": e.tool_use_id}
        item = self._item(
            f"request:{e.request_id}",
            "approval_request",
            status="pending",
            title=e.display_name or e.tool_name,
            text=e.description,
            data=dict(data, blocked_path=e.blocked_path),
        )
        return [PermissionAsked(e.request_id, item, data)]

    def _add_usage(self, e: ce.TurnResult) -> JsonDict:
        usage = attrs.asdict(e.usage)
        if self._usage is not None:
            usage = {key: self._usage.get(key, 0) + value for key, value in usage.items()}
        self._usage = usage
        return usage

    def _on_TurnResult(self, e: ce.TurnResult) -> list[Change]:
        self._results += 1
        usage = self._add_usage(e)
        if self.steers_pending and not self.interrupt_requested and e.terminal_reason != "aborted_streaming":
            self.steers_pending -= 1  # the steered message runs next, in this same turn
            return []
        if e.origin_kind == "task-notification" and self.user_turn and not self.interrupt_requested:
            # A wake the CLI ran before this turn's message (the message came as a task ended):
            # shown in this turn, which goes on until its own result.
            return []
        interrupted = e.terminal_reason == "aborted_streaming" or (
            self.interrupt_requested and e.subtype == "error_during_execution"
        )
        if interrupted and self.interrupt_requested:
            return [
                TurnEnded(
                    "interrupted", "interrupted by the user", "interrupt", usage, e.total_cost_usd
                )
            ]
        if interrupted:  # the CLI aborted the turn without being asked to
            error = f"the provider aborted the turn ({e.terminal_reason or e.subtype})"
            return [TurnEnded("interrupted", error, "provider_aborted", usage, e.total_cost_usd)]
        if e.is_error or e.subtype != "success":
            error = final_error_text(e) or self.last_error or e.subtype
            # A machine name, never empty and never "success" (an API error's subtype is).
            reason = failure_reason(e, self.synthetic_error)
            changes: list[Change] = []
            if self.last_error is None and error:  # no synthetic line said it: the result does
                key = f"result:{self._results}"
                changes.append(ItemChanged(self._item(key, "assistant_message", status="completed", text=error), final=True))
                data = {"subtype": e.subtype, "api_error_status": e.api_error_status, "errors": list(e.errors)}
                changes.append(ItemChanged(self._item(f"{key}:error", "error", status="failed", text=error, data=data), final=True))
            return [*changes, TurnEnded("failed", error, reason, usage, e.total_cost_usd)]
        return [TurnEnded("completed", None, None, usage, e.total_cost_usd)]

    def restore(self, items: tuple[TurnItem, ...]) -> None:
        """Start from items already committed for this turn (a replay that lost the turn's
        start), so later updates extend them instead of starting over."""
        for item in items:
            self._items.setdefault(item.id, item)

    def open_items(self) -> list[TurnItem]:
        """Items still streaming or running: closed by the driver when the turn ends abruptly."""
        return [i for i in self._items.values() if i.status in ("streaming", "running", "pending")]
