"""Codex events → domain changes, for one turn. Pure.

Theory of operation: the session driver feeds every parsed event of its
thread's current turn to `TurnMapper.feed`, which returns what changed in
domain terms: item upserts (`ItemChanged`, marked ``final`` when the item will
not stream further), approval prompts (`PermissionAsked`) and the turn's end
(`TurnEnded`, exactly one per turn: the driver ends the turn once).

Mapping (PROTOCOLS.md §2.4, §2.5):

* ``agentMessage`` → ``assistant_message``; ``reasoning`` and ``plan`` →
  ``reasoning``; ``commandExecution`` → ``command``; ``fileChange`` →
  ``file_change``; MCP, dynamic and other tool calls → ``tool_call``; an item
  type this build does not know → ``tool_call`` titled with its type. The
  ``userMessage`` echo is skipped (the domain records the prompt itself).
* Deltas stream the item's text (or a command's output); ``item/completed`` is
  authoritative and final.
* ``error`` with ``willRetry`` is one ``error`` item per turn, streaming the
  latest message while Codex retries and completed once the turn moves on;
  without ``willRetry`` it is a failed ``error`` item, and its text is the
  turn's error unless ``turn/completed`` gives one.
* Every item's ``data`` keeps the Codex item's fields t3d does not map under
  ``codex``, so nothing a newer Codex sends is lost; an unknown item type
  keeps its whole object there.
* Usage is per turn: the growth of Codex's thread total over the turn (a
  report with no total before it, the first of a process, or a smaller one
  counts its ``last``). Codex reports no cost.

Item ids are ``<turn_id>:<codex item id>`` (unique across threads); prompts
are ``<turn_id>:request:<codex request id>``. Command output and file diffs
are kept to `OUTPUT_LIMIT` characters (``output_truncated`` says so); the
full text stays in Codex's rollout.
"""

from __future__ import annotations

from typing import Any

import attrs

from t3d.domain.model import ItemKind, ItemStatus, JsonDict, TurnItem
from t3d.providers.codex import events as ce
from t3d.providers.codex.protocol import turn_error_text

OUTPUT_LIMIT = 1024 * 1024

# Fields of each item type that the turn item shows elsewhere (text, output, …);
# the others go to data["codex"].
_SHOWN: dict[str, frozenset[str]] = {
    "agentMessage": frozenset({"type", "id", "text"}),
    "reasoning": frozenset({"type", "id", "summary", "content"}),
    "plan": frozenset({"type", "id", "text"}),
    "commandExecution": frozenset(
        {"type", "id", "command", "cwd", "status", "exitCode", "aggregatedOutput", "durationMs"}
    ),
    "fileChange": frozenset({"type", "id", "status", "changes"}),
}
_TOOL_SHOWN = frozenset(
    {"type", "id", "status", "arguments", "result", "error", "contentItems", "output"}
)

_STATUSES: dict[str, ItemStatus] = {
    "inProgress": "running",
    "completed": "completed",
    "failed": "failed",
    "declined": "failed",
}


@attrs.frozen
class ItemChanged:
    item: TurnItem
    final: bool


@attrs.frozen
class PermissionAsked:
    """Codex asks for an approval: ``request`` is what answering it needs."""

    request_id: str
    item: TurnItem
    data: JsonDict
    request: ce.ApprovalRequested


@attrs.frozen
class TurnEnded:
    status: str
    error: str | None
    reason: str | None
    usage: JsonDict | None


Change = ItemChanged | PermissionAsked | TurnEnded


def _capped(text: str) -> tuple[str, bool]:
    return (text[:OUTPUT_LIMIT], True) if len(text) > OUTPUT_LIMIT else (text, False)


def _extra(raw: JsonObject, shown: frozenset[str]) -> JsonDict:
    return {key: value for key, value in raw.items() if key not in shown}


JsonObject = ce.JsonObject


