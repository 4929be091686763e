"""Checkpoints, planned: ref names, the git commands, and their output parsed. Pure.

Theory of operation. A checkpoint is a commit of a working tree's files (untracked
files included, ignored ones not) under a hidden ref, never on a branch:

- ``refs/t3d/checkpoints/<thread>/<n>``: the files after turn ``n`` (``0``: before the
  thread's first turn). Turn ``n`` starts from ref ``n-1`` (its baseline), taken before
  the turn if it is missing.
- ``refs/t3d/checkpoints/<thread>/<n>-base``: turn ``n``'s own baseline when ref ``n-1``
  cannot be one: it was taken in another worktree (the thread moved) or the files were
  reverted since (then it is the restored checkpoint's commit).

A capture works on the worktree's own checkpoint index (``GIT_INDEX_FILE``, in the state
dir), so HEAD, the repository's index and its branches are never touched. It asks
``git status`` (`CAPTURE_STATUS`) what differs from that index: status uses git's caches
(the index's stat data, the untracked cache, fsmonitor where configured) where
``git add`` re-reads every directory. Exactly the paths it names go to
``git update-index --add --remove`` (`UPDATE_INDEX`), then ``git write-tree``; when it
names none, the tree is the one the last capture wrote (kept beside the index). The same
exclusion rules apply as for ``git add -A``: ignored files are never captured, tracked
ones are kept even when ignored; a nested repository is a gitlink (one without a commit is
left out, where ``git add -A`` fails). The checkpoint index is a split index
(``core.splitIndex``: its shared part is a ``sharedindex.*`` file in the repository's git
dir, which git expires), so each write is small. ``git add -A -- .`` is the fallback: a
repository without a commit (status would list every file as added), a status past
`CAPTURE_STATUS_CAP`, or any git failure on the index (it is then made again from the
repository's: an expired shared index, a stale lock). The untracked cache is used on
t3d's own index whatever the repository's setting (as the workspace status does). The
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
    """git's environment. On t3d's own index (``index_file``) optional locks are allowed, so
    ``git status`` keeps what it refreshed (stat data, the untracked cache) for the next
    capture; on the repository's index they are not, so t3d never makes the user's git fail."""
    env = {"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0" if index_file is None else "1"}
    if index_file is not None:
        env["GIT_INDEX_FILE"] = index_file
    return env


# Every command writing the checkpoint index keeps it split, with an untracked cache for
# ``--untracked-files=all`` (a cache made for one mode is not used by the other).
INDEX_CONFIG = ("-c", "core.splitIndex=true", "-c", "core.untrackedCache=true", "-c", "status.showUntrackedFiles=all")
ADD_ALL = ("git", *INDEX_CONFIG, "add", "-A", "--", ".")
WRITE_TREE = ("git", *INDEX_CONFIG, "write-tree")
CAPTURE_STATUS = (
    "git", *INDEX_CONFIG, "status", "--porcelain=v2", "-z", "--untracked-files=all", "--no-renames",
    "--ignore-submodules=dirty",
)  # fmt: skip
UPDATE_INDEX = ("git", *INDEX_CONFIG, "update-index", "--add", "--remove", "--replace", "-z", "--stdin")
# Status output kept for a capture; past it (an index far from HEAD) the capture runs
# ``git add -A`` instead.
CAPTURE_STATUS_CAP = 4 * 1024 * 1024


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


@attrs.frozen
class Changes:
    """What ``git status`` (`CAPTURE_STATUS`) says differs between the worktree and the
    checkpoint index: the paths to update (changed, deleted, untracked, unmerged) and the
    untracked nested repositories among them (a gitlink if it has a commit)."""

    paths: tuple[bytes, ...]
    nested: tuple[bytes, ...]


def parse_capture_status(out: bytes) -> Changes:
    """``git status --porcelain=v2 -z --untracked-files=all``: ``1 XY ... PATH`` (changed,
    Y is the worktree side), ``2 XY ... PATH\0ORIG`` (renamed: not asked for, taken
    anyway), ``u XY ... PATH`` (unmerged), ``? PATH`` (untracked; ``DIR/`` for a nested
    repository). Entries changed only against HEAD (Y ``.``) need nothing."""
    fields = out.split(b"\0")
    paths: list[bytes] = []
    nested: list[bytes] = []
    i = 0
    while i < len(fields):
        record = fields[i]
        i += 1
        kind = record[:2]
        if kind == b"1 ":
            parts = record.split(b" ", 8)
            if len(parts) == 9 and parts[1][1:2] != b".":
                paths.append(parts[8])
        elif kind == b"2 ":
            parts = record.split(b" ", 9)
            if len(parts) == 10:
                paths.append(parts[9])
            if i < len(fields):
                paths.append(fields[i])
            i += 1
        elif kind == b"u ":
            parts = record.split(b" ", 10)
            if len(parts) == 11:
                paths.append(parts[10])
        elif kind == b"? ":
            path = record[2:]
            if path.endswith(b"/"):
                nested.append(path.rstrip(b"/"))
            elif path:
                paths.append(path)
    return Changes(tuple(paths), tuple(nested))


def update_index_stdin(paths: list[bytes]) -> bytes:
    return b"".join(p + b"\0" for p in paths)


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
