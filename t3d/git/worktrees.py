"""Worktrees for threads: created under the state dir, removed only when clean.

Rules:
- A thread's worktree is ``<state>/worktrees/<project>/<thread>`` (ids made path-safe),
  made by ``git worktree add`` from the project's repository through the spawner, on a
  new branch (``t3d/<thread>`` unless the client names one) from ``base_ref`` (HEAD by
  default).
- Removal takes a fresh ``git status`` first (never a cached one): a worktree with
  changes or untracked files is refused unless ``force`` is given; the branch is kept
  (it may hold the agent's commits).
- Only worktrees under the state dir's ``worktrees/`` are ever removed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import attrs
import trio

from t3d.errors import GitError
from t3d.git import repo
from t3d.git.checkpoints import thread_ref_component
from t3d.git.refs import GitRunner

_SAFE_BRANCH = re.compile(r"[A-Za-z0-9._/-]{1,200}")


@attrs.frozen
class Workspace:
    worktree_path: str | None
    branch: str | None


def worktree_root(state_dir: Path) -> Path:
    return state_dir / "worktrees"


def check_branch(branch: str) -> None:
    parts = branch.split("/")
    if (
        not _SAFE_BRANCH.fullmatch(branch)
        or ".." in branch
        or any(not p or p.startswith(".") or p.endswith(".lock") for p in parts)
        or branch.endswith("/")
    ):
        raise GitError(f"branch {branch!r} is not a valid branch name; use letters, digits, '-', '_', '.' and '/'")


async def create_worktree(
    runner: GitRunner, state_dir: Path, project_path: str, project_id: str, thread_id: str, base_ref: str | None, branch: str | None
) -> Workspace:
    info = await trio.to_thread.run_sync(repo.discover, project_path)
    if info is None:
        raise GitError(f"{project_path} is not in a git repository, so a thread there cannot have a worktree; use workspace \"root\"")
    branch = branch or f"t3d/{thread_ref_component(thread_id)}"
    check_branch(branch)
    if base_ref is not None and (base_ref.startswith("-") or not base_ref.strip() or len(base_ref) > 200):
        raise GitError(f"base_ref {base_ref!r} is not a ref or commit; pass e.g. \"main\" or a commit id")
    path = worktree_root(state_dir) / thread_ref_component(project_id) / thread_ref_component(thread_id)
    if await trio.Path(path).exists():
        raise GitError(f"{path} exists already; delete it or use another thread id")
    await trio.Path(path.parent).mkdir(parents=True, exist_ok=True)
    argv = ["git", "worktree", "add", "-b", branch, str(path)]
    if base_ref is not None:
        argv.append(base_ref)
    await runner.run(argv, cwd=info.worktree)
    return Workspace(str(path), branch)


async def worktree_status(runner: GitRunner, worktree: str) -> list[str]:
    """A fresh ``git status``: the changed and untracked paths (ignored ones are not listed)."""
    out = await runner.run(
        ("git", "status", "--porcelain=v1", "-z", "--untracked-files=all"), cwd=worktree, read_only=True
    )
    return [entry[3:].decode("utf-8", "replace") for entry in out.stdout.split(b"\0") if len(entry) > 3]


async def remove_worktree(runner: GitRunner, state_dir: Path, worktree: str, *, force: bool) -> dict[str, object]:
    root, real = await trio.to_thread.run_sync(lambda: (os.path.realpath(worktree_root(state_dir)), os.path.realpath(worktree)))
    if not real.startswith(root + os.sep):
        return {"removed": False, "reason": f"{worktree} was not made by t3d; it is left alone"}
    if not await trio.Path(real).exists():
        return {"removed": False, "reason": f"{worktree} does not exist any more"}
    dirty = await worktree_status(runner, real)
    if dirty and not force:
        shown = ", ".join(dirty[:10]) + (f" and {len(dirty) - 10} more" if len(dirty) > 10 else "")
        raise GitError(
            f"the worktree {worktree} has uncommitted changes ({shown}); commit or discard them, "
            "pass force: true to delete them with the worktree, or remove_worktree: false to keep it"
        )
    info = await trio.to_thread.run_sync(repo.discover, real)
    argv = ["git", "worktree", "remove", *(["--force"] if dirty else []), real]
    await runner.run(argv, cwd=info.common_dir if info is not None else real)
    return {"removed": True, "discarded": len(dirty)}
