"""A capture (status on the checkpoint index, update-index of the paths it names,
write-tree) records the same tree as ``git add -A`` on a fresh index would, on real
repositories: edits, deletions, new directories, file/directory swaps, symlinks, modes,
ignored and tracked-but-ignored files, odd paths, nested repositories; from an index an
older capture wrote, in a repository without a commit, and after git lost its shared index."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from git_support import GIT_ENV, git, make_repo
from test_git_checkpoints import capture, open_checkpoints

from t3d.git import checkpoints as plan
from t3d.git.service import Checkpoints


def reference_tree(project: Path, scratch: Path) -> str:
    """What ``git add -A`` records, from a copy of the repository's index (the old capture)."""
    index = scratch / "reference-index"
    index.unlink(missing_ok=True)
    real = project / ".git" / "index"
    if real.exists():
        shutil.copyfile(real, index)
    env = {**GIT_ENV, "GIT_INDEX_FILE": str(index)}
    subprocess.run(["git", "add", "-A", "--", "."], cwd=project, env=env, check=True, capture_output=True)
    return subprocess.run(["git", "write-tree"], cwd=project, env=env, check=True, capture_output=True, text=True).stdout.strip()


async def captured_tree(cps: Checkpoints, project: Path, ordinal: int) -> str:
    cp = await cps.capture(capture("t", ordinal, project))
    assert cp.status == "ok", cp.error
    return git(project, "rev-parse", f"{plan.checkpoint_ref('t', ordinal)}^{{tree}}")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def swap_file_for_directory(project: Path) -> None:
    (project / "notes.txt").unlink()
    write(project / "notes.txt" / "inside.txt", "now a directory\n")


def swap_directory_for_file(project: Path) -> None:
    shutil.rmtree(project / "deep")
    write(project / "deep", "now a file\n")


def nested_repositories(project: Path) -> None:
    make_repo(project / "vendored", files={"lib.txt": "nested\n"})  # has a commit: a gitlink
    (project / "empty-nested").mkdir()
    git(project / "empty-nested", "init", "-q")  # no commit: git cannot record it
    write(project / "empty-nested" / "x.txt", "not captured\n")


STEPS = [
    ("an edit and a new file", lambda p: (write(p / "notes.txt", "edited\n"), write(p / "new.txt", "new\n"))),
    ("files in new directories", lambda p: (write(p / "deep" / "er" / "a.txt", "a\n"), write(p / "deep" / "b.txt", "b\n"))),
    ("a deletion", lambda p: (p / "new.txt").unlink()),
    ("a rename", lambda p: (p / "deep" / "b.txt").rename(p / "deep" / "er" / "renamed.txt")),
    ("ignored files", lambda p: (write(p / "debug.log", "ignored\n"), write(p / "build" / "out.o", "ignored\n"))),
    ("a file becomes a directory", swap_file_for_directory),
    ("a directory becomes a file", swap_directory_for_file),
    ("a symlink", lambda p: os.symlink("deep", p / "link")),
    ("a symlink retargeted", lambda p: ((p / "link").unlink(), os.symlink("elsewhere", p / "link"))),
    ("a mode change", lambda p: os.chmod(p / "deep", 0o755)),
    ("odd paths", lambda p: (write(p / "new\nline.txt", "n\n"), write(p / "ünï cödé" / "sp ace.txt", "u\n"))),
    ("a tracked ignored file edited", lambda p: write(p / "kept.log", "still tracked, edited\n")),
    ("nested repositories", nested_repositories),
    ("an edit in a nested repository's commit", lambda p: (write(p / "vendored" / "lib.txt", "moved\n"), git(p / "vendored", "commit", "-qam", "two"))),
    ("nothing", lambda p: None),
]


