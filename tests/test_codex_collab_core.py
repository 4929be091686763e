"""The pure core of Codex's spawned agents (t3d/providers/codex/collab.py): which collab
items open children, which events are a child's, and how children end. Events are parsed
from app-server lines (`parse_line`) shaped as codex 0.171.0's schema says."""

from __future__ import annotations

import json
from typing import Any

from t3d.domain import commands as c
from t3d.domain.model import MAX_SUBAGENT_DEPTH, TurnItem
from t3d.providers.codex import events as ce
from t3d.providers.codex.adapter import ItemChanged, TurnEnded, TurnMapper
from t3d.providers.codex.collab import (
    HOLD_BYTES,
    HOLD_LINES,
    MAX_CHILDREN,
    Collab,
    child_ids,
    closing,
)
from t3d.providers.codex.protocol import parse_line

PARENT = "thread-parent"
AGENT = "thread-agent"


def clock() -> float:
    return 1000.0


def line(method: str, **params: Any) -> object:
    return parse_line(json.dumps({"method": method, "params": params}).encode())


def collab(call_id: str, tool: str, receivers: list[str], states: dict[str, Any], *, sender: str = PARENT,
           turn: str = "cx-1", final: bool = True, prompt: str | None = "look around", model: str | None = "gpt-mock") -> object:  # fmt: skip
    item = {"type": "collabAgentToolCall", "id": call_id, "tool": tool, "status": "completed" if final else "inProgress",
            "senderThreadId": sender, "receiverThreadIds": receivers, "prompt": prompt, "model": model, "agentsStates": states}  # fmt: skip
    return line("item/completed" if final else "item/started", threadId=sender, turnId=turn, item=item)


def spawn(call_id: str = "call_1", receiver: str = AGENT, **kw: Any) -> object:
    return collab(call_id, "spawnAgent", [receiver], {receiver: {"status": "pendingInit", "message": None}}, **kw)


def parent() -> TurnMapper:
    return TurnMapper(PARENT, "turn-1", clock)


def test_a_spawn_opens_one_child_per_receiver_with_derived_ids() -> None:
    """spawnAgent's completed item opens a child for its receiver: ids derived from the parent
    turn, the call and the Codex thread (the same from a fresh core: a replay names the same
    child), the prompt and model in the OpenSubagent; seeing it again opens nothing; the
    started item (no receiver yet) and other collab tools open nothing."""
    mapper, core = parent(), Collab(clock)
    assert core.spawned(mapper, collab("call_1", "spawnAgent", [], {}, final=False)) == ([], [])
    assert core.spawned(mapper, collab("call_w", "wait", [AGENT], {})) == ([], [])
    [child], why = core.spawned(mapper, spawn())
    assert why == []
    thread_id, turn_id = child_ids("turn-1", "call_1", AGENT)
    assert (child.thread_id, child.turn_id, child.codex_thread_id, child.depth) == (thread_id, turn_id, AGENT, 1)
    assert child.command == c.OpenSubagent("turn-1", "call_1", thread_id, turn_id, "gpt-mock", "", "look around")
    assert core.spawned(mapper, spawn()) == ([], [])
    [again], _ = Collab(clock).spawned(parent(), spawn())
    assert (again.thread_id, again.turn_id) == (thread_id, turn_id)
    assert child_ids("turn-2", "call_1", AGENT) != (thread_id, turn_id)


def test_the_spawn_item_links_to_its_child_and_shows_its_status() -> None:
    """Once a spawn opened its child, the collab items naming that agent (the spawn itself,
    a later wait) carry child_thread_id and the agent's status as Codex reports it."""
    mapper, core = parent(), Collab(clock)
    event = spawn()
    [child], _ = core.spawned(mapper, event)
    [changed] = mapper.feed(event)
    assert isinstance(changed, ItemChanged)
    assert changed.item.data is not None
    assert (changed.item.data["child_thread_id"], changed.item.data["child_status"]) == (child.thread_id, "pendingInit")
    [waited] = mapper.feed(collab("call_w", "wait", [AGENT], {AGENT: {"status": "running"}}))
    assert isinstance(waited, ItemChanged) and waited.item.data is not None
    assert (waited.item.data["child_thread_id"], waited.item.data["child_status"]) == (child.thread_id, "running")
    [other] = mapper.feed(collab("call_x", "wait", ["thread-else"], {}))
    assert isinstance(other, ItemChanged) and other.item.data is not None and "child_thread_id" not in other.item.data


