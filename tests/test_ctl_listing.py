"""The pure parts of `t3d ctl`'s thread commands: the threads table and its filters, short
ids, titles, the shell followed by --watch, turn after turn for attach and log, the
daemon's hints as ctl commands, coloured diffs and the completion tree."""

from __future__ import annotations

import argparse
from typing import Any

from t3d.ctl.completion import bash_script, command_tree, zsh_script
from t3d.ctl.hints import ctl_hints
from t3d.ctl.history import ThreadFollower, format_log, turn_outcome
from t3d.ctl.listing import (
    ShellState,
    ThreadFilter,
    TurnsSeen,
    format_projects,
    format_threads,
    match_id,
    project_rows,
    short_ids,
    shorten_title,
    title_from_prompt,
    turns_seen,
)
from t3d.ctl.render import color_diff

NOW = 10_000.0
PROJECTS = {"p1": {"id": "p1", "path": "/home/dev/shop", "title": "shop", "created_at": 1.0}}


def thread(ident: str, status: str = "idle", created: float = 1.0, **fields: Any) -> dict[str, Any]:
    return {
        "id": ident, "project_id": "p1", "title": "t", "provider": "replay", "status": status,
        "created_at": created, "archived_at": None, "queue_reason": None, "turn_count": 1, "item_count": 2,
        **fields,
    }  # fmt: skip


def turn(ordinal: int, status: str, **fields: Any) -> dict[str, Any]:
    return {"id": f"u{ordinal}", "thread_id": "th", "ordinal": ordinal, "status": status, "requested_at": NOW - 100, **fields}


def test_short_ids_are_the_shortest_unique_prefixes_of_at_least_eight() -> None:
    """Ids are cut to 8 characters unless another id shares those: then one past the
    shared part; an id that is another's prefix is shown whole."""
    ids = ["abcdef0123456789", "abcdef0199999999", "ffff0000aaaa", "ffff"]
    assert short_ids(ids) == {
        "abcdef0123456789": "abcdef012",
        "abcdef0199999999": "abcdef019",
        "ffff0000aaaa": "ffff0000",
        "ffff": "ffff",
    }


def test_a_prefix_names_one_thread_or_says_which_it_could_be() -> None:
    """An exact id wins over longer ids it is a prefix of; a unique prefix names its id;
    a shared prefix gives the candidates; an unknown one nothing."""
    ids = ["abc", "abcd1", "abcd2", "xyz9"]
    assert match_id("abc", ids) == ("abc", [])
    assert match_id("xy", ids) == ("xyz9", [])
    assert match_id("abcd", ids) == (None, ["abcd1", "abcd2"])
    assert match_id("q", ids) == (None, [])


def test_titles_that_are_prompts_are_cut_to_their_first_sentence_or_a_word() -> None:
    """A title that fits is left alone; one too long is cut at its first sentence when that
    is long enough, else at a word boundary with an ellipsis, never past the limit."""
    assert shorten_title("Please READ notes.txt", 40) == "Please READ notes.txt"
    prompt = "Fix the failing test in tests/test_x.py. Then run the whole suite and tell me what else fails."
    assert shorten_title(prompt, 50) == "Fix the failing test in tests/test_x.py…"
    assert shorten_title("Why does the build fail on arm64? It worked last week on x86.", 40) == "Why does the build fail on arm64?…"
    cut = shorten_title("refactor the session driver so that interrupts escalate properly everywhere", 30)
    assert cut == "refactor the session driver…" and len(cut) <= 30
    assert len(shorten_title("x" * 100, 20)) == 20
    assert title_from_prompt("\n  Review this diff\nwith care: it is long") == "Review this diff"


