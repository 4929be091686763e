"""Git commands through the spawner, and refs/commits read in-process or by git.

`GitRunner.run` is the one way t3d runs git: through the spawner's ``git`` pool, with a
clean environment (no inherited ``GIT_DIR``/``GIT_INDEX_FILE``), read-only commands
marked so the spawner retries them once, and a failure raised as `GitError` carrying
git's own message. `refs_for(info, runner)` gives the `Refs` of a repository: in-process
(`repo.py`, on a worker thread) for an ordinary one, git for an unusual one; a commit
that is packed is asked of git in either case.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import trio

from t3d.errors import GitError, SpawnerError
from t3d.git import checkpoints as plan
from t3d.git import repo
from t3d.git.repo import CommitInfo, RepoInfo
from t3d.spawn.child import RunResult, Spawner

GIT_TIMEOUT_S = 120.0
_SCRUB = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR", "GIT_NAMESPACE")


class GitRunner:
    def __init__(self, spawner: Spawner) -> None:
        self._spawner = spawner
        self._base_env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        self.processes = 0  # git processes started, for statistics and tests

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        index_file: str | None = None,
        stdin: bytes = b"",
        read_only: bool = False,
        output_cap: int = plan.DIFF_CAP,
        check: bool = True,
    ) -> RunResult:
        env = {**self._base_env, **plan.git_env(index_file)}
        self.processes += 1
        try:
            result = await self._spawner.run(
                argv, cwd=cwd, env=env, stdin=stdin, kill_after=GIT_TIMEOUT_S, output_cap=output_cap,
                pool="git", read_only=read_only,
            )  # fmt: skip
        except SpawnerError as exc:
            raise GitError(f"{' '.join(argv[:3])} could not run: {exc}") from exc
        if result.timed_out:
            raise GitError(f"{' '.join(argv[:3])} in {cwd} took over {GIT_TIMEOUT_S:g} s and was stopped")
        if check and result.returncode != 0:
            detail = result.stderr.decode("utf-8", "replace").strip().splitlines()
            raise GitError(f"{' '.join(argv[:3])} in {cwd} failed: {detail[-1] if detail else f'exit {result.returncode}'}")
        return result


class Refs(Protocol):
    info: RepoInfo

    async def read_ref(self, name: str) -> str | None: ...
    async def read_commit(self, oid: str) -> CommitInfo: ...
    async def write_commit(self, tree: str, message: str) -> str: ...
    async def create_ref(self, name: str, oid: str) -> bool: ...
    async def set_ref(self, name: str, oid: str) -> None: ...


class GitRefs:
    """Refs and commits through git: for reftable, alternates, shallow and the like."""

    def __init__(self, info: RepoInfo, runner: GitRunner) -> None:
        self.info = info
        self._git = runner

    async def read_ref(self, name: str) -> str | None:
        result = await self._git.run(plan.rev_parse_argv(name), cwd=self.info.worktree, read_only=True, check=False)
        if result.returncode != 0:
            return None
        return result.stdout.decode().strip()

    async def read_commit(self, oid: str) -> CommitInfo:
        result = await self._git.run(plan.cat_commit_argv(oid), cwd=self.info.worktree, read_only=True)
        head, _, message = result.stdout.partition(b"\n\n")
        fields = [line.partition(b" ") for line in head.split(b"\n")]
        tree = next((v.decode() for k, _, v in fields if k == b"tree"), "")
        parents = tuple(v.decode() for k, _, v in fields if k == b"parent")
        return CommitInfo(oid, tree, parents, message.decode("utf-8", "replace"))

    async def write_commit(self, tree: str, message: str) -> str:
        result = await self._git.run(plan.commit_tree_argv(tree, message), cwd=self.info.worktree)
        return result.stdout.decode().strip()

    async def create_ref(self, name: str, oid: str) -> bool:
        result = await self._git.run(
            plan.create_ref_argv(name, oid, self.info.zero_oid), cwd=self.info.worktree, check=False
        )
        if result.returncode == 0:
            return True
        if await self.read_ref(name) is not None:
            return False
        raise GitError(f"git update-ref {name} failed: {result.stderr.decode('utf-8', 'replace').strip()}")

    async def set_ref(self, name: str, oid: str) -> None:
        await self._git.run(plan.set_ref_argv(name, oid), cwd=self.info.worktree)


class InProcessRefs(GitRefs):
    """Refs and loose commits read and written in-process (`repo.py`) on a worker thread."""

    async def read_ref(self, name: str) -> str | None:
        return await trio.to_thread.run_sync(repo.read_ref, self.info, name)

    async def read_commit(self, oid: str) -> CommitInfo:
        commit = await trio.to_thread.run_sync(repo.read_commit, self.info, oid)
        return commit if commit is not None else await super().read_commit(oid)  # packed: git reads it

    async def write_commit(self, tree: str, message: str) -> str:
        return await trio.to_thread.run_sync(repo.write_commit, self.info, tree, message)

    async def create_ref(self, name: str, oid: str) -> bool:
        return await trio.to_thread.run_sync(repo.create_ref, self.info, name, oid)

    async def set_ref(self, name: str, oid: str) -> None:
        await trio.to_thread.run_sync(repo.set_ref, self.info, name, oid)


def refs_for(info: RepoInfo, runner: GitRunner) -> Refs:
    return GitRefs(info, runner) if info.unusual is not None else InProcessRefs(info, runner)
