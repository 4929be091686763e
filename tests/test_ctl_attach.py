"""`t3d ctl attach`, `threads --watch` and `diff` where their output is interactive: real
`t3d ctl` processes in a real pseudo-terminal (Ctrl-C typed as ^C) against one
`t3d serve` subprocess (replay speed 0); and attach without a terminal."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import trio
from ctl_support import Served, ctl, ctl_argv, dispatch, new_thread, turn_statuses, wait_for
from git_support import make_repo
from pty_support import open_pty
from test_cli import clean_env, start_serve


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_serve(tmp_path_factory.mktemp("attach"), clean_env())
    yield served
    assert served.stop() == 0


async def drain(stream: trio.abc.ReceiveStream | None, into: bytearray) -> None:
    assert stream is not None
    while chunk := await stream.receive_some(65536):
        into += chunk


async def shows(text: bytearray, needle: bytes) -> bool:
    return needle in text


async def pending(daemon: Served, thread_id: str) -> list[dict[str, object]]:
    return list((await dispatch(daemon, "requests.pending", thread_id=thread_id))["requests"])


async def test_attach_follows_turns_and_answers_a_prompt_at_the_terminal(daemon: Served, tmp_path: Path) -> None:
    """Attached to an idle thread, `attach` says it waits; each turn started elsewhere shows
    under its header with its prompt, text and tool calls, and its outcome; turn 2's
    permission prompt is asked at the terminal, and typing y allows it; Ctrl-C then
    detaches with exit status 0, and the thread is as it was."""
    thread_id = await new_thread(daemon, tmp_path)
    with trio.fail_after(120):
        async with open_pty(ctl_argv(daemon, "attach", thread_id[:12]), env=clean_env()) as term:
            await term.expect(f"thread {thread_id} is idle; it has no turns yet")
            await dispatch(daemon, "turn.start", thread_id=thread_id, text="Please READ notes.txt")
            await term.expect(r"── turn 1 · [^\n]*──\n\u203a Please READ notes.txt\nI'll read the file.\n⏺ Read\(notes.txt\)\n")
            await term.expect(r"── turn 1 completed in \d+s ──\n")
            await dispatch(daemon, "turn.start", thread_id=thread_id, text="Now EDIT notes.txt")
            await term.expect(r"── turn 2 · .*\n\u203a Now EDIT notes.txt\n⏺ Edit\(notes.txt\)\nAllow Edit notes.txt\? \[y/N\] ")
            term.type("y\r")
            await term.expect(r"  ⎿  Allowed")
            await term.expect(r"── turn 2 completed in \d+s ──\n")
            term.type("\x03")
            assert await term.wait() == 0, term.text
            await term.expect(f"detached; thread {thread_id} goes on in the daemon")
    snapshot = await dispatch(daemon, "thread.snapshot", thread_id=thread_id)
    assert [t["status"] for t in snapshot["turns"]] == ["completed", "completed"]
    assert [i["status"] for i in snapshot["items"] if i["kind"] == "approval_request"] == ["allowed"]


async def test_ctrl_c_at_a_prompt_detaches_and_leaves_the_turn_waiting(daemon: Served, tmp_path: Path) -> None:
    """Attached while turn 2 waits on its prompt, `attach` shows the turn so far and asks;
    Ctrl-C at the question detaches (exit 0) without answering: the request stays pending,
    the turn waiting, and it goes on once answered elsewhere."""
    thread_id = await new_thread(daemon, tmp_path)
    with trio.fail_after(120):
        assert (await ctl(daemon, "run", "--thread", thread_id, "Please READ notes.txt")).status == 0
        await dispatch(daemon, "turn.start", thread_id=thread_id, text="Now EDIT notes.txt")
        await wait_for(lambda: pending(daemon, thread_id))
        async with open_pty(ctl_argv(daemon, "attach", thread_id), env=clean_env()) as term:
            await term.expect(r"── turn 2 · .*\n\u203a Now EDIT notes.txt\n⏺ Edit\(notes.txt\)\nAllow Edit notes.txt\? \[y/N\] ")
            term.type("\x03")
            assert await term.wait() == 0, term.text
            await term.expect("detached")
        [request] = await pending(daemon, thread_id)
        assert await turn_statuses(daemon, thread_id) == ["completed", "waiting"]
        await dispatch(daemon, "request.respond", request_id=request["id"], decision="deny")

        async def finished() -> bool:
            return await turn_statuses(daemon, thread_id) == ["completed", "completed"]

        await wait_for(finished)


async def test_attach_without_a_terminal_leaves_prompts_and_ends_when_the_thread_goes(daemon: Served, tmp_path: Path) -> None:
    """With stdin not a terminal and no --approve, `attach --json` prints the turn's events
    as JSON lines, leaves its prompt pending (saying so on stderr), and exits 1 when the
    thread is deleted; SIGINT ends another attach with status 0."""
    thread_id = await new_thread(daemon, tmp_path)
    with trio.fail_after(120):
        process = await trio.lowlevel.open_process(
            ctl_argv(daemon, "attach", thread_id, "--json"),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(),
        )  # fmt: skip
        out, err = bytearray(), bytearray()
        async with trio.open_nursery() as nursery:
            for stream, into in ((process.stdout, out), (process.stderr, err)):
                nursery.start_soon(drain, stream, into)
            await wait_for(lambda: shows(err, b"is idle"))
            await dispatch(daemon, "turn.start", thread_id=thread_id, text="Please READ notes.txt")
            await dispatch(daemon, "turn.start", thread_id=thread_id, text="Now EDIT notes.txt")
            await wait_for(lambda: shows(err, b"left pending"))
            await dispatch(daemon, "thread.delete", thread_id=thread_id)
            assert await process.wait() == 1, err.decode()
        said = err.decode()
        assert "Allow Edit notes.txt? (left pending: stdin is not a terminal" in said and "was deleted" in said
        lines = [orjson.loads(line) for line in out.splitlines()]
        assert [line["turn"]["status"] for line in lines if "turn" in line] == ["completed", "waiting"]  # the last as seen
        assert any(line.get("entity", {}).get("kind") == "tool_call" for line in lines)

        other = await new_thread(daemon, tmp_path)
        process = await trio.lowlevel.open_process(
            ctl_argv(daemon, "attach", other), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env()
        )
        assert process.stderr is not None
        seen = b""
        while b"is idle" not in seen:
            seen += await process.stderr.receive_some(4096)
        process.send_signal(signal.SIGINT)
        assert await process.wait() == 0


async def test_threads_watch_redraws_in_place_as_threads_change(daemon: Served, tmp_path: Path) -> None:
    """`threads --watch` on a terminal clears and redraws the table: a thread made after it
    started, in a project that did not exist yet, shows up, then its turn's outcome; Ctrl-C
    ends it with status 0."""
    project = tmp_path / "watched"
    project.mkdir()
    (project / "notes.txt").write_text("hello\n")
    with trio.fail_after(120):
        async with open_pty(ctl_argv(daemon, "threads", "--watch", "--project", "watched"), env=clean_env()) as term:
            await term.expect("Ctrl-C quits")
            thread_id = await new_thread(daemon, project)
            await term.expect(rf"\n{thread_id[:8]}\w*\s+watched\s+replay\s+idle\s+0\s+")
            assert (await ctl(daemon, "run", "--thread", thread_id, "Please READ notes.txt")).status == 0
            await term.expect(rf"\n{thread_id[:8]}\w*\s+watched\s+replay\s+idle\s+#1 completed \d+s ago\s+1\s+")
            assert term.seen.count(b"\x1b[H\x1b[2J") >= 2
            term.type("\x03")
            assert await term.wait() == 0, term.text


async def test_diff_on_a_terminal_is_coloured_and_paged(daemon: Served, tmp_path: Path) -> None:
    """On a terminal `diff` colours the diff and hands it to $PAGER; with --no-pager it
    writes it itself, still coloured."""
    repo = make_repo(tmp_path / "repo")
    thread_id = await new_thread(daemon, repo)
    with trio.fail_after(120):
        for prompt in ("Please READ notes.txt", "Now EDIT notes.txt"):
            assert (await ctl(daemon, "run", "--thread", thread_id, "--approve", "all", prompt)).status == 0
        env = {**clean_env(), "PAGER": "sed 's/^/PAGED:/'"}
        async with open_pty(ctl_argv(daemon, "diff", thread_id, "2"), env=env) as term:
            assert await term.wait() == 0, term.text
        assert "PAGED:+hello, world" in term.text
        assert b"\x1b[32m+hello, world\x1b[0m" in term.seen
        async with open_pty(ctl_argv(daemon, "diff", thread_id, "2", "--no-pager"), env=env) as term:
            assert await term.wait() == 0, term.text
        assert "PAGED" not in term.text and b"\x1b[31m-hello\x1b[0m" in term.seen
