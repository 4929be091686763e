"""Checkpoints, planned: ref names, the git commands, and their output parsed. Pure.

Theory of operation. A checkpoint is a commit of a working tree's files (untracked
files included, ignored ones not) under a hidden ref, never on a branch:

- ``refs/t3d/checkpoints/<thread>/<n>``: the files after turn ``n`` (``0``: before the
  thread's first turn). Turn ``n`` starts from ref ``n-1`` (its baseline), taken before
  the turn if it is missing.
- ``refs/t3d/checkpoints/<thread>/<n>-base``: turn ``n``'s own baseline when ref ``n-1``
  cannot be one: it was taken in another worktree (the thread moved) or the files were
  reverted since (then it is the restored checkpoint's commit).

A capture runs ``git add -A`` then ``git write-tree`` with ``GIT_INDEX_FILE`` set to the
thread's checkpoint index (in the state dir), so HEAD, the repository's index and its
branches are never touched, and .gitignore applies as it does for ``git add``. The
commit and the ref are written in-process (`repo.py`) or, in an unusual repository, by
``git commit-tree`` and ``git update-ref``. A ref is created, never replaced: a late
capture keeps what is there. The commit message names the worktree it was taken in, so
a diff or a revert can refuse to mix worktrees.
"""

from __future__ import annotations

import hashlib
import re

import attrs

CHECKPOINT_PREFIX = "refs/t3d/checkpoints/"
MAX_FILES = 500  # files listed on a checkpoint; the rest are counted
DIFF_PAGE = 256 * 1024  # characters of unified diff per checkpoint.diff reply
DIFF_CAP = 8 * 1024 * 1024  # what a diff may produce at all (the spawner's largest output cap)
_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
WORKTREE_LINE = "worktree: "


def thread_ref_component(thread_id: str) -> str:
    """The thread's directory under the checkpoint prefix: the id itself when it is a safe
    ref component, otherwise ``h-`` and a hash of it (client-minted ids can hold anything)."""
    if _SAFE_ID.fullmatch(thread_id):
        return thread_id
    return "h-" + hashlib.sha256(thread_id.encode()).hexdigest()[:40]


def thread_prefix(thread_id: str) -> str:
    return f"{CHECKPOINT_PREFIX}{thread_ref_component(thread_id)}/"


def checkpoint_ref(thread_id: str, ordinal: int) -> str:
    return f"{thread_prefix(thread_id)}{ordinal}"


def base_ref(thread_id: str, ordinal: int) -> str:
    """Turn ``ordinal``'s own baseline (see the module docstring)."""
    return f"{thread_prefix(thread_id)}{ordinal}-base"


def commit_message(thread_id: str, ordinal: int, worktree: str, what: str) -> str:
    return f"t3d checkpoint {what} {ordinal} of thread {thread_id}\n\n{WORKTREE_LINE}{worktree}\n"


def worktree_of(message: str) -> str | None:
    for line in message.splitlines():
        if line.startswith(WORKTREE_LINE):
            return line[len(WORKTREE_LINE) :]
    return None


# --- commands -------------------------------------------------------------------------------


def git_env(index_file: str | None) -> dict[str, str]:
    env = {"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}
    if index_file is not None:
        env["GIT_INDEX_FILE"] = index_file
    return env


ADD_ALL = ("git", "add", "-A", "--", ".")
WRITE_TREE = ("git", "write-tree")


def numstat_argv(a: str, b: str) -> tuple[str, ...]:
    return ("git", "diff", "--numstat", "-z", "--no-renames", "--no-ext-diff", "--no-textconv", a, b, "--")


def diff_argv(a: str, b: str) -> tuple[str, ...]:
    return ("git", "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--binary", "-M", a, b, "--")


def name_status_argv(a: str, b: str) -> tuple[str, ...]:
    return ("git", "diff", "--name-status", "-z", "--no-renames", a, b, "--")


def read_tree_argv(tree: str) -> tuple[str, ...]:
    return ("git", "read-tree", tree)


CHECKOUT_INDEX_STDIN = ("git", "checkout-index", "-f", "-z", "--stdin")


def commit_tree_argv(tree: str, message: str) -> tuple[str, ...]:
    return ("git", "-c", "user.name=t3d", "-c", "user.email=t3d@localhost", "commit-tree", tree, "-m", message)


def create_ref_argv(name: str, oid: str, zero: str) -> tuple[str, ...]:
    return ("git", "update-ref", name, oid, zero)


def set_ref_argv(name: str, oid: str) -> tuple[str, ...]:
    return ("git", "update-ref", name, oid)


def rev_parse_argv(name: str) -> tuple[str, ...]:
    return ("git", "rev-parse", "-q", "--verify", f"{name}^{{commit}}")


def cat_commit_argv(oid: str) -> tuple[str, ...]:
    return ("git", "cat-file", "commit", oid)


# --- output ---------------------------------------------------------------------------------


@attrs.frozen
class FileStat:
    path: str
    additions: int | None  # None for a binary file
    deletions: int | None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "additions": self.additions, "deletions": self.deletions}
        if self.additions is None:
            out["binary"] = True
        return out


def parse_numstat(out: bytes) -> list[FileStat]:
    """``git diff --numstat -z --no-renames``: ``ADD\\tDEL\\tPATH\\0`` per file."""
    stats = []
    for record in out.split(b"\0"):
        if not record:
            continue
        added, _, rest = record.partition(b"\t")
        deleted, _, path = rest.partition(b"\t")
        binary = added == b"-"
        stats.append(
            FileStat(
                path.decode("utf-8", "surrogateescape"),
                None if binary else int(added),
                None if binary else int(deleted),
            )
        )
    return stats


def summarize_files(stats: list[FileStat]) -> dict[str, object]:
    """What a checkpoint item shows: the files (at most `MAX_FILES`) and the totals."""
    return {
        "files": [s.to_json() for s in stats[:MAX_FILES]],
        "file_count": len(stats),
        "files_truncated": len(stats) > MAX_FILES,
        "additions": sum(s.additions or 0 for s in stats),
        "deletions": sum(s.deletions or 0 for s in stats),
    }


def parse_name_status(out: bytes) -> tuple[list[str], list[str]]:
    """``git diff --name-status -z --no-renames TARGET CURRENT``: the paths to restore from
    TARGET (modified or deleted since) and the paths to delete (added since)."""
    fields = out.split(b"\0")
    restore: list[str] = []
    delete: list[str] = []
    i = 0
    while i + 1 < len(fields):
        status, path = fields[i], fields[i + 1].decode("utf-8", "surrogateescape")
        i += 2
        if status.startswith(b"A"):
            delete.append(path)
        elif status:
            restore.append(path)
    return restore, delete


def checkout_stdin(paths: list[str]) -> bytes:
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)


def page(text: str, offset: int, limit: int = DIFF_PAGE) -> tuple[str, int | None]:
    """``text[offset:offset+limit]``, cut at a line end when one is near, and the next offset
    (None at the end)."""
    end = min(len(text), offset + limit)
    if end < len(text):
        newline = text.rfind("\n", offset, end)
        if newline > offset:
            end = newline + 1
    return text[offset:end], (end if end < len(text) else None)


def unsafe_path(path: str) -> bool:
    """A path from git output that must not be written or deleted (it leaves the worktree)."""
    parts = path.split("/")
    return path.startswith("/") or ".." in parts or ".git" in parts or not path
