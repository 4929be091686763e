"""`t3d ctl` rendering: what a turn's events print, pinned on event sequences shaped like the wire."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from t3d.ctl.admin import stop_outcome
from t3d.ctl.render import (
    REPLAY_NOTE,
    ApprovalPrompt,
    TurnRenderer,
    count_threads,
    format_duration,
    format_status,
    result_line,
    summarize_input,
    tool_line,
)

THREAD = "th1"
TURN = "tu1"
CWD = "/home/dev/proj"

_sequences = itertools.count(1)


def event(event_kind: str, entity: dict[str, Any]) -> dict[str, Any]:
    """An ``event`` notification's data, as the daemon sends it."""
    return {"kind": event_kind, "sequence": next(_sequences), "entity": entity}


def turn(status: str, *, turn_id: str = TURN, **fields: Any) -> dict[str, Any]:
    entity = {"id": turn_id, "thread_id": THREAD, "ordinal": 1, "status": status}
    return event("turn.updated", entity | fields)


def item(
    item_id: str, kind: str, status: str, *, turn_id: str = TURN, **fields: Any
) -> dict[str, Any]:
    entity = {
        "id": item_id,
        "thread_id": THREAD,
        "turn_id": turn_id,
        "kind": kind,
        "status": status,
        "title": None,
        "text": None,
        "data": None,
    }
    return event("item.updated", entity | fields)


def request(request_id: str, status: str, *, item_id: str, **fields: Any) -> dict[str, Any]:
    entity = {
        "id": request_id,
        "thread_id": THREAD,
        "turn_id": TURN,
        "item_id": item_id,
        "kind": "permission",
        "status": status,
    }
    return event("request.updated", entity | fields)


def tool(status: str, *, result: str | None = None, is_error: bool = False) -> dict[str, Any]:
    data = {
        "tool_use_id": "toolu_1",
        "name": "Read",
        "input": {"file_path": f"{CWD}/notes.txt"},
        "result": result,
        "is_error": is_error,
    }
    return item("i2", "tool_call", status, title="Read", data=data)


def out_of(renderer: TurnRenderer, *events: dict[str, Any]) -> str:
    return "".join(renderer.feed_event(e).out for e in events)


def test_streaming_text_prints_only_the_new_suffix_and_ends_the_line_on_completion() -> None:
    r = TurnRenderer(TURN)
    assert r.feed_event(item("i1", "assistant_message", "streaming", text="Hel")).out == "Hel"
    assert (
        r.feed_event(item("i1", "assistant_message", "streaming", text="Hello, wor")).out
        == "lo, wor"
    )
    assert (
        r.feed_event(item("i1", "assistant_message", "completed", text="Hello, world.")).out
        == "ld.\n"
    )
    # The same update again (a resync, a snapshot) prints nothing.
    assert (
        r.feed_event(item("i1", "assistant_message", "completed", text="Hello, world.")).out == ""
    )


def test_an_older_shorter_text_prints_nothing() -> None:
    r = TurnRenderer(TURN)
    out_of(r, item("i1", "assistant_message", "streaming", text="Hello, world"))
    assert r.feed_event(item("i1", "assistant_message", "streaming", text="Hello")).out == ""


def test_text_that_already_ends_its_line_gets_no_extra_newline() -> None:
    r = TurnRenderer(TURN)
    out = out_of(
        r,
        item("i1", "assistant_message", "streaming", text="Done.\n"),
        item("i1", "assistant_message", "completed", text="Done.\n"),
    )
    assert out == "Done.\n"


def test_a_tool_call_prints_its_line_once_then_its_result_when_completed() -> None:
    r = TurnRenderer(TURN, cwd=CWD)
    assert r.feed_event(tool("running")).out == "⏺ Read(notes.txt)\n"
    assert r.feed_event(tool("running")).out == ""
    done = r.feed_event(tool("completed", result="first line\nsecond line\n"))
    assert done.out == "  ⎿  first line (+1 lines)\n"
    assert r.feed_event(tool("completed", result="first line\nsecond line\n")).out == ""


def test_a_tool_call_first_seen_completed_prints_both_lines() -> None:
    r = TurnRenderer(TURN, cwd=CWD)
    assert r.feed_event(tool("completed", result="ok")).out == "⏺ Read(notes.txt)\n  ⎿  ok\n"


def test_a_failed_tool_call_says_error() -> None:
    r = TurnRenderer(TURN, cwd=CWD)
    out = out_of(r, tool("running"), tool("failed", result="No such file", is_error=True))
    assert out.endswith("  ⎿  Error: No such file\n")