async def test_every_capture_records_what_git_add_all_records(tmp_path: Path) -> None:
    """Step after step of edits of every kind, each capture's tree is the tree ``git add -A``
    makes of the same files (ignored files left out, a tracked ignored file kept, a nested
    repository a gitlink) except that a nested repository without a commit is left out
    (``git add -A`` fails on it); HEAD, the index and the status stay as the user left them."""
    project = make_repo(tmp_path / "repo", files={"notes.txt": "hello\n", ".gitignore": "*.log\nbuild/\n"})
    write(project / "kept.log", "tracked though ignored\n")
    git(project, "add", "-f", "kept.log")
    git(project, "commit", "-qm", "a tracked ignored file")
    head, index = git(project, "rev-parse", "HEAD"), (project / ".git" / "index").read_bytes()
    with trio.fail_after(120):
        async with open_checkpoints(tmp_path) as cps:
            assert await captured_tree(cps, project, 0) == reference_tree(project, tmp_path), "the first capture"
            for ordinal, (what, step) in enumerate(STEPS, start=1):
                step(project)
                mine = await captured_tree(cps, project, ordinal)
                if (project / "empty-nested").exists():
                    shutil.move(project / "empty-nested", tmp_path / "aside")  # git add -A would fail on it
                    expected = reference_tree(project, tmp_path)
                    shutil.move(tmp_path / "aside", project / "empty-nested")
                else:
                    expected = reference_tree(project, tmp_path)
                assert mine == expected, f"after {what}: {git(project, 'diff', '--stat', expected, mine)}"
            listing = git(project, "ls-tree", "-r", mine)
            assert "160000 commit" in listing and "vendored" in listing and "empty-nested" not in listing
            assert "debug.log" not in listing and "build/" not in listing and "kept.log" in listing
    assert git(project, "rev-parse", "HEAD") == head and (project / ".git" / "index").read_bytes() == index


def rewrite_the_old_way(index_dir: Path, project: Path) -> Path:
    """Replace the checkpoint index with one the previous capture wrote: a copy of the
    repository's index, then ``git add -A`` and ``write-tree`` (no split, no tree file)."""
    (index,) = [p for p in index_dir.iterdir() if not p.name.endswith(".tree")]
    for side in index_dir.iterdir():
        side.unlink()
    shutil.copyfile(project / ".git" / "index", index)
    env = {**GIT_ENV, "GIT_INDEX_FILE": str(index)}
    subprocess.run(["git", "add", "-A", "--", "."], cwd=project, env=env, check=True)
    subprocess.run(["git", "write-tree"], cwd=project, env=env, check=True, capture_output=True)
    assert b"link" not in index.read_bytes(), "not split"
    return index


async def test_an_index_an_older_capture_wrote_goes_on_from_where_it_was(tmp_path: Path) -> None:
    """An index written by the previous way of capturing (``git add -A`` and ``write-tree``,
    not split, no untracked cache) is used as it is: the next capture, after edits, records
    what ``git add -A`` does, and from then on the index is split."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        async with open_checkpoints(tmp_path) as cps:
            write(project / "first.txt", "first\n")
            await captured_tree(cps, project, 0)  # finds the index's path; then it is rewritten the old way
            index = rewrite_the_old_way(Path(cps._index_dir), project)
            write(project / "first.txt", "edited\n")
            write(project / "second" / "file.txt", "second\n")
            (project / "notes.txt").unlink()
            assert await captured_tree(cps, project, 1) == reference_tree(project, tmp_path)
            assert b"link" in index.read_bytes()[:100_000], "the index is split now"


async def test_a_repository_without_a_commit_is_captured_whole(tmp_path: Path) -> None:
    """In a repository whose HEAD is unborn (status would list every file as added) a
    capture adds all files (2 git processes) and records what ``git add -A`` does."""
    project = tmp_path / "fresh"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    write(project / "a.txt", "a\n")
    write(project / "dir" / "b.txt", "b\n")
    write(project / ".gitignore", "*.tmp\n")
    write(project / "x.tmp", "ignored\n")
    with trio.fail_after(60):
        async with open_checkpoints(tmp_path) as cps:
            before = cps.git.processes
            tree = await captured_tree(cps, project, 1)
            assert cps.git.processes - before == 2
            assert tree == reference_tree(project, tmp_path)
            write(project / "a.txt", "edited\n")
            assert await captured_tree(cps, project, 2) == reference_tree(project, tmp_path)


async def test_a_lost_shared_index_makes_the_checkpoint_index_again(tmp_path: Path) -> None:
    """When git can no longer read the checkpoint index (its ``sharedindex.*`` file was
    expired or deleted), the capture makes it again from the repository's index and still
    records the right tree; the next steady capture costs one process again."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        async with open_checkpoints(tmp_path) as cps:
            write(project / "a.txt", "a\n")
            await captured_tree(cps, project, 1)
            write(project / "b.txt", "b\n")
            await captured_tree(cps, project, 2)
            shared = list((project / ".git").glob("sharedindex.*"))
            assert shared, "the checkpoint index is split"
            for path in shared:
                path.unlink()
            write(project / "c.txt", "c\n")
            assert await captured_tree(cps, project, 3) == reference_tree(project, tmp_path)
            before = cps.git.processes
            assert await captured_tree(cps, project, 4) == reference_tree(project, tmp_path)
            assert cps.git.processes - before == 1


