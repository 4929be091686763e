"""Foreground subagents of one Claude turn, as child threads. Pure.

Theory of operation: an ``Agent`` (or ``Task``) tool call without ``run_in_background``
starts a subagent that works while the calling turn waits for the call's result. The CLI
streams the subagent's lines on the same stdout, each marked with ``parent_tool_use_id``
(the call that started it). `Subagents` keeps, for the running turn:

* each open subagent (`Child`): its thread and turn (ids derived from the parent turn and
  the tool call, so a replay of the same output names the same child), and a `TurnMapper`
  of its own, which maps its lines onto items of its turn like any turn's;
* the tool calls its lines made, and its task id (``task_started``), so a permission
  prompt the subagent raises (``can_use_tool`` with ``agent_id`` and ``tool_use_id``) is
  shown in the child's turn.

A subagent's own ``Agent`` call nests: its child's parent is the subagent. 2.1.197 does not
stream an inner subagent's lines (only its ``task_*`` lines), so an inner child shows its
prompt and its result. The child ends when the tool call's result comes (``failed`` if the
result is an error); children still open when the turn ends end with it (the domain closes
them, `decide`).

Bounded: `MAX_CHILDREN` subagents per turn; beyond it a subagent is not opened and its lines
are dropped (the session logs it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import attrs

from t3d.domain import commands as c
from t3d.domain.model import MAX_SUBAGENT_DEPTH
from t3d.providers.claude import events as ce
from t3d.providers.claude.adapter import TurnMapper

SUBAGENT_TOOLS = frozenset({"Agent", "Task"})
MAX_CHILDREN = 64
PROMPT_CHARS = 64 * 1024
ERROR_CHARS = 2000
# Tool calls a child remembers for its prompts (the oldest forgotten first).
MAX_CHILD_TOOLS = 256


@attrs.define
class Child:
    tool_use_id: str  # the Agent call that started it
    thread_id: str
    turn_id: str
    mapper: TurnMapper
    parent: TurnMapper  # whose call started it: the turn's own mapper, or another child's
    depth: int  # 1: the turn's own subagent


def child_ids(parent_turn_id: str, tool_use_id: str) -> tuple[str, str]:
    """The child's thread and turn ids: the same for the same parent turn and tool call."""
    digest = hashlib.sha256(f"{parent_turn_id}\0{tool_use_id}".encode()).hexdigest()[:24]
    return f"sub-{digest}", f"sub-{digest}:1"


def is_subagent_call(block: ce.ToolUseBlock) -> bool:
    """A tool call that starts a foreground subagent (a background one is a task)."""
    return block.name in SUBAGENT_TOOLS and block.input.get("run_in_background") is not True


class Subagents:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._open: dict[str, Child] = {}  # Agent tool_use_id -> open child
        self._agents: dict[str, str] = {}  # the CLI's task id (a prompt's agent_id) -> tool_use_id
        self._tools: dict[str, str] = {}  # a child's own tool call -> its Agent tool_use_id
        self.opened = 0  # children opened in this turn (bounded by MAX_CHILDREN)

    def reset(self) -> None:
        """The turn ended: its children are over (closed with it)."""
        self._open.clear()
        self._agents.clear()
        self._tools.clear()
        self.opened = 0

    def start(self, mapper: TurnMapper, block: ce.ToolUseBlock) -> tuple[c.OpenSubagent | None, str | None]:
        """``mapper``'s agent called ``block`` (a subagent call): the command that opens its
        child, or None and why not (bounds)."""
        if block.tool_use_id in self._open:
            return None, None  # seen already (its assistant line came twice)
        depth = 1 + next((ch.depth for ch in self._open.values() if ch.mapper is mapper), 0)
        if depth > MAX_SUBAGENT_DEPTH:
            return None, f"subagent call {block.tool_use_id} nests deeper than {MAX_SUBAGENT_DEPTH}; its lines are dropped"
        if self.opened >= MAX_CHILDREN:
            return None, f"turn {mapper.turn_id} started more than {MAX_CHILDREN} subagents; call {block.tool_use_id}'s lines are dropped"
        thread_id, turn_id = child_ids(mapper.turn_id, block.tool_use_id)
        child = Child(block.tool_use_id, thread_id, turn_id, TurnMapper(thread_id, turn_id, self._clock), mapper, depth)
        self._open[block.tool_use_id] = child
        self.opened += 1
        mapper.children[block.tool_use_id] = thread_id
        prompt = _text(block.input.get("prompt"))[:PROMPT_CHARS]
        command = c.OpenSubagent(
            parent_turn_id=mapper.turn_id,
            tool_use_id=block.tool_use_id,
            thread_id=thread_id,
            turn_id=turn_id,
            subagent_type=_text(block.input.get("subagent_type")),
            description=_text(block.input.get("description")),
            prompt=prompt,
        )
        return command, None

    def refused(self, tool_use_id: str) -> None:
        """The domain did not open the child: its lines are dropped like unknown ones."""
        child = self._open.pop(tool_use_id, None)
        if child is not None:
            child.parent.children.pop(tool_use_id, None)

    def see_task(self, event: ce.TaskStarted) -> None:
        if event.tool_use_id and event.tool_use_id in self._open:
            self._agents[event.task_id] = event.tool_use_id

    def see_tools(self, child: Child, event: ce.AssistantMessage) -> None:
        for block in event.blocks:
            if isinstance(block, ce.ToolUseBlock):
                self._tools[block.tool_use_id] = child.tool_use_id
                while len(self._tools) > MAX_CHILD_TOOLS * MAX_CHILDREN:
                    self._tools.pop(next(iter(self._tools)))

    def child(self, parent_tool_use_id: str) -> Child | None:
        """The open child whose lines name ``parent_tool_use_id``."""
        return self._open.get(parent_tool_use_id)

    def asking(self, event: ce.PermissionRequested) -> Child | None:
        """The open child a permission prompt comes from (by its tool call, else its agent id)."""
        tool = self._tools.get(event.tool_use_id or "")
        if tool is None and event.agent_id:
            tool = self._agents.get(event.agent_id)
        return self._open.get(tool) if tool is not None else None

    def finish(self, mapper: TurnMapper, result: ce.ToolResult) -> tuple[Child, c.FinishTurn] | None:
        """A tool result in ``mapper``'s turn: if it is a child's Agent call, the child ends."""
        child = self._open.get(result.tool_use_id)
        if child is None or child.parent is not mapper:
            return None
        del self._open[result.tool_use_id]
        error = (result.content_text[:ERROR_CHARS] or "the subagent failed") if result.is_error else None
        status = "failed" if result.is_error else "completed"
        return child, c.FinishTurn(child.turn_id, status, error, "subagent_failed" if result.is_error else None)

    def open_children(self) -> list[Child]:
        """The children still open, the deepest first."""
        return sorted(self._open.values(), key=lambda ch: -ch.depth)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
