"""The checkpoint index's files, beside the index itself (blocking: call from a worker thread).

A worktree's checkpoint index lives in the state dir (`Checkpoints` names it). Beside it,
``<index>.tree`` holds the tree the last ``write-tree`` made from it: removed before
anything changes the index's entries and written after ``write-tree``, so it is never
stale (``git status`` rewrites the index only for its stat data and caches), and read
when status names no path (the steady capture costs no ``write-tree``).
"""

from __future__ import annotations

import contextlib
import os
import shutil

from t3d.errors import GitError
from t3d.git import checkpoints as plan
from t3d.git import repo
from t3d.git.repo import RepoInfo


def seed_index(info: RepoInfo, index: str) -> bool:
    """First use: start from the repository's index (its stat data). Whether HEAD is
    unborn (then status would list every file as added: the capture adds all instead)."""
    if not os.path.exists(index):
        os.makedirs(os.path.dirname(index), exist_ok=True)
        forget_tree(index)
        real = os.path.join(info.git_dir, "index")
        if os.path.exists(real):
            shutil.copyfile(real, index)
    if info.unusual is not None:
        return False  # git's status answers whatever HEAD is
    try:
        return repo.read_head(info) is None
    except GitError:
        return False  # git says what is wrong with HEAD


def drop_index(index: str) -> None:
    """Forget the index (it is made again from the repository's), and a lock a killed git
    left on it: the caller holds the worktree's lock, so no git of t3d's is writing it."""
    forget_tree(index)
    for path in (index, index + ".lock"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def forget_tree(index: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(index + ".tree")


def remember_tree(index: str, tree: str) -> None:
    tmp = f"{index}.tree.{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(tree + "\n")
    os.replace(tmp, index + ".tree")


def last_tree(info: RepoInfo, index: str) -> str | None:
    """The tree the last capture wrote, if it is known and still a loose object (a tree
    packed or pruned since is left to ``write-tree``, which checks)."""
    try:
        with open(index + ".tree", encoding="ascii", errors="replace") as f:
            tree = f.read(200).strip()
    except FileNotFoundError:
        return None
    if len(tree) != info.hex_len or not all(c in "0123456789abcdef" for c in tree) or info.unusual is not None:
        return None
    return tree if os.path.exists(os.path.join(info.common_dir, "objects", tree[:2], tree[2:])) else None


def changed_paths(info: RepoInfo, index: str, status: bytes) -> tuple[list[bytes], str | None]:
    """The paths status named to update (a nested repository only if it has a commit: git
    cannot record one without), and the last tree."""
    changes = plan.parse_capture_status(status)
    paths = list(changes.paths)
    for nested in changes.nested:
        path = os.path.join(info.worktree, os.fsdecode(nested))
        try:
            inner = repo.discover(path)
            empty = (
                inner is not None
                and inner.unusual is None
                and os.path.realpath(inner.worktree) == os.path.realpath(path)
                and repo.read_head(inner) is None
            )
        except (GitError, OSError):
            empty = False  # git says what it is
        if not empty:
            paths.append(nested)
    return paths, last_tree(info, index)