def leave_a_stale_lock(index_dir: Path) -> None:
    (index,) = [p for p in index_dir.iterdir() if not p.name.endswith(".tree")]
    Path(f"{index}.lock").write_bytes(b"")


async def test_a_lock_a_killed_git_left_on_the_checkpoint_index_is_cleared(tmp_path: Path) -> None:
    """A stale ``<index>.lock`` (a git killed while writing the checkpoint index) fails the
    update once; the capture makes the index again without it and records the right tree."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        async with open_checkpoints(tmp_path) as cps:
            await captured_tree(cps, project, 1)
            leave_a_stale_lock(Path(cps._index_dir))
            write(project / "a.txt", "a\n")
            assert await captured_tree(cps, project, 2) == reference_tree(project, tmp_path)
            write(project / "b.txt", "b\n")
            assert await captured_tree(cps, project, 3) == reference_tree(project, tmp_path)


async def test_a_steady_capture_after_gc_packed_its_tree_asks_write_tree(tmp_path: Path) -> None:
    """The tree a steady capture reuses must still be a loose object: after ``git gc``
    packed it, the capture runs ``write-tree`` and gets the same tree (3 processes: status,
    write-tree, and ``cat-file`` for the base commit, packed too)."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        async with open_checkpoints(tmp_path) as cps:
            write(project / "a.txt", "a\n")
            first = await captured_tree(cps, project, 1)
            git(project, "gc", "-q", "--prune=now")
            before = cps.git.processes
            assert await captured_tree(cps, project, 2) == first
            assert cps.git.processes - before == 3


async def test_a_repository_without_an_index_file_is_captured(tmp_path: Path) -> None:
    """A repository with a commit but no index file (nothing to seed from): the first
    capture records the worktree's files as ``git add -A`` does."""
    project = make_repo(tmp_path / "repo")
    write(project / "new.txt", "new\n")
    (project / ".git" / "index").unlink()
    with trio.fail_after(60):
        async with open_checkpoints(tmp_path) as cps:
            assert await captured_tree(cps, project, 1) == reference_tree(project, tmp_path)


async def test_a_status_past_its_cap_falls_back_to_adding_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When status says more than `CAPTURE_STATUS_CAP` (an index far from HEAD), the capture
    adds all files instead (status, add, write-tree) and records the same tree."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        async with open_checkpoints(tmp_path) as cps:
            await captured_tree(cps, project, 1)
            monkeypatch.setattr(plan, "CAPTURE_STATUS_CAP", 16)
            for n in range(5):
                write(project / f"file-{n}.txt", f"{n}\n")
            before = cps.git.processes
            assert await captured_tree(cps, project, 2) == reference_tree(project, tmp_path)
            assert cps.git.processes - before == 4  # status, add -A, write-tree, numstat


def test_capture_status_parsing_names_the_paths_to_update() -> None:
    """Worktree-side changes, unmerged and untracked paths are updated; changes against HEAD
    only are not; a rename record gives both paths; ``DIR/`` is a nested repository."""
    oid = "0" * 40
    out = b"\0".join(
        [
            b"1 M. N... 100644 100644 100644 " + oid.encode() + b" " + oid.encode() + b" staged only.txt",
            b"1 .M N... 100644 100644 100644 " + oid.encode() + b" " + oid.encode() + b" edited file.txt",
            b"1 .D N... 100644 100644 000000 " + oid.encode() + b" " + oid.encode() + b" gone\nnewline",
            b"2 R. N... 100644 100644 100644 " + oid.encode() + b" " + oid.encode() + b" R100 to.txt",
            b"from.txt",
            b"u UU N... 100644 100644 100644 100644 " + oid.encode() + b" " + oid.encode() + b" " + oid.encode() + b" both.txt",
            b"? new dir/\xc3\xbc.txt",
            b"? nested/",
            b"",
        ]
    )
    changes = plan.parse_capture_status(out)
    assert changes.paths == (b"edited file.txt", b"gone\nnewline", b"to.txt", b"from.txt", b"both.txt", "new dir/ü.txt".encode())
    assert changes.nested == (b"nested",)
    assert plan.parse_capture_status(b"") == plan.Changes((), ())