def test_the_threads_table_shows_project_status_running_time_and_last_turn() -> None:
    """Each row: short id, project name, provider, status with the queue reason, how long the
    open turn has run, the last finished turn's outcome and age, turns, title; oldest first,
    titles aligned."""
    threads = [
        thread("bbbbbbbbbbbb", "queued", created=2.0, queue_reason="memory_pressure", title="second"),
        thread("aaaaaaaaaaaa", "running", created=1.0, turn_count=3, title="first"),
    ]
    seen = {
        "aaaaaaaaaaaa": TurnsSeen(
            last=turn(2, "failed", completed_at=NOW - 3_700), open=turn(3, "running", started_at=NOW - 75)
        ),
        "bbbbbbbbbbbb": TurnsSeen(open=turn(1, "queued")),
    }
    lines = format_threads(threads, PROJECTS, seen, NOW).splitlines()
    assert lines[0].split() == ["ID", "PROJECT", "PROVIDER", "STATUS", "FOR", "LAST", "TURN", "TURNS", "TITLE"]
    assert lines[1].split() == ["aaaaaaaa", "shop", "replay", "running", "1m", "15s", "#2", "failed", "1h", "1m", "ago", "3", "first"]
    assert lines[2].split() == ["bbbbbbbb", "shop", "replay", "queued", "(memory_pressure)", "1m", "40s", "1", "second"]
    assert lines[1].index("first") == lines[2].index("second") == lines[0].index("TITLE")


def test_titles_fit_the_terminal_width() -> None:
    """Given a terminal's width, each line fits it (the title is what gives way)."""
    long = thread("aaaaaaaaaaaa", title="a long title " * 20)
    for line in format_threads([long], PROJECTS, {}, NOW, width=90).splitlines():
        assert len(line) <= 90, line


def test_filters_by_project_status_provider_and_waiting() -> None:
    """Archived threads show only with --all or --status archived; --waiting keeps threads
    waiting for an answer or held; filters combine."""
    rows = [
        thread("a", "idle"), thread("b", "waiting"), thread("c", "queued"),
        thread("d", "idle", archived_at=5.0), thread("e", "running", provider="claude", project_id="p2"),
    ]  # fmt: skip

    def ids(keep: ThreadFilter) -> list[str]:
        return [t["id"] for t in rows if keep(t)]

    assert ids(ThreadFilter()) == ["a", "b", "c", "e"]
    assert ids(ThreadFilter(archived=True)) == ["a", "b", "c", "d", "e"]
    assert ids(ThreadFilter(statuses=frozenset({"archived"}))) == ["d"]
    assert ids(ThreadFilter(waiting=True)) == ["b", "c"]
    assert ids(ThreadFilter(providers=frozenset({"claude"}))) == ["e"]
    assert ids(ThreadFilter(projects=frozenset({"p1"}), statuses=frozenset({"idle", "running"}))) == ["a"]


def test_turns_seen_picks_the_last_finished_and_the_first_open_turn() -> None:
    """Among a page's turns: the highest finished ordinal, the lowest open one."""
    seen = turns_seen([turn(4, "queued"), turn(2, "completed"), turn(3, "running"), turn(1, "failed")])
    assert (seen.last or {})["ordinal"] == 2 and (seen.open or {})["ordinal"] == 3
    assert turns_seen([]) == TurnsSeen()


def test_projects_count_their_threads() -> None:
    """`ctl projects`: live, active (running, waiting, queued) and archived threads per project."""
    rows = project_rows(list(PROJECTS.values()), [thread("a", "running"), thread("b"), thread("c", archived_at=1.0)])
    assert (rows[0]["threads"], rows[0]["active"], rows[0]["archived"]) == (2, 1, 1)
    assert format_projects(rows).splitlines()[1].split() == ["p1", "2", "1", "1", "/home/dev/shop"]


def test_the_followed_shell_takes_a_base_then_events_and_notes_what_moved() -> None:
    """Chunks make a base at snapshot.end; shell.updated and shell.removed change it and
    name the moved thread; a resync's fresh base replaces it whole."""
    shell = ShellState()
    assert not shell.feed("snapshot.chunk", {"projects": [PROJECTS["p1"]], "threads": [thread("a")]})
    assert not shell.based
    assert shell.feed("snapshot.end", {"sequence": 3})
    assert list(shell.threads) == ["a"] and shell.changed == {"a"}
    shell.changed.clear()
    assert shell.feed("event", {"kind": "shell.updated", "entity": thread("b", "running")})
    assert shell.changed == {"b"}
    assert shell.feed("event", {"kind": "shell.removed", "entity": {"id": "a"}})
    assert list(shell.threads) == ["b"]
    shell.feed("resync", {"reason": "slow"})
    shell.feed("snapshot.chunk", {"projects": [], "threads": [thread("c")]})
    shell.feed("snapshot.end", {})
    assert list(shell.threads) == ["c"]


def _item(item_id: str, turn_id: str, kind: str, status: str, **fields: Any) -> dict[str, Any]:
    return {"id": item_id, "thread_id": "th", "turn_id": turn_id, "kind": kind, "status": status, "title": None, "text": None, "data": None, **fields}


