"""Subagents as child threads, in the pure domain (`decide` on the in-memory `State`)."""

from __future__ import annotations

import itertools

import pytest

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.decide import decide
from t3d.domain.model import MAX_SUBAGENT_DEPTH, SUBAGENT_TITLE, TurnItem
from t3d.domain.state import State
from t3d.errors import DomainError


class World:
    def __init__(self) -> None:
        self.state = State()
        self.clock = itertools.count(1)
        self.effects: list[ev.Effect] = []

    def run(self, command: c.Command) -> dict[str, object]:
        decision = decide(self.state, command, float(next(self.clock)))
        for event in decision.events:
            self.state.apply(event)
        self.effects += decision.effects
        return decision.result

    def parent(self) -> None:
        self.run(c.CreateProject("p", "/w"))
        self.run(c.CreateThread("t", "p", "replay", model="m1"))
        self.run(c.StartTurn("t", "u", "go"))
        self.run(c.MarkTurnRunning("u"))

    def child(self, parent_turn: str, tool: str, thread_id: str, description: str = "Read the notes") -> str:
        turn_id = f"{thread_id}:1"
        self.run(c.OpenSubagent(parent_turn, tool, thread_id, turn_id, "general-purpose", description, "read notes.txt"))
        return turn_id


def _approval(turn_id: str) -> TurnItem:
    return TurnItem(f"{turn_id}:req", "", turn_id, 0, "approval_request", "pending", "Edit", None, None, 0.0)


def test_a_subagent_is_a_child_thread_with_one_running_turn() -> None:
    """OpenSubagent makes a thread whose parent is the calling turn's thread (its project,
    provider, model and directory), with ``subagent`` naming the parent turn and tool call, its
    type and description as a bounded title, and one running turn whose first item is the
    prompt; opening it again (a replay) changes nothing, and no effect starts an agent for it."""
    w = World()
    w.parent()
    w.effects.clear()
    turn_id = w.child("u", "toolu_1", "sub-1")
    child = w.state.thread("sub-1")
    assert child is not None
    assert (child.parent_thread_id, child.project_id, child.provider, child.model) == ("t", "p", "replay", "m1")
    assert child.subagent == {"parent_turn_id": "u", "tool_use_id": "toolu_1", "subagent_type": "general-purpose", "description": "Read the notes"}
    assert child.title == "general-purpose: Read the notes" and child.status == "running"
    turn = w.state.turn(turn_id)
    assert turn is not None and (turn.status, turn.ordinal, turn.started_by) == ("running", 1, "provider")
    assert turn.origin == {"kind": "subagent", "parent_thread_id": "t", "parent_turn_id": "u", "tool_use_id": "toolu_1"}
    [prompt] = [i for i in w.state.items.values() if i.turn_id == turn_id]
    assert (prompt.kind, prompt.text, prompt.ordinal) == ("user_message", "read notes.txt", 1)
    assert w.effects == []
    before = (dict(w.state.threads), dict(w.state.turns), dict(w.state.items))
    w.child("u", "toolu_1", "sub-1")
    assert (dict(w.state.threads), dict(w.state.turns), dict(w.state.items)) == before
    w.run(c.OpenSubagent("u", "toolu_2", "sub-2", "sub-2:1", "x", "d" * 1000, ""))
    title = w.state.threads["sub-2"].title
    assert len(title) == SUBAGENT_TITLE and title.endswith("…")


def test_a_turn_that_ends_ends_its_open_subagents_nested_too() -> None:
    """When the parent's turn ends (here interrupted), its subagents' open turns and theirs end
    with its status, their pending prompts cancelled, their threads idle; a subagent that
    finished before keeps its own end. A completed parent's still-open child fails instead
    (it never reported a result)."""
    w = World()
    w.parent()
    outer = w.child("u", "toolu_1", "sub-1")
    inner = w.child(outer, "toolu_2", "sub-2")
    done = w.child("u", "toolu_3", "sub-3")
    w.run(c.FinishTurn(done, "completed"))
    w.run(c.OpenRequest(inner, "r1", "permission", _approval(inner)))
    assert w.state.threads["sub-2"].status == "waiting"
    w.run(c.InterruptTurn("t"))
    w.run(c.FinishTurn("u", "interrupted", "interrupted by the user", "interrupt"))
    assert [w.state.turns[t].status for t in (outer, inner, done)] == ["interrupted", "interrupted", "completed"]
    assert w.state.turns[inner].reason == "interrupt"
    assert w.state.requests["r1"].status == "cancelled"
    assert {w.state.threads[t].status for t in ("sub-1", "sub-2", "sub-3")} == {"idle"}

    w.run(c.StartTurn("t", "u2", "again"))
    w.run(c.MarkTurnRunning("u2"))
    left = w.child("u2", "toolu_4", "sub-4")
    w.run(c.FinishTurn("u2", "completed"))
    turn = w.state.turns[left]
    assert (turn.status, turn.reason) == ("failed", "parent_turn_ended")
    assert turn.error and "no result" in turn.error