def test_a_codex_command_prints_its_line_then_its_output() -> None:
    """A command item (Codex) shows its command once, then the first line of its output."""
    r = TurnRenderer(TURN, cwd=CWD)
    running = item("c1", "command", "running", title="/bin/bash -lc ls", data={"output": ""})
    assert r.feed_event(running).out == "⏺ /bin/bash -lc ls\n"
    done = item("c1", "command", "completed", title="/bin/bash -lc ls", data={"output": "README.md\nnotes.txt\n"})
    assert r.feed_event(done).out == "  ⎿  README.md (+1 lines)\n"
    declined = item("c2", "command", "failed", title="rm -rf x", data={"output": ""})
    assert r.feed_event(declined).out == "⏺ rm -rf x\n  ⎿  failed\n"


def test_a_tool_line_ends_the_streaming_text_line_first() -> None:
    r = TurnRenderer(TURN, cwd=CWD)
    out = out_of(
        r, item("i1", "assistant_message", "streaming", text="Let me look"), tool("running")
    )
    assert out == "Let me look\n⏺ Read(notes.txt)\n"


def test_an_approval_is_asked_once_then_settled_and_its_decision_shown() -> None:
    r = TurnRenderer(TURN, cwd=CWD)
    data = {
        "tool_name": "Edit",
        "input": {"file_path": f"{CWD}/notes.txt"},
        "tool_use_id": "toolu_2",
    }
    r.feed_event(
        item("i3", "approval_request", "pending", title="Edit", text="Edit a file", data=data)
    )
    asked = r.feed_event(request("r1", "pending", item_id="i3"))
    assert asked.asks == [ApprovalPrompt("r1", "Allow Edit notes.txt?")]
    assert asked.asks[0].prompt == "Allow Edit notes.txt? [y/N] "
    assert r.feed_event(request("r1", "pending", item_id="i3")).asks == []

    resolved = r.feed_event(request("r1", "resolved", item_id="i3", decision="allow"))
    assert resolved.settled == ["r1"]
    assert resolved.asks == []
    allowed = r.feed_event(item("i3", "approval_request", "allowed", title="Edit", data=data))
    assert allowed.out == "  ⎿  Allowed\n"
    assert (
        r.feed_event(item("i3", "approval_request", "allowed", title="Edit", data=data)).out == ""
    )


def test_an_approval_question_ends_the_streaming_text_line() -> None:
    r = TurnRenderer(TURN)
    out_of(r, item("i1", "assistant_message", "streaming", text="I will edit"))
    asked = r.feed_event(
        request(
            "r1",
            "pending",
            item_id="i9",
            data={"tool_name": "Bash", "input": {"command": "ls -la"}},
        )
    )
    assert asked.out == "\n"
    # Without its approval item the question comes from the request's own data.
    assert asked.asks == [ApprovalPrompt("r1", "Allow Bash ls -la?")]


def test_a_request_that_was_never_asked_is_not_settled() -> None:
    r = TurnRenderer(TURN)
    assert r.feed_event(request("r1", "expired", item_id="i3")).settled == []


def test_a_failed_turn_ends_the_run_with_its_error_on_stderr() -> None:
    r = TurnRenderer(TURN)
    out_of(
        r,
        turn("running"),
        item("e1", "error", "completed", text="Not logged in · Please run /login"),
    )
    assert not r.done
    r.feed_event(turn("failed", error="Not logged in · Please run /login", reason="provider_error"))
    assert r.done
    assert r.exit_code == 1
    final = r.finish()
    assert final.err == "error: Not logged in · Please run /login\n"
    assert final.out == ""


def test_an_interrupted_turn_without_error_text_reports_its_status() -> None:
    r = TurnRenderer(TURN)
    out_of(r, item("i1", "assistant_message", "streaming", text="Half a sen"), turn("interrupted"))
    assert r.done
    final = r.finish()
    assert final.out == "\n"  # the open line is ended
    assert final.err == "error: interrupted\n"
    assert r.exit_code == 1


def test_a_completed_turn_exits_zero_quietly() -> None:
    r = TurnRenderer(TURN)
    out_of(r, turn("running"), turn("completed", cost_usd=0.01))
    assert r.done
    assert r.exit_code == 0
    assert r.finish().err == ""


def test_a_terminal_turn_is_not_reopened_by_an_older_row() -> None:
    r = TurnRenderer(TURN)
    out_of(r, turn("completed"), turn("running"))
    assert r.done
    assert r.exit_code == 0


def test_a_queued_turn_says_so_once_on_stderr() -> None:
    """A turn queued behind its thread's open turn says so once, and when it starts."""
    r = TurnRenderer(TURN)
    first = r.feed_event(turn("queued", queue_reason="thread_busy"))
    assert first.err == "turn queued behind the thread's open turn; it starts when that one ends\n"
    assert r.feed_event(turn("queued", queue_reason="thread_busy")).err == ""