def _event(kind: str, entity: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "sequence": 1, "entity": entity}


def test_the_follower_shows_the_open_turn_then_each_later_one() -> None:
    """Attached to a thread with a finished turn 1 and a running turn 2: turn 1 is not
    replayed; turn 2's prompt and text so far show under its header; its end prints its
    outcome; turn 3, started later, gets its own header; the thread's deletion ends it."""
    follower = ThreadFollower("th", project_dirs={"p1": "/home/dev/shop"})
    base = {
        "thread": thread("th"),
        "turns": [turn(1, "completed"), turn(2, "running", started_at=NOW - 5)],
        "items": [
            _item("old", "u1", "assistant_message", "completed", text="old text"),
            _item("p", "u2", "user_message", "completed", text="Now EDIT it"),
            _item("m", "u2", "assistant_message", "running", text="Editing"),
        ],
        "requests": [],
    }
    shown = follower.feed_snapshot(base, NOW)
    assert "old text" not in shown.out
    assert shown.out.splitlines()[:2] == [shown.out.splitlines()[0], "\u203a Now EDIT it"]
    assert shown.out.startswith("── turn 2 · ") and shown.out.endswith("Editing")
    more = follower.feed_event(_event("item.updated", _item("m", "u2", "assistant_message", "completed", text="Editing done")), NOW)
    assert more.out == " done\n"
    ended = follower.feed_event(_event("turn.updated", turn(2, "completed", started_at=NOW - 5, completed_at=NOW)), NOW)
    assert ended.out == "── turn 2 completed in 5s ──\n"
    assert follower.following is None
    third = follower.feed_event(_event("turn.updated", turn(3, "starting")), NOW)
    assert third.out.startswith("── turn 3 · ")
    gone = follower.feed_event(_event("thread.deleted", {"id": "th"}), NOW)
    assert follower.gone and "was deleted" in gone.err


def test_the_follower_of_an_idle_thread_says_so_and_asks_a_new_turns_questions() -> None:
    """An idle thread is reported idle with its last turn; a later turn's pending request
    becomes a question; its settling withdraws it."""
    follower = ThreadFollower("th")
    idle = follower.feed_snapshot({"thread": thread("th"), "turns": [turn(1, "completed", completed_at=NOW - 60)], "items": [], "requests": []}, NOW)
    assert "is idle; its last turn, #1, completed 1m 0s ago" in idle.err
    follower.feed_event(_event("turn.updated", turn(2, "running")), NOW)
    tool = {"name": "Edit", "input": {"file_path": "notes.txt"}}
    follower.feed_event(_event("item.updated", _item("ap", "u2", "approval_request", "pending", title="Edit", data=tool)), NOW)
    request = {"id": "r1", "thread_id": "th", "turn_id": "u2", "item_id": "ap", "kind": "permission", "status": "pending"}
    asked = follower.feed_event(_event("request.updated", request), NOW)
    assert [a.question for a in asked.asks] == ["Allow Edit notes.txt?"]
    settled = follower.feed_event(_event("request.updated", {**request, "status": "resolved"}), NOW)
    assert settled.settled == ["r1"]


def test_the_log_prints_turns_oldest_first_with_prompts_and_outcomes() -> None:
    """Each turn: header, prompt, what was said, and how it ended with the error of a
    failed one; a reverted turn says so; a running turn says how to follow it."""
    turns = [
        turn(2, "failed", started_at=NOW - 30, completed_at=NOW - 28, error="Not logged in", reverted_at=NOW),
        turn(1, "completed", started_at=NOW - 60, completed_at=NOW - 50),
        turn(3, "running", started_at=NOW - 10),
    ]
    items = [
        _item("a", "u1", "user_message", "completed", text="hello"),
        _item("b", "u1", "assistant_message", "completed", text="Hi."),
        _item("c", "u2", "user_message", "completed", text="again"),
    ]
    text = format_log(thread("th"), turns, items, [], NOW)
    chunks = text.split("\n\n")
    assert [c.splitlines()[0].split(" · ")[0] for c in chunks] == ["── turn 1", "── turn 2", "── turn 3"]
    assert chunks[0].splitlines()[1:] == ["\u203a hello", "Hi.", "── turn 1 completed in 10s ──"]
    assert chunks[1].splitlines()[-1] == "── turn 2 failed after 2s: Not logged in · reverted ──"
    assert chunks[2].splitlines()[-1] == "── turn 3 running for 10s; follow it with `t3d ctl attach th` ──"
    assert turn_outcome(turn(4, "interrupted", reason="interrupt"), NOW) == "── turn 4 interrupted: interrupted (turn.interrupt from another client) ──"


