"""The git side of the JSON-RPC methods: workspaces, checkpoint diff and revert, moves.

`GitMethods` checks the git-specific params, does the git work through `Checkpoints`
and the worktree helpers, and commits the domain command. `Methods` (t3d/api/methods.py)
calls `prepare_workspace` and `delete_thread` from ``thread.create`` and
``thread.delete``, and serves `table`. Git failures become ``invalid`` errors carrying
git's reason and what to do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from t3d.api.jsonrpc import DOMAIN_CODES, INVALID_PARAMS, NOT_FOUND, UNAVAILABLE, Params, RpcError
from t3d.domain import commands as c
from t3d.errors import GitError
from t3d.git import checkpoints as plan
from t3d.git import repo
from t3d.git.service import Checkpoints, not_a_repo_reason
from t3d.git.workspaces import WorkspaceStatuses
from t3d.git.worktrees import Workspace, create_worktree, remove_worktree
from t3d.store.store import Store

Commit = Callable[[Params, c.Command], Awaitable[dict[str, Any]]]


def _git_error(exc: GitError) -> RpcError:
    return RpcError(DOMAIN_CODES["invalid"], str(exc))


def parse_workspace(raw: Any) -> tuple[str, str | None, str | None]:
    """``"root"`` (or absent) or ``{"worktree": {"base_ref"?, "branch"?}}`` -> (kind, base_ref, branch). Pure."""
    if raw is None or raw == "root":
        return "root", None, None
    if isinstance(raw, dict) and set(raw) == {"worktree"} and isinstance(raw["worktree"], dict):
        spec = raw["worktree"]
        extra = set(spec) - {"base_ref", "branch"}
        values = [spec.get("base_ref"), spec.get("branch")]
        if not extra and all(v is None or (isinstance(v, str) and 0 < len(v) <= 200) for v in values):
            return "worktree", values[0], values[1]
    raise RpcError(
        INVALID_PARAMS,
        'workspace must be "root" or {"worktree": {"base_ref"?: string, "branch"?: string}}',
    )


class GitMethods:
    def __init__(
        self, store: Store, checkpoints: Checkpoints, state_dir: Path, *, statuses: WorkspaceStatuses | None = None
    ) -> None:
        self._store = store
        self._checkpoints = checkpoints
        self._state_dir = state_dir
        self._statuses = statuses
        self.has_status = statuses is not None  # server.hello lists workspace_status
        self.table = {
            "checkpoint.diff": self.checkpoint_diff,
            "checkpoint.revert": self.checkpoint_revert,
            "thread.move": self.thread_move,
            "workspace.status": self.workspace_status,
        }
        self.commit: Commit | None = None  # set by Methods: its receipt-keeping commit

    async def prepare_workspace(self, project_id: str, thread_id: str, raw: Any) -> Workspace:
        kind, base_ref, branch = parse_workspace(raw)
        if kind == "root":
            return Workspace(None, None)
        projects = {p["id"]: p for p in await self._store.projects()}
        project = projects.get(project_id)
        if project is None:
            raise RpcError(NOT_FOUND, f"project {project_id!r} does not exist; create it with project.create")
        try:
            return await create_worktree(
                self._checkpoints.git, self._state_dir, project["path"], project_id, thread_id, base_ref, branch
            )
        except GitError as exc:
            raise _git_error(exc) from None

    async def checkpoint_support(self, project_id: str, workspace: Workspace | None) -> dict[str, Any]:
        """Whether the new thread's turns get checkpoints, and why not (a plain directory)."""
        directory = workspace.worktree_path if workspace and workspace.worktree_path else None
        if directory is None:
            projects = {p["id"]: p for p in await self._store.projects()}
            directory = projects[project_id]["path"] if project_id in projects else None
        if directory is None:
            return {"enabled": False, "reason": "the project does not exist"}
        info = await trio.to_thread.run_sync(repo.discover, directory)
        if info is None:
            return {"enabled": False, "reason": not_a_repo_reason(directory)}
        return {"enabled": True, "repository": info.worktree, "in_process": info.unusual is None, "unusual": info.unusual}

    async def drop_workspace(self, workspace: Workspace) -> None:
        """Undo `prepare_workspace` when the thread could not be created."""
        if workspace.worktree_path is not None:
            with contextlib.suppress(GitError):  # left for the user; the error they get is the thread's
                await remove_worktree(self._checkpoints.git, self._state_dir, workspace.worktree_path, force=True)

    async def _remove_worktree(self, thread: dict[str, Any] | None, *, remove: bool, force: bool) -> dict[str, Any]:
        """Remove the thread's worktree (``remove``) if it is clean or ``force`` is given; a
        dirty one refuses the delete."""
        if thread is None or not thread.get("worktree_path") or not remove:
            return {}
        try:
            return {"worktree": await remove_worktree(self._checkpoints.git, self._state_dir, thread["worktree_path"], force=force)}
        except GitError as exc:
            raise RpcError(DOMAIN_CODES["conflict"], str(exc)) from None

    async def delete_thread(
        self, thread_id: str, commit: Callable[[], Awaitable[dict[str, Any]]], *, remove_worktree: bool, force: bool
    ) -> dict[str, Any]:
        """``thread.delete`` with its git side: the worktree first (`_remove_worktree`), then the
        delete, then the thread's checkpoint refs, so deleted threads leave no hidden refs
        (and no unreachable history) behind in the repository."""
        context = await self._store.thread_context(thread_id)
        thread = None if context is None else context[0]
        removed = await self._remove_worktree(thread, remove=remove_worktree, force=force)
        result = {**await commit(), **removed}
        if context is not None:
            try:
                result["checkpoint_refs_removed"] = await self._checkpoints.drop_refs(thread_id, context[1]["path"])
            except GitError as exc:  # the thread is gone already; say what is left behind
                result["checkpoint_refs_error"] = f"{exc}; remove them with: git for-each-ref {plan.thread_prefix(thread_id)}"
        return result

    async def _thread(self, thread_id: str) -> tuple[dict[str, Any], str, int, bool]:
        """The thread, its directory, its last turn's ordinal and whether a turn is open."""
        snapshot = await self._store.snapshot(thread_id, turn_limit=1)
        if snapshot is None:
            raise RpcError(NOT_FOUND, f"thread {thread_id!r} does not exist; list threads with GET /api/shell")
        thread = snapshot["thread"]
        directory = thread.get("worktree_path")
        if not directory:
            projects = {p["id"]: p for p in await self._store.projects()}
            directory = projects[thread["project_id"]]["path"]
        turns = snapshot["turns"]
        last = max((t["ordinal"] for t in turns), default=0)
        busy = any(t["status"] not in ("completed", "interrupted", "failed", "cancelled") for t in turns)
        return thread, directory, last, busy

    async def checkpoint_diff(self, p: Params) -> Any:
        thread_id = p.str("thread_id", max_len=200)
        a = p.opt_int("from_ordinal", default=None, low=0, high=1 << 31)
        b = p.opt_int("to_ordinal", default=None, low=0, high=1 << 31)
        offset = p.opt_int("offset", default=0, low=0, high=1 << 40)
        limit = p.opt_int("limit", default=plan.DIFF_PAGE, low=1024, high=plan.DIFF_PAGE)
        p.check()
        if a is None or b is None:
            raise RpcError(INVALID_PARAMS, "from_ordinal and to_ordinal are required (0 is the state before the first turn)")
        _, directory, _, _ = await self._thread(thread_id)
        try:
            text, cut = await self._checkpoints.diff(thread_id, a, b, directory)
        except GitError as exc:
            raise _git_error(exc) from None
        chunk, next_offset = plan.page(text, offset, limit)
        return {
            "thread_id": thread_id,
            "from_ordinal": a,
            "to_ordinal": b,
            "diff": chunk,
            "offset": offset,
            "next_offset": next_offset,
            "total_chars": len(text),
            "truncated": cut,  # git's output passed the 8 MiB cap: the diff is cut there
        }

    async def checkpoint_revert(self, p: Params) -> Any:
        thread_id = p.str("thread_id", max_len=200)
        ordinal = p.opt_int("ordinal", default=None, low=0, high=1 << 31)
        p.check()
        if ordinal is None:
            raise RpcError(INVALID_PARAMS, "ordinal is required: the checkpoint (turn ordinal, 0 = before the first turn) to restore")
        _, directory, last, busy = await self._thread(thread_id)
        if busy:
            raise RpcError(DOMAIN_CODES["conflict"], f"thread {thread_id!r} has a turn running or queued; interrupt it or wait, then revert")
        if ordinal > last:
            raise RpcError(DOMAIN_CODES["invalid"], f"thread {thread_id!r} has no turn {ordinal} (its last is {last})")
        try:
            restored = await self._checkpoints.revert(thread_id, ordinal, last + 1, directory)
        except GitError as exc:
            raise _git_error(exc) from None
        assert self.commit is not None
        result = await self.commit(p, c.MarkReverted(thread_id, ordinal))
        return {**result, **restored, "directory": directory}

    async def thread_move(self, p: Params) -> Any:
        """Work in another directory from the next turn on: ``workspace`` as in thread.create."""
        thread_id = p.str("thread_id", max_len=200)
        raw = p.raw("workspace")
        p.check()
        thread, _, _, busy = await self._thread(thread_id)
        if busy:
            raise RpcError(DOMAIN_CODES["conflict"], f"thread {thread_id!r} has a turn running or queued; wait for it to end, then move it")
        suffix = os.urandom(3).hex()
        workspace = await self.prepare_workspace(thread["project_id"], f"{thread_id}-{suffix}", raw)
        assert self.commit is not None
        try:
            return await self.commit(p, c.MoveThread(thread_id, workspace.worktree_path, workspace.branch))
        except RpcError:
            await self.drop_workspace(workspace)
            raise

    async def workspace_status(self, p: Params) -> Any:
        """The thread's workspace status now (git asked only if a file it depends on changed,
        or with ``refresh``); its directory is then watched for a minute."""
        thread_id = p.str("thread_id", max_len=200)
        refresh = p.opt_bool("refresh", default=False)
        p.check()
        if self._statuses is None:
            raise RpcError(UNAVAILABLE, "workspace status is off on this daemon (--workspace-status off); start it with --workspace-status on")
        value = await self._statuses.status_of(thread_id, refresh=refresh)
        if value is None:
            raise RpcError(NOT_FOUND, f"thread {thread_id!r} does not exist; list threads with GET /api/shell")
        return {"thread_id": thread_id, "workspace": value}