def test_a_held_turn_says_what_holds_it() -> None:
    """A turn held by the daemon says why, by its queue_reason: memory pressure is named as
    such (not "when the thread is free"), and a new reason is noted once more."""
    r = TurnRenderer(TURN)
    held = r.feed_event(turn("queued", queue_reason="memory_pressure")).err
    assert held.startswith("turn held: memory pressure is severe") and "thread is free" not in held
    assert r.feed_event(turn("queued", queue_reason="memory_pressure")).err == ""
    assert "saturated" in r.feed_event(turn("queued", queue_reason="loop_saturated")).err
    assert "--max-active-turns" in TurnRenderer(TURN).feed_event(turn("queued", queue_reason="max_active_turns")).err
    assert "(something_new)" in TurnRenderer(TURN).feed_event(turn("queued", queue_reason="something_new")).err


def test_an_interrupt_says_whose_it_was() -> None:
    """A turn interrupted on request ends "interrupted (Ctrl-C here)" when this run sent the
    interrupt, and "interrupted (turn.interrupt from another client)" when it did not; other
    interrupted ends keep the daemon's words."""
    ended = {"reason": "interrupt", "error": "interrupted by the user"}
    r = TurnRenderer(TURN)
    r.feed_event(turn("interrupted", **ended))
    assert r.finish().err == "error: interrupted (turn.interrupt from another client)\n"
    r = TurnRenderer(TURN)
    r.feed_event(turn("interrupted", **ended))
    assert r.finish(interrupted_here=True).err == "error: interrupted (Ctrl-C here)\n"
    r = TurnRenderer(TURN)
    r.feed_event(turn("interrupted", reason="server_restart", error="the daemon restarted"))
    assert r.finish().err == "error: the daemon restarted\n"


def test_ctl_stop_says_what_the_daemon_did() -> None:
    """`ctl stop` reports what thread.force_stop and turn.interrupt answered: a killed agent
    with or without a running turn, a turn cancelled before its agent, queued turns cancelled."""
    killed = stop_outcome({"pid": 42, "exit_code": -15, "turn_id": "t1"}, force=True)
    assert killed == "killed its agent (process group 42, ended by SIGTERM); turn t1 ended cancelled (force_stop)"
    idle = stop_outcome({"pid": 42, "exit_code": 0, "turn_id": None}, force=True)
    assert idle == "killed its agent (process group 42, exit status 0); it was idle: no turn was running"
    early = stop_outcome({"pid": None, "exit_code": None, "turn_id": "t1"}, force=True)
    assert early == "turn t1 was cancelled before its agent started (force_stop)"
    assert stop_outcome({"turn_id": "t1", "status": "running"}, force=False) == "asked turn t1 to stop; it ends interrupted"
    assert "queued turns were cancelled" in stop_outcome({"turn_id": "t2", "status": "cancelled"}, force=False)


def test_entities_of_other_turns_are_ignored() -> None:
    r = TurnRenderer(TURN)
    other = "tu0"
    assert (
        out_of(
            r,
            item("x1", "assistant_message", "completed", text="old answer", turn_id=other),
            turn("completed", turn_id=other),
            event("thread.updated", {"id": THREAD, "status": "running"}),
        )
        == ""
    )
    assert not r.done


def test_a_snapshot_after_a_resync_prints_only_what_is_new_and_the_turn_last() -> None:
    r = TurnRenderer(TURN, cwd=CWD)
    out_of(r, item("i1", "assistant_message", "streaming", text="Reading"), tool("running"))
    snapshot = {
        "thread": {"id": THREAD, "status": "idle"},
        "turns": [
            {"id": TURN, "thread_id": THREAD, "status": "completed"},
            {"id": "tu0", "thread_id": THREAD, "status": "completed"},
        ],
        "items": [
            tool("completed", result="ok")["entity"] | {"ordinal": 2},
            item("i1", "assistant_message", "completed", text="Reading the notes")["entity"]
            | {"ordinal": 1},
            item("i4", "assistant_message", "completed", text="All good.")["entity"]
            | {"ordinal": 3},
        ],
        "requests": [],
    }
    rendered = r.feed_snapshot(snapshot)
    assert rendered.out == " the notes\n  ⎿  ok\nAll good.\n"
    assert r.done


def test_json_lines_print_each_event_of_the_turn_and_a_final_turn_line() -> None:
    r = TurnRenderer(TURN, json_lines=True)
    streaming = item("i1", "assistant_message", "streaming", text="Hi")
    completed = turn("completed")
    lines = [r.feed_event(streaming).out, r.feed_event(completed).out]
    assert [orjson.loads(line) for line in lines] == [streaming, completed]
    assert r.feed_event(item("x", "assistant_message", "completed", turn_id="tu0")).out == ""
    final = r.finish()
    assert orjson.loads(final.out)["turn"]["status"] == "completed"
    assert final.err == ""