def test_a_childs_events_are_those_of_its_agents_first_turn() -> None:
    """Events of the agent's Codex thread are the child's; its first Codex turn is the child's
    turn (events of a later turn, and of other threads, are not the child's)."""
    mapper, core = parent(), Collab(clock)
    [child], _ = core.spawned(mapper, spawn())
    assert core.child_of(line("turn/started", threadId=AGENT, turn={"id": "ax-1"})) is child
    delta = line("item/agentMessage/delta", threadId=AGENT, turnId="ax-1", itemId="m", delta="hi")
    assert core.child_of(delta) is child
    assert core.child_of(line("item/agentMessage/delta", threadId=AGENT, turnId="ax-2", itemId="m", delta="x")) is None
    assert core.child_of(line("item/agentMessage/delta", threadId=PARENT, turnId="cx-1", itemId="m", delta="x")) is None
    assert core.child_of(line("item/agentMessage/delta", threadId="ghost", turnId="g", itemId="m", delta="x")) is None
    [changed] = child.mapper.feed(delta)
    assert isinstance(changed, ItemChanged) and changed.item.turn_id == child.turn_id and changed.item.thread_id == child.thread_id


def test_agents_states_end_children() -> None:
    """A collab item reporting agents over ends their children: errored as failed (Codex's
    message the error), shutdown as interrupted; a completed one is not ended at once (its
    last lines may follow) but keeps its completed end for the turn's end; a running agent
    goes on; a closed child is not ended twice."""
    mapper, core = parent(), Collab(clock)
    kids = {}
    for name in ("a", "b", "c", "d"):
        [kids[name]], _ = core.spawned(mapper, spawn(f"call_{name}", f"thread-{name}"))
    states = {"thread-a": {"status": "completed", "message": "done"}, "thread-b": {"status": "errored", "message": "boom"},
              "thread-c": {"status": "shutdown"}, "thread-d": {"status": "running"}}  # fmt: skip
    ends = core.reported(collab("call_w", "wait", list(states), states))
    got = {child.codex_thread_id: (f.status, f.error, f.reason) for child, f in ends}
    assert got == {
        "thread-b": ("failed", "boom", "subagent_failed"),
        "thread-c": ("interrupted", "Codex reports the agent shutdown", "subagent_shutdown"),
    }
    for child, _ in ends:
        assert core.close(child) == [child]
        assert core.close(child) == []
        assert core.ended(child.codex_thread_id)
    assert sorted(ch.codex_thread_id for ch in core.open_children()) == ["thread-a", "thread-d"]
    assert kids["a"].over == c.FinishTurn(kids["a"].turn_id, "completed", None, None, None, None)
    assert kids["d"].over is None


def test_the_agents_turn_end_finishes_its_child() -> None:
    """The agent's turn/completed maps (through the child's own mapper) to the child's end."""
    mapper, core = parent(), Collab(clock)
    [child], _ = core.spawned(mapper, spawn())
    event = line("turn/completed", threadId=AGENT, turn={"id": "ax-1", "status": "failed", "error": {"message": "no"}})
    assert core.child_of(event) is child
    [ended] = child.mapper.feed(event)
    assert isinstance(ended, TurnEnded)
    assert core.finish(child, ended) == c.FinishTurn(child.turn_id, "failed", "no", "turn_failed", None, None)


def test_nested_spawns_nest_and_close_with_their_parent() -> None:
    """An agent's own spawn opens a child of the child (depth 2, parent turn: the child's);
    closing the outer child closes the inner one too, deepest first."""
    mapper, core = parent(), Collab(clock)
    [outer], _ = core.spawned(mapper, spawn())
    [inner], _ = core.spawned(outer.mapper, spawn("call_2", "thread-inner", sender=AGENT, turn="ax-1"))
    assert (inner.depth, inner.command.parent_turn_id, inner.parent) == (2, outer.turn_id, outer.mapper)
    assert core.close(outer) == [inner, outer]
    assert core.open_children() == []


def test_spawns_are_bounded_in_number_and_depth() -> None:
    """At most MAX_CHILDREN agents a turn and MAX_SUBAGENT_DEPTH levels: beyond, the agent is
    not opened, the reason says which bound, and its thread counts as ended (lines dropped)."""
    mapper, core = parent(), Collab(clock)
    for n in range(MAX_CHILDREN):
        opened, _ = core.spawned(mapper, spawn(f"call_{n}", f"thread-{n}"))
        assert len(opened) == 1
    opened, why = core.spawned(mapper, spawn("call_x", "thread-x"))
    assert opened == [] and f"more than {MAX_CHILDREN} agents" in why[0] and core.ended("thread-x")
    deep, chain = Collab(clock), parent()
    for level in range(MAX_SUBAGENT_DEPTH):
        [child], _ = deep.spawned(chain, spawn(f"call_{level}", f"deep-{level}"))
        chain = child.mapper
    opened, why = deep.spawned(chain, spawn("call_deep", "deep-x"))
    assert opened == [] and f"deeper than {MAX_SUBAGENT_DEPTH}" in why[0]


def test_refused_children_and_reset() -> None:
    """A child the domain refused is forgotten (its thread ended, no link); reset forgets the
    turn's children."""
    mapper, core = parent(), Collab(clock)
    [child], _ = core.spawned(mapper, spawn())
    core.refused(child)
    assert core.open_children() == [] and core.ended(AGENT) and mapper.agents == {}
    assert len(core.spawned(mapper, spawn("call_2", "thread-2"))[0]) == 1
    core.reset()
    assert core.open_children() == [] and not core.ended(AGENT) and core.opened == 0


