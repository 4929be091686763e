"""The pure subagent tracker (t3d/providers/claude/subagents.py) and the task tracker's
handling of foreground subagents: which child a line or a prompt belongs to, and bounds."""

from __future__ import annotations

from t3d.providers.claude import events as ce
from t3d.providers.claude.adapter import TurnMapper
from t3d.providers.claude.subagents import MAX_CHILDREN, Subagents, child_ids, is_subagent_call
from t3d.providers.claude.tasks import TaskTracker


def _call(tool_use_id: str, name: str = "Agent", **extra: object) -> ce.ToolUseBlock:
    return ce.ToolUseBlock(tool_use_id, name, {"description": "Read it", "prompt": "read", "subagent_type": "general-purpose", **extra})


def _ask(tool_use_id: str | None, agent_id: str | None) -> ce.PermissionRequested:
    return ce.PermissionRequested("req-1", "Edit", "Edit", {}, tool_use_id, None, None, (), agent_id)


def _clock() -> float:
    return 1.0


def test_a_subagent_call_opens_a_child_whose_lines_and_prompts_route_to_it() -> None:
    """A foreground Agent call opens a child (ids derived from the turn and the call, the
    same on a replay), linked from the call; the child's own calls and its task id route a
    permission prompt to it; the call's result in the calling turn ends it (failed on an error
    result, with the result's words), a result elsewhere does not; a background call is no
    child."""
    subs = Subagents(_clock)
    root = TurnMapper("t", "u", _clock)
    command, why = subs.start(root, _call("toolu_1"))
    assert why is None and command is not None
    assert (command.thread_id, command.turn_id) == child_ids("u", "toolu_1") == child_ids("u", "toolu_1")
    assert (command.parent_turn_id, command.subagent_type, command.description, command.prompt) == ("u", "general-purpose", "Read it", "read")
    assert root.children == {"toolu_1": command.thread_id}
    assert subs.start(root, _call("toolu_1")) == (None, None)  # its line seen twice
    child = subs.child("toolu_1")
    assert child is not None and child.thread_id == command.thread_id and child.depth == 1
    subs.see_task(ce.TaskStarted("task-9", "toolu_1", "local_agent", "Read it", "general-purpose", "read"))
    subs.see_tools(child, ce.AssistantMessage("m", (_call("toolu_read", "Read"),), None, False, "toolu_1", False))
    assert subs.asking(_ask("toolu_read", None)) is child
    assert subs.asking(_ask(None, "task-9")) is child
    assert subs.asking(_ask("toolu_other", "task-other")) is None
    assert not is_subagent_call(_call("toolu_bg", run_in_background=True)) and is_subagent_call(_call("x", "Task"))

    nested, _ = subs.start(child.mapper, _call("toolu_2"))
    assert nested is not None and nested.parent_turn_id == child.turn_id
    assert [c.tool_use_id for c in subs.open_children()] == ["toolu_2", "toolu_1"]  # deepest first
    assert subs.finish(root, ce.ToolResult("toolu_2", "done", False, None)) is None  # not its caller's turn
    done = subs.finish(child.mapper, ce.ToolResult("toolu_2", "it broke", True, None))
    assert done is not None and (done[1].status, done[1].error, done[1].reason) == ("failed", "it broke", "subagent_failed")
    done = subs.finish(root, ce.ToolResult("toolu_1", "fine", False, None))
    assert done is not None and (done[1].turn_id, done[1].status, done[1].error) == (child.turn_id, "completed", None)
    assert subs.open_children() == [] and subs.child("toolu_1") is None


def test_a_turn_opens_at_most_the_bound_of_subagents() -> None:
    """The MAX_CHILDREN+1-th subagent of a turn is not opened, and the reason says so; after the
    turn (reset) the next turn may open them again."""
    subs = Subagents(_clock)
    root = TurnMapper("t", "u", _clock)
    for n in range(MAX_CHILDREN):
        assert subs.start(root, _call(f"toolu_{n}"))[0] is not None
    command, why = subs.start(root, _call("toolu_over"))
    assert command is None and why is not None and str(MAX_CHILDREN) in why
    subs.reset()
    assert subs.start(TurnMapper("t", "u2", _clock), _call("toolu_over"))[0] is not None