def test_clients_cannot_start_or_interrupt_a_subagents_turns() -> None:
    """turn.start and turn.interrupt on a subagent's thread are refused (conflict) with a
    message naming its parent; a client-made thread with a parent still takes turns."""
    w = World()
    w.parent()
    w.child("u", "toolu_1", "sub-1")
    for command in (c.StartTurn("sub-1", "x", "hi"), c.InterruptTurn("sub-1")):
        with pytest.raises(DomainError) as caught:
            w.run(command)
        assert caught.value.code == "conflict"
        assert "subagent of thread 't'" in caught.value.message and "parent" in caught.value.message
    w.run(c.CreateThread("fork", "p", "replay", parent_thread_id="t"))
    assert w.run(c.StartTurn("fork", "f1", "hi"))["status"] == "starting"


def test_a_subagents_prompt_is_answered_through_its_root_threads_agent() -> None:
    """A prompt in a nested subagent's turn is answered with an effect addressed to the top
    parent thread (whose session talks to the CLI), once; the child's turn runs again."""
    w = World()
    w.parent()
    outer = w.child("u", "toolu_1", "sub-1")
    inner = w.child(outer, "toolu_2", "sub-2")
    w.run(c.OpenRequest(inner, "r1", "permission", _approval(inner)))
    w.effects.clear()
    w.run(c.RespondToRequest("r1", "allow"))
    assert w.effects == [ev.AnswerProviderRequest("t", "r1", "allow", None)]
    assert w.state.turns[inner].status == "running"
    with pytest.raises(DomainError):
        w.run(c.RespondToRequest("r1", "deny"))


def test_restart_recovery_closes_children_with_their_parent_or_keeps_them() -> None:
    """After a restart, a subagent's open turn is kept when its top parent's agent lives on
    (taken over), and ends interrupted (server_restart) with its parent's turn otherwise,
    once; its pending prompt expires with it."""
    for live in (True, False):
        w = World()
        w.parent()
        w.run(c.RecordSession(_session()))
        outer = w.child("u", "toolu_1", "sub-1")
        inner = w.child(outer, "toolu_2", "sub-2")
        w.run(c.OpenRequest(inner, "r1", "permission", _approval(inner)))
        decision = decide(w.state, c.RecoverAfterRestart(("s1",) if live else ()), 50.0)
        for event in decision.events:
            w.state.apply(event)
        ended = [e.entity.id for e in decision.events if e.kind == "turn.updated"]
        if live:
            assert [w.state.turns[t].status for t in ("u", outer, inner)] == ["running", "running", "waiting"]
            assert w.state.requests["r1"].status == "pending"
        else:
            assert [w.state.turns[t].reason for t in ("u", outer, inner)] == ["server_restart"] * 3
            assert sorted(ended) == sorted({"u", outer, inner})  # each ended once
            assert w.state.requests["r1"].status == "expired"


def test_subagents_nest_only_to_the_bound() -> None:
    """A subagent nested deeper than MAX_SUBAGENT_DEPTH is refused (invalid), naming the bound."""
    w = World()
    w.parent()
    turn = "u"
    for depth in range(MAX_SUBAGENT_DEPTH):
        turn = w.child(turn, f"toolu_{depth}", f"sub-{depth}")
    with pytest.raises(DomainError) as caught:
        w.child(turn, "toolu_deep", "sub-deep")
    assert caught.value.code == "invalid" and str(MAX_SUBAGENT_DEPTH) in caught.value.message


def _session():  # type: ignore[no-untyped-def]
    from t3d.domain.model import ProviderSession

    return ProviderSession("s1", "t", "replay", "running", 1.0)


def test_deleting_a_thread_deletes_its_subagents_not_its_forks() -> None:
    """thread.delete of a parent deletes its subagent threads and theirs (their turns and
    items too); a client-made thread that names it as parent stays."""
    w = World()
    w.parent()
    outer = w.child("u", "toolu_1", "sub-1")
    w.child(outer, "toolu_2", "sub-2")
    w.run(c.CreateThread("fork", "p", "replay", parent_thread_id="t"))
    w.run(c.DeleteThread("t"))
    assert sorted(w.state.threads) == ["fork"]
    assert not [t for t in w.state.turns.values() if t.thread_id.startswith("sub-")]
    assert not [i for i in w.state.items.values() if i.thread_id.startswith("sub-")]
