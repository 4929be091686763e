"""Codex's collaborating agents of one turn, as child threads. Pure.

Theory of operation: Codex 0.171.0's app-server schema (no recording: the real CLI could
not be run against a model here, so this follows the schema, ``ThreadItem``, and the
made-up but schema-valid lines of the test fake) has a ``collabAgentToolCall`` item. Its
``tool`` ``spawnAgent`` starts an agent: a Codex thread of its own on the same app-server
connection (``receiverThreadIds``), whose notifications (``turn/started``, ``item/*``,
``turn/completed``, approval requests) carry that thread's ``threadId``. `Collab` keeps,
for the running turn:

* each open agent (`Child`): its child thread and turn (ids derived from the parent turn,
  the collab call and the Codex thread, so a replay of the same output names the same
  child), and a `TurnMapper` of its own, which maps the agent's events onto items of the
  child's turn like any turn's. The agent's first Codex turn is the child's turn; events
  of its later turns (``sendInput``, ``followupTask``) are not the child's;
* the Codex threads of agents that ended in this turn, whose late lines are dropped;
* the lines of Codex threads it does not know yet (`hold`): Codex starts the agent's turn
  before it reports the spawn's end, so an agent's first lines may come before the
  ``spawnAgent`` item that names it. They are fed to the child once a spawn names the
  thread, in order; at the turn's end the ones no spawn named are dropped (the session
  logs them, per thread). An approval request of such a thread is not held: it is
  declined at once, so Codex never waits on it.

An agent's own ``spawnAgent`` nests: its child's parent is the agent's child thread. The
child ends when its Codex turn completes (as ``turn/completed`` says), or when a collab
item's ``agentsStates`` reports it over: ``errored`` and ``notFound`` end it failed,
``interrupted`` and ``shutdown`` interrupted, at once. ``completed`` does not end it at
once: the agent's own last lines may still be on their way (Codex writes each thread's
notifications from its own task, so a ``wait`` may report an agent completed before the
agent's last message), so its own ``turn/completed`` ends it; if that never comes, it
ends completed with the turn (`Child.over`). Other children still open when the turn
ends end with it (the domain closes them, `decide`).

Bounded: `MAX_CHILDREN` agents per turn and `MAX_SUBAGENT_DEPTH` levels; beyond them an
agent is not opened and its lines are dropped like those of an unknown thread (the
session logs it). At most `HOLD_LINES` lines and `HOLD_BYTES` bytes are held per turn;
beyond, a line of an unknown thread is dropped at once (counted with the others).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from t3d.domain import commands as c
from t3d.domain.model import MAX_SUBAGENT_DEPTH, TurnItem
from t3d.providers.codex import events as ce
from t3d.providers.codex.adapter import TurnEnded, TurnMapper

MAX_CHILDREN = 64
HOLD_LINES = 256
HOLD_BYTES = 4 * 1024 * 1024
PROMPT_CHARS = 64 * 1024
ERROR_CHARS = 2000
COLLAB = "collabAgentToolCall"
# agentsStates statuses that end an agent, and how its child's turn ends.
_OVER: dict[str, tuple[str, str | None]] = {
    "completed": ("completed", None),
    "errored": ("failed", "subagent_failed"),
    "notFound": ("failed", "subagent_not_found"),
    "interrupted": ("interrupted", "subagent_interrupted"),
    "shutdown": ("interrupted", "subagent_shutdown"),
}


@attrs.define
class Child:
    call_id: str  # the collabAgentToolCall that spawned it
    codex_thread_id: str  # the agent's Codex thread
    thread_id: str
    turn_id: str
    mapper: TurnMapper
    parent: TurnMapper  # whose call spawned it: the turn's own mapper, or another child's
    depth: int  # 1: the turn's own agent
    command: c.OpenSubagent
    # Codex reported the agent completed: how the child ends if its turn/completed never comes.
    over: c.FinishTurn | None = None


def child_ids(parent_turn_id: str, call_id: str, codex_thread_id: str) -> tuple[str, str]:
    """The child's thread and turn ids: the same for the same parent turn, call and agent."""
    key = f"{parent_turn_id}\0{call_id}\0{codex_thread_id}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return f"sub-{digest}", f"sub-{digest}:1"


def collab_item(event: object) -> ce.ToolCallItem | None:
    """The ``collabAgentToolCall`` an ``item/started`` or ``item/completed`` carries."""
    item = getattr(event, "item", None)
    return item if isinstance(item, ce.ToolCallItem) and item.type == COLLAB else None


