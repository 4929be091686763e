"""`Checkpoints`: the driver that takes, diffs and restores checkpoints (plan in checkpoints.py).

Rules:
- One lock per worktree (keyed by its real path) serializes every capture, baseline and
  restore there; locks are FIFO, so a turn's capture, dispatched before the next turn
  starts, runs before that turn's baseline.
- A capture runs in the directory the turn ran in (carried by the effect), whatever the
  thread does later. It never fails its turn: any `GitError` or `OSError` is recorded as
  the checkpoint's ``error``. A plain directory has no checkpoints: ``thread.create``
  says so with the reason, as do ``checkpoint.diff`` and ``checkpoint.revert``; turns
  there record nothing (no item per turn repeating it).
- Captures run as tasks of their own, at most `workers` at once, and half of that while
  admission says the loop is saturated (docs/architecture.md, Running turns); at most `MAX_PENDING` wait, and a
  capture beyond that is recorded as an error (the bound's policy), never queued unbounded.
- A baseline failure is logged and the turn starts anyway: its capture then says what
  its files are counted against (or that there is no baseline).
- A revert writes only into the thread's current worktree, only from a checkpoint taken
  there, and refuses while a turn runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from t3d.domain import commands as c
from t3d.domain.events import CaptureCheckpoint
from t3d.domain.model import Checkpoint
from t3d.errors import DomainError, GitError
from t3d.git import capture_index, repo
from t3d.git import checkpoints as plan
from t3d.git.refs import GitRunner, Refs, refs_for
from t3d.git.repo import RepoInfo
from t3d.spawn.child import Spawner
from t3d.store.store import Store

log = logging.getLogger("t3d.git")

MAX_PENDING = 1024
MAX_IDLE_LOCKS = 1024


def not_a_repo_reason(directory: str) -> str:
    return f"{directory} is not in a git repository, so this thread has no checkpoints (run git init there to get them)"


class Checkpoints:
    def __init__(
        self,
        nursery: trio.Nursery,
        store: Store,
        spawner: Spawner,
        state_dir: Path,
        *,
        saturated: Callable[[], bool] = lambda: False,
        workers: int = 8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nursery = nursery
        self._store = store
        self.git = GitRunner(spawner)
        self._index_dir = state_dir / "git" / "index"
        self._saturated = saturated
        self._workers = workers
        self._limiter = trio.CapacityLimiter(workers)
        self._clock = clock
        self._locks: dict[str, trio.Lock] = {}
        # Told each tree a capture finds (None: a revert just changed the files), keyed by the
        # worktree's real path: the workspace status counts files changed only when it moves.
        self.on_tree: Callable[[str, str | None], None] | None = None
        self.pending = 0
        self.captured = 0
        self.failed = 0

    # --- plumbing -----------------------------------------------------------------------------

    def _lock(self, worktree: str) -> trio.Lock:
        lock = self._locks.get(worktree)
        if lock is None:
            if len(self._locks) >= MAX_IDLE_LOCKS:  # drop the idle ones; a held lock stays
                for key in [k for k, v in self._locks.items() if not v.locked() and not v.statistics().tasks_waiting]:
                    del self._locks[key]
            lock = self._locks[worktree] = trio.Lock()
        return lock

    async def _repo(self, directory: str) -> RepoInfo | None:
        def find() -> RepoInfo | None:
            if not os.path.isdir(directory):
                raise GitError(f"the directory {directory} does not exist any more")
            info = repo.discover(directory)
            return None if info is None else attrs.evolve(info, worktree=os.path.realpath(info.worktree))

        return await trio.to_thread.run_sync(find)

    def _index_file(self, info: RepoInfo) -> str:
        return str(self._index_dir / hashlib.sha1(info.worktree.encode()).hexdigest()[:24])

    async def _capture_tree(self, info: RepoInfo) -> str:
        """The worktree's files (untracked included, ignored not) as a tree, through the
        worktree's own checkpoint index: HEAD, the index and branches are not touched."""
        index = self._index_file(info)
        unborn = await trio.to_thread.run_sync(capture_index.seed_index, info, index)
        try:
            tree = await (self._add_all(info, index) if unborn else self._capture_changes(info, index))
        except GitError as exc:  # e.g. its shared index was expired: start again from the repository's
            log.warning("%s: the checkpoint index was made again (%s)", info.worktree, exc)
            await trio.to_thread.run_sync(capture_index.drop_index, index)
            await trio.to_thread.run_sync(capture_index.seed_index, info, index)
            tree = await self._add_all(info, index)
        if self.on_tree is not None:
            self.on_tree(info.worktree, tree)
        return tree

    async def _capture_changes(self, info: RepoInfo, index: str) -> str:
        """Status names what changed against the checkpoint index; only that is updated."""
        out = await self.git.run(
            plan.CAPTURE_STATUS, cwd=info.worktree, index_file=index, read_only=True, output_cap=plan.CAPTURE_STATUS_CAP
        )
        if out.truncated:
            return await self._add_all(info, index)
        paths, last = await trio.to_thread.run_sync(capture_index.changed_paths, info, index, out.stdout)
        if not paths and last is not None:
            return last  # nothing changed since the last capture wrote it
        await trio.to_thread.run_sync(capture_index.forget_tree, index)
        if paths:
            await self.git.run(plan.UPDATE_INDEX, cwd=info.worktree, index_file=index, stdin=plan.update_index_stdin(paths))
        return await self._write_tree(info, index)

    async def _add_all(self, info: RepoInfo, index: str) -> str:
        await trio.to_thread.run_sync(capture_index.forget_tree, index)
        await self.git.run(plan.ADD_ALL, cwd=info.worktree, index_file=index)
        return await self._write_tree(info, index)

    async def _write_tree(self, info: RepoInfo, index: str) -> str:
        result = await self.git.run(plan.WRITE_TREE, cwd=info.worktree, index_file=index)
        tree = result.stdout.decode().strip()
        await trio.to_thread.run_sync(capture_index.remember_tree, index, tree)
        return tree

    async def _worktree_of(self, refs: Refs, oid: str) -> str | None:
        return plan.worktree_of((await refs.read_commit(oid)).message)

    # --- baseline (before a turn) -------------------------------------------------------------

    async def ensure_baseline(self, thread_id: str, ordinal: int, directory: str) -> None:
        """Make sure turn ``ordinal`` has a baseline taken in ``directory`` before it runs."""
        if ordinal < 1:
            return
        try:
            info = await self._repo(directory)
            if info is None:
                return
            refs = refs_for(info, self.git)
            async with self._lock(info.worktree):
                await self._baseline_locked(refs, thread_id, ordinal)
        except (GitError, OSError) as exc:
            log.warning("thread %s: no baseline before turn %d: %s", thread_id, ordinal, exc)

    async def _baseline_locked(self, refs: Refs, thread_id: str, ordinal: int) -> None:
        info = refs.info
        if await refs.read_ref(plan.base_ref(thread_id, ordinal)) is not None:
            return  # a revert or an earlier attempt set it
        previous = await refs.read_ref(plan.checkpoint_ref(thread_id, ordinal - 1))
        if previous is None:
            target = plan.checkpoint_ref(thread_id, ordinal - 1)
        elif await self._worktree_of(refs, previous) == info.worktree:
            return  # the steady case: the last capture is this turn's baseline
        else:
            target = plan.base_ref(thread_id, ordinal)  # the thread moved: a baseline of its own
        tree = await self._capture_tree(info)
        oid = await refs.write_commit(tree, plan.commit_message(thread_id, ordinal, info.worktree, "baseline before turn"))
        await refs.create_ref(target, oid)

    async def drop_refs(self, thread_id: str, directory: str) -> int:
        """Delete every checkpoint ref of the thread in ``directory``'s repository (two git
        processes, under the worktree's lock); how many there were. 0 for a plain directory."""
        info = await self._repo(directory)
        if info is None:
            return 0
        async with self._lock(info.worktree):
            listed = await self.git.run(
                ["git", "for-each-ref", "--format=%(refname)", plan.thread_prefix(thread_id)], cwd=info.worktree, read_only=True
            )
            names = listed.stdout.decode("utf-8", "replace").split()
            if names:
                deletes = "".join(f"delete {name}\n" for name in names).encode()
                await self.git.run(["git", "update-ref", "--stdin"], cwd=info.worktree, stdin=deletes)
        return len(names)

    # --- capture (after a turn) ---------------------------------------------------------------

    async def dispatch(self, effect: CaptureCheckpoint) -> None:
        """Start the capture in a task of its own (never blocks the effect worker)."""
        if self.pending >= MAX_PENDING:
            await self._record(self._failed(effect, f"{MAX_PENDING} checkpoints were already waiting; this one was skipped"))
            await self._store.finish_effect(effect)
            return
        self.pending += 1
        self._nursery.start_soon(self._run_capture, effect)

    async def _run_capture(self, effect: CaptureCheckpoint) -> None:
        try:
            self._limiter.total_tokens = max(1, self._workers // 2) if self._saturated() else self._workers
            async with self._limiter:
                checkpoint = await self.capture(effect)
            if checkpoint.status != "unavailable":  # a plain directory: said at thread.create, not per turn
                await self._record(checkpoint)
            await self._store.finish_effect(effect)  # not when cut short: it runs again at start-up
        finally:
            self.pending -= 1

    async def _record(self, checkpoint: Checkpoint) -> None:
        with contextlib.suppress(DomainError):  # the thread was deleted meanwhile
            await self._store.record(c.RecordCheckpoint(checkpoint))

    def _failed(self, effect: CaptureCheckpoint, error: str, status: str = "error") -> Checkpoint:
        return Checkpoint(
            id=f"{effect.thread_id}:{effect.ordinal}",
            thread_id=effect.thread_id,
            turn_id=effect.turn_id,
            ordinal=effect.ordinal,
            worktree=effect.worktree,
            status=status,  # type: ignore[arg-type]
            created_at=self._clock(),
            error=error,
        )

    async def capture(self, effect: CaptureCheckpoint) -> Checkpoint:
        """Take turn ``effect.ordinal``'s checkpoint in ``effect.worktree``; never raises for git."""
        try:
            info = await self._repo(effect.worktree)
            if info is None:
                return self._failed(effect, not_a_repo_reason(effect.worktree), "unavailable")
            refs = refs_for(info, self.git)
            async with self._lock(info.worktree):
                checkpoint = await self._capture_locked(refs, effect)
        except (GitError, OSError) as exc:
            self.failed += 1
            log.warning("thread %s: checkpoint of turn %d failed: %s", effect.thread_id, effect.ordinal, exc)
            return self._failed(effect, str(exc))
        self.captured += 1
        return checkpoint

    async def _capture_locked(self, refs: Refs, effect: CaptureCheckpoint) -> Checkpoint:
        info, thread_id, ordinal = refs.info, effect.thread_id, effect.ordinal
        ref = plan.checkpoint_ref(thread_id, ordinal)
        oid = await refs.read_ref(ref)
        if oid is None:
            tree = await self._capture_tree(info)
            oid = await refs.write_commit(tree, plan.commit_message(thread_id, ordinal, info.worktree, "after turn"))
            if not await refs.create_ref(ref, oid):
                oid = await refs.read_ref(ref) or oid
        commit = await refs.read_commit(oid)  # a late capture keeps the ref it finds
        base_name = plan.base_ref(thread_id, ordinal)
        base = await refs.read_ref(base_name)
        if base is None:
            base_name = plan.checkpoint_ref(thread_id, ordinal - 1)
            base = await refs.read_ref(base_name)
        files: dict[str, Any] = plan.summarize_files([])
        if base is not None:
            base_tree = (await refs.read_commit(base)).tree
            if base_tree != commit.tree:  # unchanged files cost no diff
                out = await self.git.run(plan.numstat_argv(base_tree, commit.tree), cwd=info.worktree, read_only=True)
                files = plan.summarize_files(plan.parse_numstat(out.stdout))
        return Checkpoint(
            id=f"{thread_id}:{ordinal}",
            thread_id=thread_id,
            turn_id=effect.turn_id,
            ordinal=ordinal,
            worktree=info.worktree,
            status="ok",
            created_at=self._clock(),
            ref=ref,
            commit=oid,
            base_ref=base_name if base is not None else None,
            files=files["files"],
            additions=files["additions"],
            deletions=files["deletions"],
            error=None if base is not None else "no baseline: the files are not counted",
        )

    # --- diff and revert ----------------------------------------------------------------------

    async def _endpoint(self, refs: Refs, thread_id: str, ordinal: int, *, as_start_of: int | None) -> str:
        """A checkpoint's commit; as the start of turn ``as_start_of``, that turn's own
        baseline when it has one (the thread moved or reverted before it)."""
        if as_start_of is not None:
            own = await refs.read_ref(plan.base_ref(thread_id, as_start_of))
            if own is not None:
                return own
        oid = await refs.read_ref(plan.checkpoint_ref(thread_id, ordinal))
        if oid is None:
            raise GitError(f"thread {thread_id} has no checkpoint {ordinal}; list its checkpoints in the thread's checkpoint items")
        return oid

    async def diff(self, thread_id: str, from_ordinal: int, to_ordinal: int, directory: str) -> tuple[str, bool]:
        """The unified diff between two checkpoints, and whether git's output was cut."""
        info = await self._repo(directory)
        if info is None:
            raise GitError(not_a_repo_reason(directory))
        refs = refs_for(info, self.git)
        start = from_ordinal + 1 if from_ordinal < to_ordinal else None
        a = await self._endpoint(refs, thread_id, from_ordinal, as_start_of=start)
        b = await self._endpoint(refs, thread_id, to_ordinal, as_start_of=None)
        wa, wb = await self._worktree_of(refs, a), await self._worktree_of(refs, b)
        if wa != wb:
            raise GitError(
                f"checkpoints {from_ordinal} and {to_ordinal} were taken in different directories ({wa} and {wb}); "
                "diff checkpoints of one directory"
            )
        out = await self.git.run(plan.diff_argv(a, b), cwd=info.worktree, read_only=True)
        return out.stdout.decode("utf-8", "replace"), out.truncated

    async def revert(self, thread_id: str, ordinal: int, next_ordinal: int, directory: str) -> dict[str, Any]:
        """Restore ``directory``'s files to checkpoint ``ordinal`` (files created since are
        deleted, ignored files untouched); turn ``next_ordinal`` will start from it."""
        info = await self._repo(directory)
        if info is None:
            raise GitError(not_a_repo_reason(directory))
        refs = refs_for(info, self.git)
        async with self._lock(info.worktree):
            target = await self._endpoint(refs, thread_id, ordinal, as_start_of=None)
            commit = await refs.read_commit(target)
            taken_in = plan.worktree_of(commit.message)
            if taken_in != info.worktree:
                raise GitError(
                    f"checkpoint {ordinal} was taken in {taken_in}, but the thread now works in {info.worktree}; "
                    "a revert never writes one directory's files into another"
                )
            current = await self._capture_tree(info)
            out = await self.git.run(plan.name_status_argv(commit.tree, current), cwd=info.worktree, read_only=True)
            restore, delete = plan.parse_name_status(out.stdout)
            restore = [p for p in restore if not plan.unsafe_path(p)]
            delete = [p for p in delete if not plan.unsafe_path(p)]
            if restore:
                scratch = self._index_file(info) + ".restore"
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(scratch)
                try:
                    await self.git.run(plan.read_tree_argv(commit.tree), cwd=info.worktree, index_file=scratch)
                    await self.git.run(
                        plan.CHECKOUT_INDEX_STDIN, cwd=info.worktree, index_file=scratch, stdin=plan.checkout_stdin(restore)
                    )
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(scratch)
            await trio.to_thread.run_sync(_delete_files, info.worktree, delete)
            if self.on_tree is not None:
                self.on_tree(info.worktree, None)
            await refs.set_ref(plan.base_ref(thread_id, next_ordinal), target)
        return {"restored": len(restore), "deleted": len(delete), "commit": target}

    def statistics(self) -> dict[str, Any]:
        return {
            "git_processes": self.git.processes,
            "captured": self.captured,
            "failed": self.failed,
            "pending": self.pending,
            "repo_cache": repo.cache_statistics(),
        }


def _delete_files(worktree: str, paths: list[str]) -> None:
    """Delete files created after the checkpoint, then the directories they leave empty."""
    for rel in paths:
        path = os.path.join(worktree, rel)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        parent = os.path.dirname(path)
        while parent != worktree and parent.startswith(worktree + os.sep):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)