NAMES = ["a", "b", "ü", "sp ace", "x.log", "build", "new\nline"]


def random_step(project: Path, rng: random.Random) -> str:
    """One random change under ``project``: write, delete, swap a file and a directory,
    symlink, chmod; names include ignored ones (``*.log``, ``build/``) and odd characters."""
    depth = rng.randint(1, 3)
    rel = Path(*(rng.choice(NAMES) for _ in range(depth)))
    path = project / rel
    files = sorted(p for p in project.rglob("*") if ".git" not in p.parts and (p.is_file() or p.is_symlink()))
    op = rng.choice(["write", "write", "write", "delete", "rmtree", "symlink", "chmod"])
    if op in ("delete", "chmod") and files:
        target = rng.choice(files)
        if op == "delete":
            target.unlink()
        elif not target.is_symlink():
            target.chmod(target.stat().st_mode ^ 0o100)
        return f"{op} {target.relative_to(project)}"
    if op == "rmtree":
        dirs = [p for p in project.iterdir() if p.is_dir() and p.name != ".git" and not p.is_symlink()]
        if dirs:
            shutil.rmtree(rng.choice(dirs))
            return "rmtree"
    for parent in [*reversed(rel.parents)][1:]:  # a file where a directory must go: swapped
        where = project / parent
        if where.is_symlink() or where.is_file():
            where.unlink()
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if op == "symlink":
        os.symlink(rng.choice(NAMES), path)
    else:
        path.write_text(f"{rng.random()}\n")
    return f"{op} {rel}"


async def test_a_random_walk_of_edits_captures_what_git_add_all_does(tmp_path: Path) -> None:
    """A seeded random walk of writes, deletions, file/directory swaps, symlinks and mode
    changes (ignored names and odd characters among them): after each batch the capture's
    tree equals ``git add -A``'s on a fresh copy of the repository's index."""
    project = make_repo(tmp_path / "repo", files={"seed.txt": "seed\n", ".gitignore": "*.log\nbuild/\n"})
    rng = random.Random(23)
    with trio.fail_after(240):
        async with open_checkpoints(tmp_path) as cps:
            for ordinal in range(1, 26):
                done = await trio.to_thread.run_sync(lambda: [random_step(project, rng) for _ in range(rng.randint(1, 4))])
                mine = await captured_tree(cps, project, ordinal)
                expected = await trio.to_thread.run_sync(reference_tree, project, tmp_path)
                assert mine == expected, f"after {done}: {git(project, 'diff', '--stat', expected, mine)}"


async def test_sha256_and_unusual_repositories_capture_the_same_files(tmp_path: Path) -> None:
    """In a SHA-256 repository the steady capture reuses its 64-digit tree (1 process); an
    unusual one (alternates: refs and objects are git's) is captured through git alone;
    both record what ``git add -A`` does."""
    sha256 = make_repo(tmp_path / "sha256", object_format="sha256")
    unusual = make_repo(tmp_path / "unusual")
    write(unusual / ".git" / "objects" / "info" / "alternates", "")
    with trio.fail_after(60):
        async with open_checkpoints(tmp_path) as cps:
            for project in (sha256, unusual):
                write(project / "dir" / "new.txt", "new\n")
                (project / "notes.txt").unlink()
                assert await captured_tree(cps, project, 1) == reference_tree(project, tmp_path)
            before = cps.git.processes
            assert len(await captured_tree(cps, sha256, 2)) == 64
            assert cps.git.processes - before == 1
            write(unusual / "dir" / "new.txt", "edited\n")
            assert await captured_tree(cps, unusual, 2) == reference_tree(unusual, tmp_path)