def test_the_daemons_hints_become_ctl_commands() -> None:
    """Known API hints name the ctl command (with the thread's id where the message has it);
    a hint whose command this ctl lacks, and every other word, stay as the daemon said."""
    missing = "thread.delete failed: thread 'abc' does not exist; list threads with GET /api/shell (code -32001)"
    assert ctl_hints(missing) == "thread.delete failed: thread 'abc' does not exist; list threads with `t3d ctl threads` (code -32001)"
    busy = "thread 'abc' has a turn running or queued; interrupt it or wait for it to end before you revert its files"
    assert ctl_hints(busy) == (
        "thread 'abc' has a turn running or queued; stop it with `t3d ctl stop abc` or wait for it to end before you revert its files"
    )
    archived = "thread 'abc' is archived; start a new thread"
    assert "`t3d ctl unarchive abc`" in ctl_hints(archived, {"unarchive", "new"})
    assert ctl_hints(archived, {"new"}) == "thread 'abc' is archived; start a new thread with `t3d ctl new`"
    assert ctl_hints("request 'r' does not exist; list them with requests.pending", {"threads"}).endswith("requests.pending")
    dirty = "pass force: true to delete them with the worktree, or remove_worktree: false to keep it"
    assert "--force" in ctl_hints(dirty) and "force: true" not in ctl_hints(dirty)
    job = "a db.vacuum job (j1) is running; one runs at a time: follow it with db.job, or stop it with db.cancel"
    assert ctl_hints(job).endswith("one runs at a time: wait for it to end (the `t3d ctl db` command that started it shows its progress; Ctrl-C there stops it), then run this again")
    assert ctl_hints("unknown method 'thread.unarchive'; server.hello lists the methods").startswith(
        "the daemon does not offer thread.unarchive; it is older"
    )
    assert ctl_hints("nothing to see here") == "nothing to see here"


def test_a_diff_is_coloured_as_git_colours_it() -> None:
    """Headers bold, hunk lines cyan, additions green, removals red, context plain; the text
    without its colour codes is the diff unchanged."""
    diff = "diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n same\n"
    coloured = color_diff(diff)
    lines = coloured.splitlines()
    assert lines[0] == "\x1b[1mdiff --git a/x b/x\x1b[0m" and lines[3] == "\x1b[1m+++ b/x\x1b[0m"
    assert lines[4].startswith("\x1b[36m@@") and lines[5] == "\x1b[31m-old\x1b[0m" and lines[6] == "\x1b[32m+new\x1b[0m"
    assert lines[7] == " same"
    assert coloured.replace("\x1b[1m", "").replace("\x1b[36m", "").replace("\x1b[31m", "").replace("\x1b[32m", "").replace("\x1b[0m", "") == diff


def test_the_completion_tree_follows_the_parser() -> None:
    """Subcommands, flags with their value kinds and positionals come from argparse; both
    scripts name every subcommand of every level."""
    parser = argparse.ArgumentParser(prog="t3d")
    commands = parser.add_subparsers()
    ctl = commands.add_parser("ctl", help="administer")
    sub = ctl.add_subparsers()
    attach = sub.add_parser("attach", help="follow a thread")
    attach.add_argument("thread")
    attach.add_argument("--approve", choices=("all", "none"))
    attach.add_argument("--state-dir")
    attach.add_argument("--quiet", action="store_true")
    tree = command_tree(parser)
    node = tree["commands"]["ctl"]["commands"]["attach"]
    assert node["options"]["--approve"] == ["all", "none"]
    assert node["options"]["--state-dir"] == "@dir" and node["options"]["--quiet"] is None
    assert node["positionals"] == [{"dest": "thread", "choices": None}] and node["help"] == "follow a thread"
    for script in (bash_script(tree), zsh_script(tree)):
        assert "'ctl attach') echo '--approve --help --quiet --state-dir -h';;" in script
        assert "'ctl attach') echo @thread;;" in script
