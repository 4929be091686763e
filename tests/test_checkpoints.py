"""Per-turn checkpoints through the daemon: real repositories, the real spawner, the fake CLI
applying its recorded edits."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import apsw
import orjson
import trio
import trio.testing
from git_support import exists, git, make_repo, real, repo_state
from harness import RpcFailed, new_thread, open_client, run_turn, start_daemon, wait_until

from t3d.domain.codec import converter
from t3d.domain.events import CaptureCheckpoint


async def call_error(client: Any, method: str, **params: Any) -> dict[str, Any]:
    """Call ``method`` expecting an error reply; return the error's code and message."""
    try:
        result = await client.call(method, **params)
    except RpcFailed as exc:
        return {"code": exc.code, "message": exc.message}
    raise AssertionError(f"{method} succeeded: {result}")


async def _checkpoint(client: Any, turn_id: str) -> dict[str, Any]:
    """The turn's checkpoint item, once recorded (captures run after the terminal event)."""
    event = await client.wait_event(
        lambda d: d["kind"] == "item.updated" and d["entity"]["turn_id"] == turn_id and d["entity"]["kind"] == "checkpoint"
    )
    return dict(event["entity"])


async def test_an_edit_turn_gets_a_checkpoint_without_touching_head_index_or_branches(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Turn 2 edits notes.txt: its checkpoint lists notes.txt +1 -1; HEAD, the index, status and
    branches are unchanged; an ignored file is never captured; diff 1..2 shows the edit."""
    project = make_repo(tmp_path / "repo")
    before = repo_state(project)
    (project / "debug.log").write_text("ignored\n")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            first = await run_turn(client, thread_id, "Please READ notes.txt")
            cp1 = await _checkpoint(client, first.turn["id"])
            assert cp1["data"]["status"] == "ok" and cp1["data"]["files"] == []
            second = await run_turn(client, thread_id, "Now EDIT notes.txt")
            assert second.turn["status"] == "completed"
            cp2 = await _checkpoint(client, second.turn["id"])
            data = cp2["data"]
            assert data["status"] == "ok", data
            assert data["files"] == [{"path": "notes.txt", "additions": 1, "deletions": 1}]
            assert (project / "notes.txt").read_text() == "hello, world\n"
            ref = data["ref"]
            tree = git(project, "ls-tree", "-r", "--name-only", ref).splitlines()
            assert "notes.txt" in tree and "debug.log" not in tree, "ignored files are never captured"
            diff = await client.call("checkpoint.diff", thread_id=thread_id, from_ordinal=1, to_ordinal=2)
            assert "-hello\n+hello, world\n" in diff["diff"] and diff["next_offset"] is None
        daemon.stop()
    head, _, index, branches = repo_state(project)
    assert (head, index, branches) == (before[0], before[2], before[3])
    assert git(project, "diff", "--cached", "--name-only") == "", "nothing was staged"


async def test_revert_restores_files_deletes_later_ones_and_marks_later_turns(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Revert to checkpoint 1 after turn 2 edited notes.txt and a file was created: notes.txt is
    restored, the new file deleted, the ignored file kept, turn 2 marked reverted; the next
    turn's checkpoint counts from the restored state."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            first = await run_turn(client, thread_id, "Please READ notes.txt")
            await _checkpoint(client, first.turn["id"])
            (project / "created.txt").write_text("new\n")
            (project / "sub").mkdir()
            (project / "sub" / "deep.bin").write_bytes(b"\0\1\2")
            (project / "keep.log").write_text("ignored\n")
            second = await run_turn(client, thread_id, "Now EDIT notes.txt")
            cp2 = await _checkpoint(client, second.turn["id"])
            paths = {f["path"] for f in cp2["data"]["files"]}
            assert paths == {"notes.txt", "created.txt", "sub/deep.bin"}
            binary = next(f for f in cp2["data"]["files"] if f["path"] == "sub/deep.bin")
            assert binary["additions"] is None and binary["binary"] is True
            reverted = await client.call("checkpoint.revert", thread_id=thread_id, ordinal=1)
            assert reverted["deleted"] == 2 and reverted["restored"] == 1
            assert (project / "notes.txt").read_text() == "hello\n"
            assert not (project / "created.txt").exists() and not (project / "sub").exists()
            assert (project / "keep.log").read_text() == "ignored\n", "ignored files are untouched"
            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
            turns = {t["ordinal"]: t for t in snapshot["turns"]}
            assert turns[2]["reverted_at"] is not None and turns[1]["reverted_at"] is None
            third = await run_turn(client, thread_id, "Now run BASH to create a file")
            cp3 = await _checkpoint(client, third.turn["id"])
            assert cp3["data"]["files"] == [] and cp3["data"]["base_ref"].endswith("/3-base"), cp3["data"]
        daemon.stop()


async def test_a_worktree_thread_is_checkpointed_in_its_worktree_while_another_runs_in_the_root(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Two threads of one repository, one in a new worktree and one in the root, turn at the
    same time: each checkpoint is taken in its own directory, and only the worktree's
    notes.txt is edited by the worktree thread. Deleting the worktree thread refuses while
    it is dirty, then with force removes the worktree and its checkpoint refs only."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(90):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as a, open_client(daemon) as b:
            root_thread = await new_thread(a, project)
            wt_thread = await new_thread(b, project, workspace={"worktree": {"branch": "feature/x"}})
            wt = (await b.call("thread.snapshot", thread_id=wt_thread))["thread"]
            worktree = Path(wt["worktree_path"])
            assert wt["branch"] == "feature/x" and worktree.is_relative_to(tmp_path / "state")
            assert git(project, "rev-parse", "feature/x") == git(project, "rev-parse", "HEAD")
            await run_turn(a, root_thread, "Please READ notes.txt")
            await run_turn(b, wt_thread, "Please READ notes.txt")
            outcomes: dict[str, Any] = {}

            async def turn(client: Any, thread_id: str) -> None:
                outcomes[thread_id] = await run_turn(client, thread_id, "Now EDIT notes.txt")

            async with trio.open_nursery() as both:
                both.start_soon(turn, a, root_thread)
                both.start_soon(turn, b, wt_thread)
            cp_root = await _checkpoint(a, outcomes[root_thread].turn["id"])
            cp_wt = await _checkpoint(b, outcomes[wt_thread].turn["id"])
            assert cp_root["data"]["worktree"] == real(project)
            assert cp_wt["data"]["worktree"] == real(worktree)
            assert cp_wt["data"]["files"] == [{"path": "notes.txt", "additions": 1, "deletions": 1}]
            assert (worktree / "notes.txt").read_text() == "hello, world\n"
            # The worktree now has an uncommitted edit: deleting the thread refuses without force.
            refused = await call_error(b, "thread.delete", thread_id=wt_thread)
            assert "uncommitted changes" in refused["message"] and exists(worktree)
            assert git(project, "for-each-ref", f"refs/t3d/checkpoints/{wt_thread}/")
            deleted = await b.call("thread.delete", thread_id=wt_thread, force=True)
            assert deleted["worktree"]["removed"] is True and not exists(worktree)
            # Its checkpoint refs go with it (refs 0, 1, 2); the root thread's stay.
            assert deleted["checkpoint_refs_removed"] == 3, deleted
            assert git(project, "for-each-ref", f"refs/t3d/checkpoints/{wt_thread}/") == ""
            assert git(project, "for-each-ref", f"refs/t3d/checkpoints/{root_thread}/")
        daemon.stop()


async def test_after_a_move_diff_and_revert_stay_in_the_new_worktree(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A thread moved from the root to a worktree: its next turn's baseline is taken in the new
    worktree, its diff shows only its own change, and reverting to a root checkpoint is refused
    instead of writing the root's files into the worktree (#30876)."""
    project = make_repo(tmp_path / "repo")
    (project / "root-only.txt").write_text("dirty root\n")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            first = await run_turn(client, thread_id, "Please READ notes.txt")
            await _checkpoint(client, first.turn["id"])
            moved = await client.call("thread.move", thread_id=thread_id, workspace={"worktree": {}})
            worktree = Path(moved["worktree_path"])
            # The moved thread's agent restarts (with --resume); the replay plays its turns again.
            second = await run_turn(client, thread_id, "Please READ notes.txt")
            cp2 = await _checkpoint(client, second.turn["id"])
            assert cp2["data"]["worktree"] == real(worktree)
            assert cp2["data"]["base_ref"].endswith("/2-base"), "a baseline of its own, in the new worktree"
            assert cp2["data"]["files"] == [], "the root's untracked file is not in the moved thread's diff"
            third = await run_turn(client, thread_id, "Now EDIT notes.txt")
            cp3 = await _checkpoint(client, third.turn["id"])
            assert cp3["data"]["files"] == [{"path": "notes.txt", "additions": 1, "deletions": 1}]
            diff = await client.call("checkpoint.diff", thread_id=thread_id, from_ordinal=1, to_ordinal=3)
            assert "root-only.txt" not in diff["diff"] and "+hello, world" in diff["diff"]
            refused = await call_error(client, "checkpoint.revert", thread_id=thread_id, ordinal=1)
            assert "never writes one directory's files into another" in refused["message"]
            assert (project / "notes.txt").read_text() == "hello\n", "the root is untouched"
        daemon.stop()


async def test_a_plain_directory_runs_turns_without_checkpoints_and_says_why(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Outside git: thread.create reports checkpoints disabled with the reason, turns complete
    with no checkpoint items, and checkpoint.diff names the reason too."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("hello\n")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            project = await client.call("project.create", path=str(plain))
            created = await client.call("thread.create", project_id=project["project_id"], provider="replay")
            assert created["checkpoints"]["enabled"] is False
            assert "not in a git repository" in created["checkpoints"]["reason"]
            thread_id = created["thread_id"]
            await client.call("subscribe.thread", thread_id=thread_id)
            first = await run_turn(client, thread_id, "Please READ notes.txt")
            second = await run_turn(client, thread_id, "Now EDIT notes.txt")
            assert first.turn["status"] == second.turn["status"] == "completed"
            assert (plain / "notes.txt").read_text() == "hello, world\n", "the turn ran and edited"
            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
            assert [i for i in snapshot["items"] if i["kind"] == "checkpoint"] == []
            refused = await call_error(client, "checkpoint.diff", thread_id=thread_id, from_ordinal=0, to_ordinal=1)
            assert "not in a git repository" in refused["message"]
        daemon.stop()


async def test_a_failing_capture_leaves_the_turn_completed_with_the_reason(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A corrupt checkpoint ref makes the capture fail: the turn stays completed and its
    checkpoint item is an error naming the ref."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            refs = project / ".git" / "refs" / "t3d" / "checkpoints" / thread_id
            refs.mkdir(parents=True)
            (refs / "1").write_text("not an object id\n")
            outcome = await run_turn(client, thread_id, "Please READ notes.txt")
            assert outcome.turn["status"] == "completed"
            cp = await _checkpoint(client, outcome.turn["id"])
            assert cp["data"]["status"] == "error" and cp["status"] == "failed"
            assert "not an object id" in cp["data"]["error"]
            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
            assert snapshot["turns"][-1]["status"] == "completed"
        daemon.stop()


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


async def test_a_capture_cut_short_by_a_stop_runs_at_the_next_start(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A capture's outbox row stays open until the checkpoint is taken: one left open by a
    daemon that stopped mid-capture (written here as that daemon would have left it) is
    taken at the next start, and its row is then closed; other effects left open are not
    run again (recovery decides afresh)."""
    project = make_repo(tmp_path / "repo")
    state = tmp_path / "state"

    def open_effects() -> int:
        db = apsw.Connection(str(state / "t3d.sqlite"))
        try:
            return int(db.execute("SELECT count(*) FROM outbox WHERE done_at IS NULL").get)
        finally:
            db.close()

    async def no_open_effects() -> bool:
        return await trio.to_thread.run_sync(open_effects) == 0

    with trio.fail_after(60):
        daemon = await start_daemon(nursery, state, checkpoints="off")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            await run_turn(client, thread_id, "Please READ notes.txt")
            turn = (await run_turn(client, thread_id, "Now EDIT notes.txt")).turn
        # The last turn's capture effect runs just after its terminal event: let the effect
        # worker reach it (checkpoints off: it is closed at once) before stopping.
        await wait_until(no_open_effects)
        daemon.stop()
        # Its spawner must be gone too: the next daemon would otherwise connect to it while
        # it stops (wait_all_tasks_blocked returns while the daemon waits for it to exit).
        await wait_until(lambda: not _answers(daemon.settings.spawner_socket))
    await trio.testing.wait_all_tasks_blocked()
    capture = CaptureCheckpoint(thread_id, turn["id"], turn["ordinal"], real(project))

    def leave_open_effects() -> int:
        db = apsw.Connection(str(state / "t3d.sqlite"))
        with db:
            already_open = int(db.execute("SELECT count(*) FROM outbox WHERE done_at IS NULL").get)
            db.execute(
                "INSERT INTO outbox(thread_id, kind, payload, created_at) VALUES (?,?,?,0), (?,?,?,0)",
                (
                    thread_id, "CaptureCheckpoint", orjson.dumps(converter.unstructure(capture)),
                    thread_id, "StopProviderSession", orjson.dumps({"thread_id": thread_id}),
                ),
            )  # fmt: skip
        db.close()
        return already_open

    assert await trio.to_thread.run_sync(leave_open_effects) == 0, "checkpoints off: captures closed at once"
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, state)
        async with open_client(daemon) as client:
            await client.call("subscribe.thread", thread_id=thread_id)
            checkpoint = await _checkpoint(client, turn["id"])
            assert checkpoint["data"]["status"] == "ok", checkpoint["data"].get("error")
            # No baseline (checkpoints were off before): the files are not counted, but the
            # checkpoint holds the turn's edit.
            assert git(project, "show", f"{checkpoint['data']['ref']}:notes.txt") == "hello, world"
        daemon.stop()

    assert await trio.to_thread.run_sync(open_effects) == 0