class TurnMapper:
    def __init__(
        self,
        thread_id: str,
        turn_id: str,
        clock: Any,
        usage_total: ce.Usage | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.turn_id = turn_id
        self._clock = clock
        self._items: dict[str, TurnItem] = {}
        # Reasoning parts per item (summary and content streams), to join deltas in place.
        self._parts: dict[str, dict[tuple[str, int], str]] = {}
        # Codex's cumulative usage so far (None: the first report counts `last`).
        self.usage_total = usage_total
        self._turn_usage: ce.Usage | None = None
        self.codex_turn_id: str | None = None
        self.interrupt_requested = False
        # Set when the daemon stops the turn itself (retries without end, a dropped line):
        # the turn ends failed with this error whatever Codex reports.
        self.fail_with: tuple[str, str] | None = None
        self.last_error: str | None = None
        # Codex threads of the agents this turn's agent spawned -> their child threads
        # (collab.py): its collab calls naming them link to the children.
        self.agents: dict[str, str] = {}
        self._retry_key: str | None = None
        self.retrying = False

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

    def _current(self, key: str) -> TurnItem | None:
        return self._items.get(f"{self.turn_id}:{key}")

    # --- events ----------------------------------------------------------------------

    def feed(self, event: object) -> list[Change]:
        handler = getattr(self, f"_on_{type(event).__name__}", None)
        if handler is None:
            return []
        changes: list[Change] = handler(event)
        if self.retrying and not isinstance(event, ce.ErrorNotice) and changes:
            changes = self._retries_over() + changes
        return changes

    def _on_ItemStarted(self, e: ce.ItemStarted) -> list[Change]:
        return self._on_item(e.item, final=False)

    def _on_ItemCompleted(self, e: ce.ItemCompleted) -> list[Change]:
        return self._on_item(e.item, final=True)

    def _on_item(self, item: ce.CodexItem, *, final: bool) -> list[Change]:
        if isinstance(item, ce.UserMessageItem) or not item.id:
            return []
        if isinstance(item, ce.AgentMessageItem):
            if not final and not item.text:
                return []  # recorded from its first delta: no empty item for clients
            return [self._text_item(item.id, "assistant_message", item.text, final, item.raw, None)]
        if isinstance(item, ce.ReasoningItem):
            text = "\n\n".join(item.summary or item.content)
            if not final and not text:
                return []
            return [self._text_item(item.id, "reasoning", text, final, item.raw, None)]
        if isinstance(item, ce.PlanItem):
            if not final and not item.text:
                return []
            return [self._text_item(item.id, "reasoning", item.text, final, item.raw, "Plan")]
        if isinstance(item, ce.CommandItem):
            return [self._command(item, final)]
        if isinstance(item, ce.FileChangeItem):
            return [self._file_change(item, final)]
        if isinstance(item, ce.ToolCallItem):
            return [self._tool_call(item, final)]
        return [self._other(item, final)]

    def _text_item(
        self, key: str, kind: ItemKind, text: str, final: bool, raw: JsonObject, title: str | None
    ) -> ItemChanged:
        if not final:  # the started state may hold text already; deltas add to it
            current = self._current(key)
            text = current.text if current is not None and current.text else text
        status: ItemStatus = "completed" if final else "streaming"
        data = _extra(raw, _SHOWN[str(raw.get("type"))]) or None
        item = self._item(
            key, kind, status=status, text=text, title=title, data={"codex": data} if data else None
        )
        return ItemChanged(item, final=final)

    def _command(self, c: ce.CommandItem, final: bool) -> ItemChanged:
        current = self._current(c.id)
        streamed = (current.data or {}).get("output") if current is not None else None
        output, truncated = _capped(c.output if c.output is not None else (streamed or ""))
        status = _STATUSES.get(c.status, "completed" if final else "running")
        if status == "completed" and c.exit_code not in (None, 0):
            status = "failed"
        data = {
            "command": c.command,
            "cwd": c.cwd,
            "status": c.status,
            "exit_code": c.exit_code,
            "output": output,
            "output_truncated": truncated,
            "duration_ms": c.duration_ms,
            "codex": _extra(c.raw, _SHOWN["commandExecution"]),
        }
        item = self._item(c.id, "command", status=status, title=c.command, data=data)
        return ItemChanged(item, final=final)

    def _file_change(self, f: ce.FileChangeItem, final: bool) -> ItemChanged:
        changes = []
        for change in f.changes:
            diff, truncated = _capped(change.diff)
            changes.append(
                {
                    "path": change.path,
                    "kind": change.kind,
                    "move_path": change.move_path,
                    "diff": diff,
                    "diff_truncated": truncated,
                }
            )
        paths = ", ".join(change.path for change in f.changes)
        status = _STATUSES.get(f.status, "completed" if final else "running")
        data = {
            "status": f.status,
            "changes": changes,
            "codex": _extra(f.raw, _SHOWN["fileChange"]),
        }
        title = f"Edit {paths}" if paths else "Edit"
        item = self._item(f.id, "file_change", status=status, title=title, data=data)
        return ItemChanged(item, final=final)

    def _tool_call(self, t: ce.ToolCallItem, final: bool) -> ItemChanged:
        failed = t.status == "failed" or t.error is not None
        status: ItemStatus = ("failed" if failed else "completed") if final else "running"
        data = {
            "tool_use_id": t.id,
            "name": t.name,
            "input": t.input,
            "result": t.result,
            "is_error": failed,
            "error": t.error,
            "codex": _extra(t.raw, _TOOL_SHOWN),
        }
        if t.type == "collabAgentToolCall":
            self._link_agents(t.raw, data)
        item = self._item(t.id, "tool_call", status=status, title=t.name, data=data)
        return ItemChanged(item, final=final)

    def _link_agents(self, raw: JsonObject, data: JsonDict) -> None:
        """A collab call naming agents of this turn links to their child threads
        (``child_thread_id``, the first; ``child_thread_ids``, all) and shows the first
        one's status as Codex last reported it (``child_status``)."""
        receivers = [r for r in raw.get("receiverThreadIds") or () if isinstance(r, str) and r in self.agents]
        if not receivers:
            return
        data["child_thread_id"] = self.agents[receivers[0]]
        if len(receivers) > 1:
            data["child_thread_ids"] = [self.agents[r] for r in receivers]
        states = raw.get("agentsStates")
        state = states.get(receivers[0]) if isinstance(states, dict) else None
        if isinstance(state, dict) and isinstance(state.get("status"), str):
            data["child_status"] = state["status"]

    def _other(self, o: ce.OtherItem, final: bool) -> ItemChanged:
        """An item type this build does not know: shown by its type, kept whole in data."""
        title = o.type or "item"
        data = {
            "tool_use_id": o.id,
            "name": title,
            "input": {},
            "result": None,
            "is_error": False,
            "codex": o.raw,
        }
        agent = o.raw.get("agentThreadId") if o.type == "subAgentActivity" else None
        if isinstance(agent, str) and agent in self.agents:  # what a spawned agent did: its child
            data["child_thread_id"] = self.agents[agent]
        status: ItemStatus = "completed" if final else "running"
        item = self._item(o.id, "tool_call", status=status, title=title, data=data)
        return ItemChanged(item, final=final)

    def _on_TextDelta(self, e: ce.TextDelta) -> list[Change]:
        if not e.item_id or not e.delta:
            return []
        if e.stream == "agentMessage":
            return [self._append(e.item_id, "assistant_message", e.delta)]
        if e.stream in ("reasoningSummary", "reasoningText"):
            parts = self._parts.setdefault(e.item_id, {})
            key = (e.stream, e.index)
            parts[key] = parts.get(key, "") + e.delta
            stream = (
                "reasoningSummary"
                if any(k[0] == "reasoningSummary" for k in parts)
                else "reasoningText"
            )
            text = "\n\n".join(v for (s, _), v in sorted(parts.items()) if s == stream)
            item = self._item(e.item_id, "reasoning", status="streaming", text=text)
            return [ItemChanged(item, final=False)]
        if e.stream == "plan":
            return [self._append(e.item_id, "reasoning", e.delta, title="Plan")]
        if e.stream == "commandOutput":
            current = self._current(e.item_id)
            if current is None or current.kind != "command":
                return []  # output of a command whose start was not seen: its end carries it
            data = dict(current.data or {})
            so_far = data.get("output") or ""
            if len(so_far) >= OUTPUT_LIMIT:  # full: only say so, once
                if data.get("output_truncated"):
                    return []
                data["output_truncated"] = True
                return [ItemChanged(self._item(e.item_id, "command", data=data), final=False)]
            data["output"], truncated = _capped(so_far + e.delta)
            data["output_truncated"] = truncated
            return [ItemChanged(self._item(e.item_id, "command", data=data), final=False)]
        return []  # fileChange output (deprecated, no longer emitted): the item carries the diff

    def _append(
        self, key: str, kind: ItemKind, delta: str, title: str | None = None
    ) -> ItemChanged:
        current = self._current(key)
        so_far = current.text if current is not None and current.text else ""
        fields: dict[str, Any] = {"status": "streaming", "text": so_far + delta}
        if title is not None:
            fields["title"] = title
        return ItemChanged(self._item(key, kind, **fields), final=False)

    # --- errors, approvals, usage, the end -----------------------------------------------

    def _on_ErrorNotice(self, e: ce.ErrorNotice) -> list[Change]:
        text = turn_error_text(e.message, e.details)
        data = {
            "message": e.message,
            "details": e.details,
            "codex_error": e.info,
            "will_retry": e.will_retry,
        }
        if e.will_retry:
            key = self._retry_key or f"retry:{len(self._items)}"
            self._retry_key = key
            current = self._current(key)
            attempts = (current.data or {}).get("attempts", 0) + 1 if current is not None else 1
            item = self._item(
                key, "error", status="streaming", title="Codex is retrying", text=text,
                data=dict(data, attempts=attempts),
            )  # fmt: skip
            self.retrying = True
            return [ItemChanged(item, final=False)]
        self.last_error = text
        key = f"error:{len(self._items)}"
        item = self._item(key, "error", status="failed", title="Codex error", text=text, data=data)
        return [ItemChanged(item, final=True)]

    def _retries_over(self, status: ItemStatus = "completed") -> list[Change]:
        """The retries are over: Codex got past them (``completed``), or the turn ended with
        them (``failed`` unless it completed). The next retries get a new item."""
        self.retrying = False
        key, self._retry_key = self._retry_key, None
        current = None if key is None else self._current(key)
        if key is None or current is None:
            return []
        return [ItemChanged(self._item(key, "error", status=status), final=True)]

    @property
    def retry_text(self) -> str | None:
        """The latest message of the retries in progress, if any."""
        current = None if self._retry_key is None else self._current(self._retry_key)
        return None if current is None else current.text

    def notice(self, key: str, text: str) -> TurnItem:
        """A failed ``error`` item for something the session itself ran into."""
        return self._item(f"notice:{key}", "error", status="failed", title="t3d", text=text)

    def _on_ApprovalRequested(self, e: ce.ApprovalRequested) -> list[Change]:
        tool_input: JsonDict
        if e.kind == "command":
            tool_name, tool_input = "command", {"command": e.command or ""}
            if e.cwd:
                tool_input["cwd"] = e.cwd
        elif e.kind == "file_change":
            target = self._current(e.item_id)
            paths = (
                [c["path"] for c in ((target.data or {}).get("changes") or [])] if target else []
            )
            changes = e.params.get("fileChanges")
            if not paths and isinstance(changes, dict):
                paths = [str(path) for path in changes]
            tool_name, tool_input = "file change", {"path": ", ".join(paths)} if paths else {}
            if isinstance(e.params.get("grantRoot"), str):
                tool_input["grant_root"] = e.params["grantRoot"]
        else:
            tool_name, tool_input = "permissions", {"permissions": e.params.get("permissions")}
        data: JsonDict = {
            "tool_name": tool_name,
            "input": tool_input,
            "tool_use_id": e.item_id or None,
            "method": e.method,
            "available_decisions": list(e.available) if e.available is not None else None,
        }
        item = self._item(
            f"request:{e.id}",
            "approval_request",
            status="pending",
            title=tool_name,
            text=e.reason,
            data=data,
        )
        return [PermissionAsked(str(e.id), item, data, e)]

    def _on_TokenUsageUpdated(self, e: ce.TokenUsageUpdated) -> list[Change]:
        # Each report adds the growth of the thread's total; a report with no total
        # before it (a new process) or a smaller one (the counter restarted) adds `last`.
        before = self.usage_total
        grown = before is not None and e.total.total_tokens >= before.total_tokens
        added = (
            [
                now - then
                for now, then in zip(attrs.astuple(e.total), attrs.astuple(before), strict=True)
            ]
            if grown and before is not None
            else list(attrs.astuple(e.last))
        )
        so_far = (
            attrs.astuple(self._turn_usage) if self._turn_usage is not None else (0,) * len(added)
        )
        self._turn_usage = ce.Usage(*(a + b for a, b in zip(so_far, added, strict=True)))
        self.usage_total = e.total
        return []

    def usage(self) -> JsonDict | None:
        """This turn's token counts, or None when Codex reported none."""
        return None if self._turn_usage is None else attrs.asdict(self._turn_usage)

    def _on_TurnCompleted(self, e: ce.TurnCompleted) -> list[Change]:
        ended = self.ended(e)
        if not self.retrying:
            return [ended]
        return [*self._retries_over("completed" if ended.status == "completed" else "failed"), ended]

    def ended(self, e: ce.TurnCompleted) -> TurnEnded:
        """How the turn ends, given Codex's ``turn/completed``."""
        usage = self.usage()
        if self.fail_with is not None:
            return TurnEnded("failed", self.fail_with[0], self.fail_with[1], usage)
        if e.status == "completed":
            return TurnEnded("completed", None, None, usage)
        if e.status == "interrupted":
            if self.interrupt_requested:
                return TurnEnded("interrupted", "interrupted by the user", "interrupt", usage)
            return TurnEnded(
                "interrupted",
                "Codex stopped the turn without being asked to",
                "provider_aborted",
                usage,
            )
        text = turn_error_text(e.error, e.details) if e.error else self.last_error
        return TurnEnded(
            "failed",
            text or f"Codex ended the turn {e.status or 'without a status'}",
            e.info or "turn_failed",
            usage,
        )

    def restore(self, items: tuple[TurnItem, ...]) -> None:
        """Start from items already committed for this turn (a replay after a daemon restart
        that lost the turn's start), so later updates extend them instead of starting over."""
        for item in items:
            self._items.setdefault(item.id, item)

    def open_items(self) -> list[TurnItem]:
        """Items still streaming, running or pending: closed by the driver when the turn ends."""
        return [i for i in self._items.values() if i.status in ("streaming", "running", "pending")]