def test_interrupting_and_asking() -> None:
    """An interrupt of the parent names each open agent's Codex thread and turn, and marks
    the child's mapper interrupted (its end then reads "interrupted by the user"); a
    prompt's request id names the child whose turn it was asked in."""
    mapper, core = parent(), Collab(clock)
    [child], _ = core.spawned(mapper, spawn())
    [idle], _ = core.spawned(mapper, spawn("call_2", "thread-2"))
    core.child_of(line("turn/started", threadId=AGENT, turn={"id": "ax-1"}))
    assert core.interrupting() == [(AGENT, "ax-1")]
    assert child.mapper.interrupt_requested and idle.mapper.interrupt_requested
    assert core.asking(f"{child.turn_id}:5") is child.mapper
    assert core.asking("turn-1:5") is None


def test_closing_ends_open_items_but_not_prompts() -> None:
    """closing() ends streaming items completed and running ones failed, leaves finished items
    and approval prompts alone."""
    mapper = TurnMapper(PARENT, "turn-1", clock)
    mapper.feed(line("item/agentMessage/delta", threadId=PARENT, turnId="t", itemId="m", delta="hi"))
    mapper.feed(line("item/started", threadId=PARENT, turnId="t", item={"type": "commandExecution", "id": "c", "command": "ls", "cwd": "/", "status": "inProgress"}))
    approval = {"threadId": PARENT, "turnId": "t", "itemId": "c", "command": "ls", "cwd": "/"}
    event = parse_line(json.dumps({"method": "item/commandExecution/requestApproval", "id": 0, "params": approval}).encode())
    assert isinstance(event, ce.ApprovalRequested)
    mapper.feed(event)
    closed: tuple[TurnItem, ...] = closing(mapper, 2000.0)
    assert sorted((i.kind, i.status, i.updated_at) for i in closed) == [
        ("assistant_message", "completed", 2000.0),
        ("command", "failed", 2000.0),
    ]


def test_a_sub_agent_activity_item_links_to_its_child() -> None:
    """A subAgentActivity item naming a spawned agent (agentThreadId) links to its child."""
    mapper, core = parent(), Collab(clock)
    [child], _ = core.spawned(mapper, spawn())
    item = {"type": "subAgentActivity", "id": "act_1", "agentThreadId": AGENT, "agentPath": "/root/a", "kind": "started"}
    [changed] = mapper.feed(line("item/completed", threadId=PARENT, turnId="cx-1", item=item))
    assert isinstance(changed, ItemChanged) and changed.item.data is not None
    assert (changed.item.title, changed.item.data["child_thread_id"]) == ("subAgentActivity", child.thread_id)


def test_lines_before_the_spawn_are_held_bounded_and_counted() -> None:
    """Lines of a Codex thread no spawn named yet are held, in order, and handed to the child
    a spawn opens for it; beyond HOLD_LINES they are dropped at once; the turn's end reports
    the dropped and never-claimed ones per thread; an ended agent's lines are not held."""
    mapper, core = parent(), Collab(clock)
    early = [line("item/agentMessage/delta", threadId=AGENT, turnId="ax-1", itemId="m", delta=str(n)) for n in range(3)]
    assert all(core.hold(event, 100) for event in early)
    assert core.hold(line("item/agentMessage/delta", threadId="ghost", turnId="g", itemId="m", delta="x"), 100)
    [child], _ = core.spawned(mapper, spawn())
    assert core.held_for(child) == early and core.held_for(child) == []
    for _ in range(HOLD_LINES):
        core.hold(line("item/agentMessage/delta", threadId="ghost", turnId="g", itemId="m", delta="x"), 1)
    assert core.reset() == {"ghost": HOLD_LINES + 1}
    big = Collab(clock)
    assert not big.hold(early[0], HOLD_BYTES + 1)
    ended = Collab(clock)
    [gone], _ = ended.spawned(parent(), spawn())
    ended.close(gone)
    assert not ended.hold(early[0], 1) and ended.reset() == {}


def test_restore_reopens_the_children_of_committed_spawn_items() -> None:
    """After a restart that lost the turn's start, the committed spawn items (as the mapper
    made them) open the same children again, linked from the new mapper; other items
    open nothing."""
    mapper, core = parent(), Collab(clock)
    event = spawn()
    [child], _ = core.spawned(mapper, event)
    [changed] = mapper.feed(event)
    [other] = mapper.feed(collab("call_w", "wait", [AGENT], {}))
    assert isinstance(changed, ItemChanged) and isinstance(other, ItemChanged)
    again, fresh = Collab(clock), parent()
    [restored] = again.restore(fresh, (changed.item, other.item))
    assert (restored.thread_id, restored.turn_id, restored.codex_thread_id) == (child.thread_id, child.turn_id, AGENT)
    assert fresh.agents == {AGENT: child.thread_id}
    assert again.child_of(line("turn/started", threadId=AGENT, turn={"id": "ax-1"})) is restored
