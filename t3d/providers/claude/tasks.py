"""Background tasks of one Claude session: the CLI's ``task_*`` lines as items. Pure.

Theory of operation: a task (a background Bash command, a background subagent, a
monitor) is started by a tool call of some turn and may run long after that turn's
``result``; when it ends the CLI says so (``task_updated``, ``task_notification``) and may
wake the agent, which then writes a turn of its own. `TaskTracker` keeps, for the session:

* the tool calls seen (which turn each belongs to, following a subagent's calls to the
  turn of the subagent's own call), so a task lands in the turn that started it;
* each task as a ``background_task`` item in that turn, kept up to date from its lines
  (status ``running``, then ``completed``, ``failed`` or ``stopped``; its progress, its
  summary, its output);
* the notifications that arrived while no turn was open: why the agent woke up next.

Rules:
- A foreground subagent (an ``Agent`` call without ``run_in_background``) is not a task
  item (its lines are ignored): it is a child thread (subagents.py). A subagent's own
  ``Agent`` call comes after its task's ``task_started`` (2.1.197 writes a subagent's
  assistant line once its tools ran): while a subagent runs (`defer_agents`), an agent task
  of a call not seen yet waits for the call, which says whether it is in the background.
- A task line naming a task never started here (lost across a restart, or a CLI bug) still
  becomes an item, in the turn of its tool call if that is known, else the current or last
  turn, with a note saying so; with no turn at all it is only reported.
- A turn's end forgets the tool calls no later line can need (`forget_settled_calls`):
  all but those run in the background, those that started a task, and the calls made
  inside a kept one (a background subagent's). Before, every call stayed until
  `MAX_TOOLS` newer ones pushed it out: at 1.5 calls a turn, 250 sessions held 256,000
  of them after a day.
- Bounded: `MAX_TASKS` tasks and `MAX_TOOLS` tool calls (the oldest forgotten first),
  `OUTPUT_CHARS` of output per task, `MAX_WAKE_TASKS` notifications per wake.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from t3d.domain.model import ItemStatus, JsonDict, TurnItem
from t3d.providers.claude import events as ce

MAX_TASKS = 256
MAX_TOOLS = 1024
MAX_WAKE_TASKS = 10
OUTPUT_CHARS = 16 * 1024
TITLE_CHARS = 200

# The CLI's task states (task_updated's patch, task_notification) as item statuses.
STATUS_OF: dict[str, ItemStatus] = {
    "pending": "running",
    "running": "running",
    "completed": "completed",
    "failed": "failed",
    "error": "failed",
    "killed": "stopped",
    "stopped": "stopped",
    "cancelled": "stopped",
}

TaskEvent = ce.TaskStarted | ce.TaskProgress | ce.TaskUpdated | ce.TaskNotification
TASK_EVENTS = (ce.TaskStarted, ce.TaskProgress, ce.TaskUpdated, ce.TaskNotification)


@attrs.frozen
class ToolCall:
    turn_id: str  # the turn whose work it is (a subagent's calls: its parent call's turn)
    name: str
    background: bool  # started with run_in_background
    parent_tool_use_id: str | None


@attrs.frozen
class TaskChange:
    """What one task line changed: the items to record, and a warning to log (bad input)."""

    items: tuple[TurnItem, ...] = ()
    warning: str | None = None


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT_CHARS else "…" + text[-OUTPUT_CHARS:]


class TaskTracker:
    def __init__(self, thread_id: str, clock: Callable[[], float]) -> None:
        self.thread_id = thread_id
        self._clock = clock
        self._tools: OrderedDict[str, ToolCall] = OrderedDict()
        self._tasks: OrderedDict[str, TurnItem] = OrderedDict()  # task id -> its item
        self._by_tool: dict[str, str] = {}  # tool_use_id -> task id
        self._wake: list[JsonDict] = []
        self.last_turn_id: str | None = None  # the last turn the session knew
        # Foreground subagents' task ids (their lines are not tasks), the newest MAX_TASKS.
        self._foreground: OrderedDict[str, None] = OrderedDict()
        # Agent tasks whose call is not seen yet: tool_use_id -> (task_started, its turn).
        self._deferred: OrderedDict[str, tuple[ce.TaskStarted, str | None]] = OrderedDict()
        self.defer_agents = False  # set by the session while a subagent runs

    # --- tool calls -------------------------------------------------------------------

    def see_tool(self, turn_id: str, block: ce.ToolUseBlock, parent_tool_use_id: str | None) -> TaskChange | None:
        """Remember the call; a task that waited for it (`defer_agents`) starts now, if it runs
        in the background (the change to record)."""
        parent = self._tools.get(parent_tool_use_id) if parent_tool_use_id else None
        owner = parent.turn_id if parent is not None else turn_id
        background = block.input.get("run_in_background") is True
        self._tools[block.tool_use_id] = ToolCall(owner, block.name, background, parent_tool_use_id)
        self._tools.move_to_end(block.tool_use_id)
        while len(self._tools) > MAX_TOOLS:
            self._tools.popitem(last=False)
        waiting = self._deferred.pop(block.tool_use_id, None)
        if waiting is None:
            return None
        started, turn = waiting
        if not background:
            self._mark_foreground(started.task_id)
            return None
        return self._started(started, turn)

    def forget_settled_calls(self) -> None:
        """The session's turn ended: keep only the tool calls a later line may still name
        (a task's start or notification, a background subagent's own calls)."""
        kept: OrderedDict[str, ToolCall] = OrderedDict()
        for tool_use_id, call in self._tools.items():  # a parent before the calls made in it
            if call.background or tool_use_id in self._by_tool or (call.parent_tool_use_id in kept):
                kept[tool_use_id] = call
        self._tools = kept

    def _mark_foreground(self, task_id: str) -> None:
        self._foreground[task_id] = None
        while len(self._foreground) > MAX_TASKS:
            self._foreground.popitem(last=False)

    def _waiting(self, task_id: str) -> bool:
        return task_id in self._foreground or any(s.task_id == task_id for s, _ in self._deferred.values())

    def tool(self, tool_use_id: str | None) -> ToolCall | None:
        return self._tools.get(tool_use_id) if tool_use_id else None

    def is_background_agent(self, tool_use_id: str | None) -> bool:
        """The tool call started a subagent that runs in the background."""
        task_id = self._by_tool.get(tool_use_id or "")
        item = self._tasks.get(task_id) if task_id else None
        return item is not None and (item.data or {}).get("task_type") == "local_agent"

    # --- task lines -------------------------------------------------------------------

    def feed(self, event: TaskEvent, current_turn: str | None) -> TaskChange:
        if current_turn is not None:
            self.last_turn_id = current_turn
        if isinstance(event, ce.TaskStarted):
            return self._started(event, current_turn)
        if self._waiting(event.task_id):
            return TaskChange()  # a foreground subagent's (or one whose call is still to come)
        item = self._tasks.get(event.task_id)
        warning = None
        if item is None:
            tool_use_id = event.tool_use_id if not isinstance(event, ce.TaskUpdated) else None
            item = self._new_item(event.task_id, tool_use_id, current_turn, {"task_type": None, "description": ""})
            if item is None:
                return TaskChange(warning=f"a {_line_name(event)} line names task {event.task_id!r}, which was never started and belongs to no turn; ignored")
            note = "t3d saw no task_started line for this task (its start was lost, or the CLI never sent one)"
            item = attrs.evolve(item, data={**(item.data or {}), "note": note})
            warning = f"a {_line_name(event)} line names task {event.task_id!r}, which was never started; recorded it in turn {item.turn_id}"
        data = dict(item.data or {})
        status: ItemStatus = item.status
        text = item.text
        if isinstance(event, ce.TaskProgress):
            data.update(progress=event.description, last_tool_name=event.last_tool_name, usage=event.usage or data.get("usage"))
        elif isinstance(event, ce.TaskUpdated):
            if event.status is not None:
                data["status"] = event.status
                status = STATUS_OF.get(event.status, status)
        else:
            data.update(status=event.status, summary=event.summary, output_file=event.output_file)
            if event.usage:
                data["usage"] = event.usage
            status = STATUS_OF.get(event.status, "completed" if status == "running" else status)
            text = event.summary or text
            if current_turn is None:
                self._note_wake(item, event)
        return TaskChange((self._put(attrs.evolve(item, status=status, text=text, data=data)),), warning)

    def _started(self, event: ce.TaskStarted, current_turn: str | None) -> TaskChange:
        call = self.tool(event.tool_use_id)
        if event.task_type == "local_agent" and call is not None and not call.background:
            self._mark_foreground(event.task_id)
            return TaskChange()  # a foreground subagent: a child thread, its tool call links to it
        if event.task_type == "local_agent" and call is None and self.defer_agents and event.tool_use_id:
            self._deferred[event.tool_use_id] = (event, current_turn)
            while len(self._deferred) > MAX_TASKS:
                self._deferred.popitem(last=False)
            return TaskChange()
        fields = {
            "task_type": event.task_type,
            "description": event.description,
            "subagent_type": event.subagent_type,
            "prompt": event.prompt,
        }
        item = self._new_item(event.task_id, event.tool_use_id, current_turn, fields)
        if item is None:
            return TaskChange(warning=f"task {event.task_id!r} started with no turn to record it in; ignored")
        return TaskChange((self._put(item),))

    def _new_item(self, task_id: str, tool_use_id: str | None, current_turn: str | None, fields: JsonDict) -> TurnItem | None:
        call = self.tool(tool_use_id)
        turn_id = call.turn_id if call is not None else (current_turn or self.last_turn_id)
        if turn_id is None:
            return None
        data: JsonDict = {
            "task_id": task_id,
            "tool_use_id": tool_use_id,
            "tool_name": call.name if call is not None else None,
            "status": "running",
            "summary": None,
            "output": None,
            "output_file": None,
            **fields,
        }
        title = str(fields.get("description") or f"Background task {task_id}")[:TITLE_CHARS]
        return TurnItem(
            id=f"{turn_id}:task:{task_id}",
            thread_id=self.thread_id,
            turn_id=turn_id,
            ordinal=0,
            kind="background_task",
            status="running",
            title=title,
            text=None,
            data=data,
            updated_at=self._clock(),
        )

    def _put(self, item: TurnItem) -> TurnItem:
        item = attrs.evolve(item, updated_at=self._clock())
        task_id = str((item.data or {}).get("task_id"))
        self._tasks[task_id] = item
        self._tasks.move_to_end(task_id)
        tool_use_id = (item.data or {}).get("tool_use_id")
        if isinstance(tool_use_id, str):
            self._by_tool[tool_use_id] = task_id
        while len(self._tasks) > MAX_TASKS:
            oldest = next((k for k, v in self._tasks.items() if v.status != "running"), None)
            gone = self._tasks.pop(oldest) if oldest is not None else self._tasks.popitem(last=False)[1]
            self._by_tool.pop(str((gone.data or {}).get("tool_use_id")), None)
        return item

    # --- output ----------------------------------------------------------------------

    def agent_text(self, tool_use_id: str, text: str) -> TurnItem | None:
        """A background subagent wrote ``text``: its task's output so far."""
        task_id = self._by_tool.get(tool_use_id)
        item = self._tasks.get(task_id) if task_id else None
        if item is None or not text:
            return None
        data = dict(item.data or {})
        data["output"] = _tail(f"{data.get('output') or ''}{chr(10) if data.get('output') else ''}{text}")
        # A stopped agent that writes again was resumed (SendMessage): it runs again.
        if item.status != "running":
            data["status"] = "running"
        return self._put(attrs.evolve(item, status="running", data=data))

    def output(self, task_id: str, text: str) -> TurnItem | None:
        """A finished task's output (read from its output file)."""
        item = self._tasks.get(task_id)
        if item is None:
            return None
        return self._put(attrs.evolve(item, data={**(item.data or {}), "output": _tail(text)}))

    # --- wakes and endings -------------------------------------------------------------

    def _note_wake(self, item: TurnItem, event: ce.TaskNotification) -> None:
        call = self.tool(event.tool_use_id)
        if call is not None and call.parent_tool_use_id is not None:
            return  # a subagent's own task: its notification goes to that subagent
        if len(self._wake) < MAX_WAKE_TASKS:
            self._wake.append(
                {
                    "task_id": event.task_id,
                    "item_id": item.id,
                    "tool_use_id": event.tool_use_id,
                    "status": event.status,
                    "summary": event.summary,
                }
            )

    def take_origin(self) -> JsonDict | None:
        """Why the agent woke: the notifications since the last turn (None: none came)."""
        tasks, self._wake = self._wake, []
        return {"kind": "task_notification", "tasks": tasks} if tasks else None

    def clear_wake(self) -> None:
        """A turn started: notifications before it are not why a later turn wakes."""
        self._wake = []

    def running(self) -> list[TurnItem]:
        return [item for item in self._tasks.values() if item.status == "running"]

    def restore(self, items: tuple[TurnItem, ...]) -> None:
        """Tasks still running as the database has them (after a daemon restart)."""
        for item in items:
            if item.kind == "background_task" and (item.data or {}).get("task_id"):
                self._put(item)

    def stop_all(self, why: str) -> list[TurnItem]:
        """The agent's process is gone, and its tasks with it."""
        stopped = []
        for item in self.running():
            data = {**(item.data or {}), "status": "stopped", "note": why}
            stopped.append(self._put(attrs.evolve(item, status="stopped", data=data)))
        return stopped


def _line_name(event: Any) -> str:
    return {
        ce.TaskProgress: "task_progress",
        ce.TaskUpdated: "task_updated",
        ce.TaskNotification: "task_notification",
    }.get(type(event), "task")