def test_json_lines_print_snapshot_rows_only_when_they_changed() -> None:
    r = TurnRenderer(TURN, json_lines=True)
    streaming = item("i1", "assistant_message", "streaming", text="Hi")
    r.feed_event(streaming)
    same = {"items": [streaming["entity"]], "turns": [], "requests": []}
    assert r.feed_snapshot(same).out == ""
    grown = {"items": [streaming["entity"] | {"text": "Hi there"}]}
    line = orjson.loads(r.feed_snapshot(grown).out)
    assert line["kind"] == "item.updated"
    assert line["snapshot"] is True
    assert line["entity"]["text"] == "Hi there"


def test_finish_of_an_abandoned_turn_reports_no_error_but_settles_open_questions() -> None:
    r = TurnRenderer(TURN)
    r.feed_event(request("r1", "pending", item_id="i3"))
    final = r.finish(abandoned=True)
    assert final.err == ""
    assert final.settled == ["r1"]


def test_tool_summaries_are_short_and_on_one_line() -> None:
    assert tool_line("Bash", {"command": "ls\n-la", "description": "list"}) == "⏺ Bash(ls -la)"
    long = summarize_input({"command": "x" * 200})
    assert len(long) == 80
    assert long.endswith("…")
    assert summarize_input({"a": 1, "b": "two"}) == "a: 1, b: two"
    assert summarize_input(None) == ""
    assert result_line(None, failed=False) == "  ⎿  done"


def test_format_duration_uses_the_two_largest_units() -> None:
    assert format_duration(12) == "12s"
    assert format_duration(250) == "4m 10s"
    assert format_duration(7_500) == "2h 5m"
    assert format_duration(3 * 86_400 + 4 * 3_600 + 5) == "3d 4h"


def test_status_counts_live_threads_and_archived_ones_apart() -> None:
    threads = [
        {"id": "a", "status": "running"},
        {"id": "b", "status": "waiting"},
        {"id": "c", "status": "idle"},
        {"id": "e", "status": "queued", "queue_reason": "max_active_turns"},
        {"id": "d", "status": "idle", "archived_at": 5.0},
    ]
    counts = count_threads(threads)
    assert counts == {
        "threads": 4,
        "running_threads": 1,
        "waiting_threads": 1,
        "queued_threads": 1,
        "archived_threads": 1,
    }
    text = format_status(
        "http://127.0.0.1:3774", {"status": "ok", "version": "0.1.0", "uptime_s": 61}, 2, counts
    )
    assert text.splitlines()[0] == "t3d 0.1.0 at http://127.0.0.1:3774: ok, up 1m 1s"
    assert "4 (1 running, 1 waiting for approval, 1 held, 1 archived)" in text
    degraded = {
        "status": "degraded",
        "reasons": ["the event loop is saturated; new turns are held back"],
        "admission": {"state": "saturated", "held_turns": 3},
    }
    lines = format_status("http://x", degraded, 0, counts).splitlines()
    assert lines[-2:] == [
        "          the event loop is saturated; new turns are held back",
        "admission saturated: 3 turn(s) held",
    ]


def test_a_replay_says_once_that_it_plays_a_recording_and_labels_what_it_plays() -> None:
    """When the snapshot's thread is a replay, one note says the prompt and the answers do not
    change what it plays (once, also across a resync's second snapshot); tool results are
    labelled "recorded:" and an answered prompt says the replay goes on either way. Paths are
    shortened against the thread's project, found through ``project_dirs``."""
    r = TurnRenderer(TURN, project_dirs={"p1": CWD})
    thread = {"id": THREAD, "project_id": "p1", "provider": "replay", "worktree_path": None}
    first = r.feed_snapshot({"thread": thread, "turns": [], "items": [], "requests": []})
    assert first.err == REPLAY_NOTE + "\n"
    assert "ignores your prompt" in REPLAY_NOTE
    assert r.feed_snapshot({"thread": thread, "turns": [], "items": [], "requests": []}).err == ""
    assert out_of(r, tool("running")) == "⏺ Read(notes.txt)\n"
    assert out_of(r, tool("completed", result="1 hello")) == "  ⎿  recorded: 1 hello\n"
    asked = item("a1", "approval_request", "denied", title="Edit")
    assert out_of(r, asked) == "  ⎿  Denied (the replay goes on as recorded either way)\n"


def test_a_thread_of_another_provider_gets_no_replay_note() -> None:
    """A claude thread's snapshot adds no note, and its results carry no "recorded:" label."""
    r = TurnRenderer(TURN, cwd=CWD)
    thread = {"id": THREAD, "project_id": "p1", "provider": "claude"}
    assert r.feed_snapshot({"thread": thread, "turns": [], "items": [], "requests": []}).err == ""
    assert out_of(r, tool("completed", result="1 hello")) == "⏺ Read(notes.txt)\n  ⎿  1 hello\n"