def test_a_foreground_subagents_task_lines_make_no_task_items() -> None:
    """task_started/progress/notification of a foreground subagent make no background task
    item; a nested subagent's task_started, which comes before its call's line, waits for the
    call: a foreground call drops it, a background call starts the task item then."""
    tasks = TaskTracker("t", _clock)
    tasks.see_tool("u", _call("toolu_1"), None)
    assert tasks.feed(ce.TaskStarted("task-1", "toolu_1", "local_agent", "Read it", "general-purpose", "read"), "u").items == ()
    assert tasks.feed(ce.TaskProgress("task-1", "toolu_1", "Reading", "Read", {}), "u").items == ()
    tasks.defer_agents = True
    for task_id, call, background in (("task-2", "toolu_2", False), ("task-3", "toolu_3", True)):
        assert tasks.feed(ce.TaskStarted(task_id, call, "local_agent", "Inner", "general-purpose", "read"), "u").items == ()
        assert tasks.feed(ce.TaskProgress(task_id, call, "Reading", "Read", {}), "u").items == ()
        started = tasks.see_tool("u", _call(call, run_in_background=background), "toolu_1")
        if background:
            assert started is not None and [i.data["task_id"] for i in started.items] == [task_id]  # type: ignore[index]
        else:
            assert started is None
    assert tasks.feed(ce.TaskProgress("task-2", "toolu_2", "More", "Read", {}), "u").items == ()
    assert [i.data["task_id"] for i in tasks.running()] == ["task-3"]  # type: ignore[index]


def test_a_turns_end_forgets_the_tool_calls_no_later_line_can_name() -> None:
    """Plain calls are forgotten when their turn ends (before, each session kept its last
    MAX_TOOLS = 1,024 calls: 256,000 at 250 sessions after a day), while what a later line
    still needs stays: a background call, a call that started a task, and a background
    subagent's own calls, whose tasks land in the turn of the subagent's call."""
    tasks = TaskTracker("t", _clock)
    for turn in range(2000):
        for n in range(3):
            tasks.see_tool(f"turn-{turn}", _call(f"toolu_{turn}_{n}", name="Read"), None)
        tasks.forget_settled_calls()
    assert tasks.tool("toolu_1999_2") is None and tasks.tool("toolu_0_0") is None

    tasks.see_tool("u1", _call("toolu_bash", name="Bash", run_in_background=True), None)
    tasks.see_tool("u1", _call("toolu_monitor", name="Monitor"), None)
    tasks.feed(ce.TaskStarted("task-m", "toolu_monitor", "monitor", "Watch it", None, None), "u1")
    tasks.see_tool("u1", _call("toolu_agent", run_in_background=True), None)
    tasks.see_tool("u1", _call("toolu_inner", name="Bash", command="ls"), "toolu_agent")
    tasks.see_tool("u1", _call("toolu_plain", name="Read"), None)
    tasks.forget_settled_calls()
    assert {name: tasks.tool(name) is not None for name in ("toolu_bash", "toolu_monitor", "toolu_agent", "toolu_inner", "toolu_plain")} == {
        "toolu_bash": True, "toolu_monitor": True, "toolu_agent": True, "toolu_inner": True, "toolu_plain": False,
    }  # fmt: skip
    # The subagent's call, seen after the turn ended, still belongs to the turn of its Agent call.
    tasks.see_tool("u2", _call("toolu_inner2", name="Bash", run_in_background=True), "toolu_agent")
    started = tasks.feed(ce.TaskStarted("task-i", "toolu_inner2", "local_bash", "ls", None, None), "u2")
    assert [i.turn_id for i in started.items] == ["u1"]