def closing(mapper: TurnMapper, now: float) -> tuple[TurnItem, ...]:
    """``mapper``'s items still streaming or running, ended (a prompt stays as its request
    leaves it): what its turn's end records."""
    return tuple(
        attrs.evolve(i, status="completed" if i.status == "streaming" else "failed", updated_at=now)
        for i in mapper.open_items()
        if i.kind != "approval_request"
    )


def by_turn(items: Iterable[TurnItem]) -> dict[str, list[TurnItem]]:
    """Items grouped by their turn (the turn's own, and its agents' turns'), in order."""
    grouped: dict[str, list[TurnItem]] = {}
    for item in items:
        grouped.setdefault(item.turn_id, []).append(item)
    return grouped


class Collab:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._open: dict[str, Child] = {}  # Codex thread id -> open child
        self._ended: set[str] = set()  # Codex threads of this turn's agents that ended
        self.opened = 0  # children opened in this turn (bounded by MAX_CHILDREN)
        # Lines of Codex threads no spawn has named yet, in order (bounded: HOLD_*).
        self._held: list[tuple[str, object]] = []
        self._held_bytes = 0
        self._dropped: dict[str, int] = {}  # unknown Codex thread -> its lines not held

    def reset(self) -> dict[str, int]:
        """The turn ended: its children are over (closed with it). Returns the lines of
        unknown Codex threads dropped, per thread (held ones no spawn named, and the rest)."""
        dropped = dict(self._dropped)
        for thread_id, _ in self._held:
            dropped[thread_id] = dropped.get(thread_id, 0) + 1
        self._open.clear()
        self._ended.clear()
        self._held.clear()
        self._held_bytes = 0
        self._dropped.clear()
        self.opened = 0
        return dropped

    def hold(self, event: object, size: int) -> bool:
        """A line (of ``size`` bytes) of a Codex thread that is no open agent's: held for a
        spawn that may name it yet (True), or dropped (False: an ended agent's, or over the
        bound, counted)."""
        thread_id = getattr(event, "thread_id", "") or ""
        if not thread_id or thread_id in self._ended:
            return False
        if len(self._held) >= HOLD_LINES or self._held_bytes + size > HOLD_BYTES:
            self._dropped[thread_id] = self._dropped.get(thread_id, 0) + 1
            return False
        self._held.append((thread_id, event))
        self._held_bytes += size
        return True

    def held_for(self, child: Child) -> list[object]:
        """The held lines of ``child``'s Codex thread, in order (no longer held)."""
        mine = [event for thread_id, event in self._held if thread_id == child.codex_thread_id]
        if mine:
            self._held = [(t, e) for t, e in self._held if t != child.codex_thread_id]
        return mine

    # --- routing ------------------------------------------------------------------------

    def child_of(self, event: object) -> Child | None:
        """The open child whose agent's first Codex turn ``event`` belongs to."""
        child = self._open.get(getattr(event, "thread_id", "") or "")
        if child is None:
            return None
        turn_id = getattr(event, "turn_id", "")
        if not turn_id or child.mapper.codex_turn_id == turn_id:
            return child
        if child.mapper.codex_turn_id is None:
            child.mapper.codex_turn_id = turn_id  # its first turn is the child's
            return child
        return None  # a later turn of the agent (sendInput, followupTask): not the child's

    def ended(self, thread_id: str) -> bool:
        """``thread_id`` is an agent of this turn that ended: its late lines are expected."""
        return thread_id in self._ended

    # --- spawns ------------------------------------------------------------------------

    def spawned(self, mapper: TurnMapper, event: object) -> tuple[list[Child], list[str]]:
        """``mapper``'s agent reports a ``spawnAgent`` call: the children it opens (each
        receiver Codex thread not seen yet), and why others are not opened (bounds)."""
        item = collab_item(event)
        if item is None or item.name != "spawnAgent":
            return [], []
        raw = item.raw
        receivers = [r for r in raw.get("receiverThreadIds") or () if isinstance(r, str) and r]
        depth = 1 + next((ch.depth for ch in self._open.values() if ch.mapper is mapper), 0)
        children: list[Child] = []
        why: list[str] = []
        for receiver in receivers:
            if receiver in self._open or receiver in self._ended:
                continue  # seen already (started, then completed)
            if depth > MAX_SUBAGENT_DEPTH:
                why.append(f"agent {receiver} (call {item.id}) nests deeper than {MAX_SUBAGENT_DEPTH}; its lines are dropped")
                self._ended.add(receiver)
                continue
            if self.opened >= MAX_CHILDREN:
                why.append(f"turn {mapper.turn_id} spawned more than {MAX_CHILDREN} agents; agent {receiver}'s lines are dropped")
                self._ended.add(receiver)
                continue
            thread_id, turn_id = child_ids(mapper.turn_id, item.id, receiver)
            command = c.OpenSubagent(
                parent_turn_id=mapper.turn_id,
                tool_use_id=item.id,
                thread_id=thread_id,
                turn_id=turn_id,
                subagent_type=_text(raw.get("model")),
                description="",
                prompt=_text(raw.get("prompt"))[:PROMPT_CHARS],
            )
            child_mapper = TurnMapper(thread_id, turn_id, self._clock)
            child = Child(item.id, receiver, thread_id, turn_id, child_mapper, mapper, depth, command)
            self._open[receiver] = child
            self.opened += 1
            mapper.agents[receiver] = thread_id
            children.append(child)
        return children, why

    def restore(self, mapper: TurnMapper, items: tuple[TurnItem, ...]) -> list[Child]:
        """The turn's committed items, after a restart whose replay lost the turn's start:
        the children its spawn items opened are open again (their agents' lines reach them
        from the live point on). Not their own children: their spawn items are theirs."""
        restored: list[Child] = []
        for item in items:
            data = item.data or {}
            codex = data.get("codex")
            if item.kind != "tool_call" or data.get("name") != "spawnAgent" or not isinstance(codex, dict):
                continue
            raw = {"type": COLLAB, "id": data.get("tool_use_id"), "tool": "spawnAgent", **codex}
            event = ce.ItemCompleted("", "", ce.ToolCallItem(str(raw["id"]), COLLAB, "spawnAgent", {}, "", None, None, raw))
            opened, _ = self.spawned(mapper, event)
            restored.extend(opened)
        return restored

    def refused(self, child: Child) -> None:
        """The domain did not open the child: its lines are dropped like unknown ones."""
        if self._open.get(child.codex_thread_id) is child:
            del self._open[child.codex_thread_id]
            child.parent.agents.pop(child.codex_thread_id, None)
            self._ended.add(child.codex_thread_id)

    # --- ends ----------------------------------------------------------------------------

    def finish(self, child: Child, ended: TurnEnded) -> c.FinishTurn:
        """The agent's Codex turn completed: its child ends as the turn did (`close` it)."""
        return c.FinishTurn(child.turn_id, ended.status, ended.error, ended.reason, ended.usage, None)

    def reported(self, event: object) -> list[tuple[Child, c.FinishTurn]]:
        """A collab item whose ``agentsStates`` reports open agents over: their ends (a
        completed one's is kept as its `Child.over`, not returned)."""
        item = collab_item(event)
        states = item.raw.get("agentsStates") if item is not None else None
        if not isinstance(states, dict):
            return []
        ends = []
        for codex_thread_id, state in states.items():
            child = self._open.get(codex_thread_id)
            status = state.get("status") if isinstance(state, dict) else None
            if child is None or status not in _OVER:
                continue
            turn_status, reason = _OVER[status]
            message = _text(state.get("message"))[:ERROR_CHARS]
            error = None if turn_status == "completed" else message or f"Codex reports the agent {status}"
            finish = c.FinishTurn(child.turn_id, turn_status, error, reason, child.mapper.usage(), None)
            if turn_status == "completed":
                child.over = finish
            else:
                ends.append((child, finish))
        return ends

    def close(self, child: Child) -> list[Child]:
        """``child`` ends, and the agents it spawned that are still open with it (the domain
        ends their turns with its turn): those closed, the deepest first; none if ``child``
        was over already."""
        if self._open.get(child.codex_thread_id) is not child:
            return []
        gone = [child]
        for each in gone:  # grows while walking: each one's own children after it
            gone.extend(ch for ch in self._open.values() if ch.parent is each.mapper)
        for each in gone:
            self._open.pop(each.codex_thread_id, None)
            self._ended.add(each.codex_thread_id)
        return sorted(gone, key=lambda ch: -ch.depth)

    def asking(self, request_id: str) -> TurnMapper | None:
        """The open agent's turn a prompt (``<turn id>:<Codex's id>``) was asked in, if any."""
        return next((ch.mapper for ch in self._open.values() if request_id.startswith(f"{ch.turn_id}:")), None)

    def open_children(self) -> list[Child]:
        """The children still open, the deepest first."""
        return sorted(self._open.values(), key=lambda ch: -ch.depth)

    def interrupting(self) -> list[tuple[str, str]]:
        """The parent's turn is being interrupted: each open agent's (Codex thread, Codex
        turn) to interrupt too (an agent runs on whether its parent's turn ends or not)."""
        targets = []
        for child in self.open_children():
            child.mapper.interrupt_requested = True
            if child.mapper.codex_turn_id is not None:
                targets.append((child.codex_thread_id, child.mapper.codex_turn_id))
        return targets


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
