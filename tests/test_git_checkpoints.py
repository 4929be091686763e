"""The checkpoint driver on real repositories through the real spawner, and its pure planning."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from git_support import git, make_repo, real, repo_state
from hypothesis import given
from hypothesis import strategies as st

from t3d.config import load_settings
from t3d.domain.events import CaptureCheckpoint
from t3d.git import checkpoints as plan
from t3d.git.service import Checkpoints
from t3d.spawn.sidecar import open_spawner
from t3d.store.store import open_store


@asynccontextmanager
async def open_checkpoints(tmp_path: Path) -> AsyncIterator[Checkpoints]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    settings = load_settings({"state_dir": str(state), "port": 0}, {})
    async with (
        open_store(state / "t3d.sqlite", on_writer_lost=lambda e: None) as store,
        open_spawner(settings) as spawner,
        trio.open_nursery() as nursery,
    ):
        yield Checkpoints(nursery, store, spawner, state)
        nursery.cancel_scope.cancel()


def capture(thread: str, ordinal: int, worktree: Path) -> CaptureCheckpoint:
    return CaptureCheckpoint(thread, f"{thread}-turn-{ordinal}", ordinal, str(worktree))


async def test_a_late_capture_keeps_the_stopped_turns_baseline(tmp_path: Path) -> None:
    """Turn 1 was stopped and turn 2's baseline was taken first; the late capture of turn 1,
    arriving after turn 2 edited files, keeps ref 1 as it was (#30830) and turn 2's diff
    counts only turn 2's edit."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(30):
        async with open_checkpoints(tmp_path) as cps:
            await cps.ensure_baseline("t", 1, str(project))
            (project / "notes.txt").write_text("turn one\n")
            await cps.ensure_baseline("t", 2, str(project))  # ref 1 missing: taken now
            ref1 = git(project, "rev-parse", plan.checkpoint_ref("t", 1))
            (project / "notes.txt").write_text("turn two\n")
            late = await cps.capture(capture("t", 1, project))
            assert late.status == "ok" and late.commit == ref1
            assert git(project, "rev-parse", plan.checkpoint_ref("t", 1)) == ref1, "the late capture kept the baseline"
            assert late.files == [{"path": "notes.txt", "additions": 1, "deletions": 1}]
            second = await cps.capture(capture("t", 2, project))
            assert second.base_ref == plan.checkpoint_ref("t", 1)
            diff, _ = await cps.diff("t", 1, 2, str(project))
            assert "-turn one\n+turn two\n" in diff


async def test_a_stopped_turn_is_checkpointed_in_its_own_worktree(tmp_path: Path) -> None:
    """The capture of a worktree thread's stopped turn lands in that worktree even while the
    root has other changes (#30862), and HEAD, index and branches of both stay unchanged."""
    project = make_repo(tmp_path / "repo")
    worktree = tmp_path / "wt"
    git(project, "worktree", "add", "-q", "-b", "side", str(worktree))
    root_before, wt_before = repo_state(project), repo_state(worktree)
    with trio.fail_after(30):
        async with open_checkpoints(tmp_path) as cps:
            await cps.ensure_baseline("w", 1, str(worktree))
            await cps.ensure_baseline("r", 1, str(project))
            (worktree / "notes.txt").write_text("worktree edit\n")
            (project / "root.txt").write_text("root edit\n")
            stopped = await cps.capture(capture("w", 1, worktree))
            assert stopped.worktree == real(worktree)
            assert stopped.files == [{"path": "notes.txt", "additions": 1, "deletions": 1}]
            assert "root.txt" not in git(project, "ls-tree", "-r", "--name-only", plan.checkpoint_ref("w", 1))
    assert repo_state(project)[0::2] == root_before[0::2] and repo_state(worktree)[0::2] == wt_before[0::2]
    assert repo_state(project)[3] == root_before[3]


async def test_revert_round_trip_of_added_modified_deleted_renamed_binary_files(tmp_path: Path) -> None:
    """Reverting to checkpoint 0 undoes an add, a modification, a deletion, a rename and a
    binary change, leaves ignored files alone, and touches neither HEAD nor the index."""
    project = make_repo(
        tmp_path / "repo",
        files={"a.txt": "a\n", "gone.txt": "bye\n", "old/name.txt": "moved\n", "img.bin": "\0\1", ".gitignore": "*.log\n"},
    )
    before = repo_state(project)
    with trio.fail_after(30):
        async with open_checkpoints(tmp_path) as cps:
            await cps.ensure_baseline("t", 1, str(project))
            (project / "a.txt").write_text("a changed\n")
            (project / "gone.txt").unlink()
            (project / "new").mkdir()
            (project / "old" / "name.txt").rename(project / "new" / "name.txt")
            (project / "img.bin").write_bytes(b"\0\2\3")
            (project / "added.txt").write_text("added\n")
            (project / "run.log").write_text("ignored\n")
            await cps.capture(capture("t", 1, project))
            result = await cps.revert("t", 0, 2, str(project))
            assert result["deleted"] == 2  # added.txt and new/name.txt
    assert (project / "a.txt").read_text() == "a\n"
    assert (project / "gone.txt").read_text() == "bye\n"
    assert (project / "old" / "name.txt").read_text() == "moved\n" and not (project / "new").exists()
    assert (project / "img.bin").read_bytes() == b"\0\1"
    assert not (project / "added.txt").exists()
    assert (project / "run.log").read_text() == "ignored\n"
    assert repo_state(project) == before


async def test_captures_and_baselines_never_change_head_index_or_branches_in_sha256(tmp_path: Path) -> None:
    """In a SHA-256 repository the in-process commit and ref writes produce objects git accepts."""
    project = make_repo(tmp_path / "repo", object_format="sha256")
    before = repo_state(project)
    with trio.fail_after(30):
        async with open_checkpoints(tmp_path) as cps:
            await cps.ensure_baseline("t", 1, str(project))
            (project / "notes.txt").write_text("changed\n")
            cp = await cps.capture(capture("t", 1, project))
            assert cp.status == "ok" and cp.commit is not None and len(cp.commit) == 64
    git(project, "fsck", "--strict")
    head, status, index, branches = repo_state(project)
    assert (head, index, branches) == (before[0], before[2], before[3]) and status == "M notes.txt"


async def test_steady_turns_cost_one_git_process_and_an_edit_four(tmp_path: Path) -> None:
    """After the first turn, a turn that changes nothing costs 1 git process (status: the
    tree is the last capture's) and one that edits a file 4 (status, update-index,
    write-tree, numstat); baselines cost none."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(30):
        async with open_checkpoints(tmp_path) as cps:
            await cps.ensure_baseline("t", 1, str(project))
            await cps.capture(capture("t", 1, project))
            start = cps.git.processes
            await cps.ensure_baseline("t", 2, str(project))
            await cps.capture(capture("t", 2, project))
            steady = cps.git.processes - start
            (project / "notes.txt").write_text("edited\n")
            start = cps.git.processes
            await cps.ensure_baseline("t", 3, str(project))
            await cps.capture(capture("t", 3, project))
            edited = cps.git.processes - start
    assert (steady, edited) == (1, 4)


# --- pure planning --------------------------------------------------------------------------


@given(st.text(min_size=1, max_size=200))
def test_any_thread_id_makes_a_valid_ref(thread_id: str) -> None:
    """Client-minted thread ids, whatever they hold, give ref names git accepts (checked by our validator)."""
    from t3d.git.repo import check_ref_name

    check_ref_name(plan.checkpoint_ref(thread_id, 3))
    check_ref_name(plan.base_ref(thread_id, 3))


@given(st.text(max_size=3000), st.integers(min_value=1024, max_value=4096))
def test_diff_pages_concatenate_to_the_whole_diff(text: str, limit: int) -> None:
    """Paging a diff by next_offset returns every character once, in order, each page within the limit."""
    pages, offset = [], 0
    while True:
        chunk, nxt = plan.page(text, offset, limit)
        assert len(chunk) <= limit
        pages.append(chunk)
        if nxt is None:
            break
        assert nxt > offset
        offset = nxt
    assert "".join(pages) == text


@given(
    st.lists(
        st.tuples(
            st.text(st.characters(blacklist_characters="\0\t", blacklist_categories=("Cs",)), min_size=1, max_size=30),
            st.one_of(st.none(), st.integers(0, 10_000)),
            st.integers(0, 10_000),
        ),
        max_size=20,
    )
)
def test_numstat_parsing_round_trips(rows: list[tuple[str, int | None, int]]) -> None:
    """`git diff --numstat -z` output (text and binary rows) parses back into its rows."""
    out = b"".join(
        (b"-\t-\t" if add is None else f"{add}\t{dele}\t".encode()) + path.encode() + b"\0" for path, add, dele in rows
    )
    parsed = plan.parse_numstat(out)
    assert [(s.path, s.additions, s.deletions) for s in parsed] == [
        (p, a, None if a is None else d) for p, a, d in rows
    ]


def test_name_status_splits_restores_from_deletions() -> None:
    """Added-since paths are deleted; modified, deleted and type-changed ones are restored."""
    out = b"A\0new.txt\0M\0a.txt\0D\0gone.txt\0T\0link\0"
    assert plan.parse_name_status(out) == (["a.txt", "gone.txt", "link"], ["new.txt"])
    assert plan.unsafe_path("../x") and plan.unsafe_path(".git/config") and not plan.unsafe_path("a/b.txt")
