"""`WorkspaceStatuses`: every thread's workspace status, kept in memory and pushed to watchers.

A thread's workspace is its directory: its worktree, or its project's directory. Threads
in one directory share one status (`_Dir`). Nothing here is written to the database:
values live in memory, go out in shell rows and as ``workspace.updated`` notifications
(through the callbacks the daemon wires to the hub), and are re-read after a restart.

Rules:
- Leases: a directory is watched while a shell subscription exists (every unarchived
  thread's directory), a thread subscription follows one of its threads, or a
  ``workspace.status`` call asked for it in the last `LEASE_S`. Only watched directories
  are looked at; the others keep their last value and are looked at again once watched.
- Every ``interval`` seconds the watched directories' files are stamped on one worker
  thread (`status.unchanged`: a few stat calls each) and `status.plan` says what must run:
  usually nothing, so a steady workspace costs no git process. git runs through the
  spawner's git pool, at most `GIT_WORKERS` at once (checkpoints keep the rest).
- The worktree's files count as changed after a turn: when checkpoints are on, only if
  the capture's tree differs from the last one seen there (`files_seen`), so a turn that
  changed nothing costs no status; when they are off, after every turn's end.
- A refresh that fails keeps the last counts, shows the error, and is retried after
  ``interval`` doubling to `RETRY_MAX_S`, never in a tight loop.
- Pull requests (`t3d.git.prs`) are asked about only for watched directories.
- Bounded: one `_Dir` per directory some thread names, one last tree per repository
  one of them is in; one cached commit subject per commit, at most `MAX_COMMITS` (the
  least recently used dropped).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import trio

from t3d.domain.codec import dumps_sized
from t3d.domain.model import TERMINAL_TURN_STATUSES, Project, Thread, Turn
from t3d.errors import GitError
from t3d.git import forge
from t3d.git import status as st
from t3d.git.forge import PrQuery
from t3d.git.prs import PullRequests
from t3d.git.refs import GitRunner, refs_for
from t3d.spawn.child import Spawner
from t3d.store.commit import Committed
from t3d.store.store import Store

log = logging.getLogger("t3d.git.status")

LEASE_S = 60.0
GIT_WORKERS = 2
RETRY_MAX_S = 300.0
MAX_COMMITS = 1024

Publish = Callable[[str, frozenset[str], bytes], None]
Watchers = Callable[[], tuple[bool, frozenset[str]]]


@attrs.define(eq=False)
class _Dir:
    path: str
    threads: set[str] = attrs.Factory(set)
    look: st.Look | None = None
    counts: st.Counts | None = None
    last_commit: dict[str, str] | None = None
    error: str | None = None
    files_changed: bool = True
    failures: int = 0
    next_check: float = 0.0
    lease_until: float = 0.0
    repository: str | None = None  # the real path of the checkout's top (what captures name)
    query: PrQuery | None = None
    data: bytes = b""
    value: dict[str, Any] = attrs.Factory(dict)
    refreshing: trio.Event | None = None  # set while a refresh runs; set() when it ends


class WorkspaceStatuses:
    def __init__(
        self,
        store: Store,
        *,
        publish: Publish,
        watchers: Watchers,
        interval: float,
        pull_requests: bool,
        files_follow_checkpoints: bool,
        forge_workers: int = 4,
    ) -> None:
        self._store = store
        self._publish_cb = publish
        self._watchers = watchers
        self._interval = interval
        self._pull_requests = pull_requests
        self._follow_checkpoints = files_follow_checkpoints
        self._forge_workers = forge_workers
        self._projects: dict[str, str] = {}
        self._threads: dict[
            str, tuple[str, str | None, bool]
        ] = {}  # id -> (project, worktree, archived)
        self._thread_dir: dict[str, str] = {}
        self._dirs: dict[str, _Dir] = {}
        self._trees: dict[str, str] = {}  # repository -> the last checkpoint tree seen there
        self._commits: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._applied: dict[str, int] | None = {}  # while loading: entity id -> sequence applied
        self._wake = trio.Event()
        self._git: GitRunner | None = None
        self._prs: PullRequests | None = None
        self._nursery: trio.Nursery | None = None
        self._limiter = trio.CapacityLimiter(GIT_WORKERS)
        self.checks = 0
        self.refreshes = {"full": 0, "ahead_behind": 0, "refs": 0}

    # --- what the hub asks (rows, bases) ---------------------------------------------------

    def row(self, thread_id: str) -> bytes | None:
        d = self._dirs.get(self._thread_dir.get(thread_id, ""))
        return d.data if d is not None else None

    def rows(self) -> dict[str, bytes]:
        return {tid: self._dirs[d].data for tid, d in self._thread_dir.items() if d in self._dirs}

    def of_thread(self, thread_id: str) -> tuple[str, bytes] | None:
        d = self._dirs.get(self._thread_dir.get(thread_id, ""))
        return (d.path, d.data) if d is not None else None

    def every(self) -> dict[str, bytes]:
        return {path: d.data for path, d in self._dirs.items()}

    def watchers_changed(self) -> None:
        self._wake.set()

    # --- which thread works where -------------------------------------------------------------

    def on_commit(self, committed: Committed) -> None:
        """Follow projects and threads (before the hub publishes their rows)."""
        for event in committed.events:
            entity = event.entity
            if self._applied is not None:
                self._applied[getattr(entity, "id", "")] = event.sequence
            if isinstance(entity, Project):
                self._projects[entity.id] = entity.path
                self._remap(t for t, v in self._threads.items() if v[0] == entity.id)
            elif isinstance(entity, Thread):
                if event.kind == "thread.deleted":
                    self._threads.pop(entity.id, None)
                else:
                    self._threads[entity.id] = (
                        entity.project_id,
                        entity.worktree_path,
                        entity.archived_at is not None,
                    )
                self._remap((entity.id,))
            elif (
                isinstance(entity, Turn)
                and not self._follow_checkpoints
                and entity.status in TERMINAL_TURN_STATUSES
            ):
                d = self._dirs.get(self._thread_dir.get(entity.thread_id, ""))
                if d is not None:
                    d.files_changed = True
                    self._wake.set()

    def _remap(self, thread_ids: Iterable[str]) -> None:
        for tid in list(thread_ids):
            old = self._thread_dir.pop(tid, None)
            spec = self._threads.get(tid)
            new = None if spec is None else (spec[1] or self._projects.get(spec[0]))
            if old is not None and old != new and old in self._dirs:
                self._dirs[old].threads.discard(tid)
                if not self._dirs[old].threads:
                    del self._dirs[old]
            if new is None:
                continue
            self._thread_dir[tid] = new
            d = self._dirs.get(new)
            if d is None:
                d = self._dirs[new] = _Dir(new)
                self._set_value(d, st.unknown_value(new), publish=False)
            d.threads.add(tid)

    async def _load(self) -> None:
        shell = await self._store.shell()
        applied = self._applied or {}
        sequence = shell["sequence"]
        for project in shell["projects"]:
            if applied.get(project["id"], 0) <= sequence:
                self._projects[project["id"]] = project["path"]
        for thread in shell["threads"]:
            if applied.get(thread["id"], 0) <= sequence:
                self._threads[thread["id"]] = (
                    thread["project_id"],
                    thread.get("worktree_path"),
                    thread.get("archived_at") is not None,
                )
        self._applied = None
        self._remap(list(self._threads))

    # --- turns ----------------------------------------------------------------------------

    def files_seen(self, repository: str, tree: str | None) -> None:
        """A checkpoint saw ``repository``'s files as ``tree`` (None: they were just changed, by
        a revert). A new tree means the status counts may have moved."""
        if tree is not None and self._trees.get(repository) == tree:
            return
        mine = [d for d in self._dirs.values() if d.repository == repository]
        if tree is None or not mine:  # kept only for repositories a workspace is in (the bound)
            self._trees.pop(repository, None)
        else:
            self._trees[repository] = tree
        for d in mine:
            d.files_changed = True
            self._wake.set()

    # --- the driver -------------------------------------------------------------------------

    async def run(
        self, spawner: Spawner, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Look at watched workspaces until cancelled."""
        self._git = GitRunner(spawner)
        await self._load()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._prs = PullRequests(
                spawner,
                workers=self._forge_workers,
                changed=self._pr_changed,
                clock=trio.current_time,
            )
            task_status.started()
            while True:
                await self._tick(nursery)
                with trio.move_on_after(self._interval):
                    await self._wake.wait()
                self._wake = trio.Event()

    def _watched(self, now: float) -> list[_Dir]:
        """The watched directories, those a thread subscriber looks at first."""
        shell, followed = self._watchers()
        near = {self._thread_dir[t] for t in followed if t in self._thread_dir}
        paths = set(near) | {p for p, d in self._dirs.items() if d.lease_until > now}
        if shell:
            paths |= {
                self._thread_dir[t]
                for t, spec in self._threads.items()
                if not spec[2] and t in self._thread_dir
            }
        return sorted(
            (self._dirs[p] for p in paths if p in self._dirs), key=lambda d: d.path not in near
        )

    async def _tick(self, nursery: trio.Nursery) -> None:
        now = trio.current_time()
        watched = self._watched(now)
        due = [d for d in watched if d.refreshing is None and now >= d.next_check]
        if due:
            self.checks += 1
            looks = await trio.to_thread.run_sync(
                _look_all, [(d.path, None if d.files_changed else d.look) for d in due]
            )
            for d, new in zip(due, looks, strict=True):
                if new is not None and d.refreshing is None:
                    self._start(nursery, d, new)
        if self._pull_requests and self._prs is not None:
            wanted = [(d.query, d.repository or d.path) for d in watched if d.query is not None]
            self._prs.start_due(nursery, wanted)
            self._prs.forget(d.query for d in self._dirs.values() if d.query is not None)

    def _start(self, nursery: trio.Nursery, d: _Dir, new: tuple[st.Look, str | None]) -> None:
        look, repository = new
        work = st.plan(d.look, look, files_changed=d.files_changed, had_counts=d.counts is not None)
        d.repository = repository
        if work == "none" and d.look is not None:
            d.look = look
            return
        d.refreshing = trio.Event()
        nursery.start_soon(self._refresh, d, look, work)

    async def _refresh(self, d: _Dir, look: st.Look, work: st.Work) -> None:
        assert d.refreshing is not None and self._git is not None
        d.files_changed = False
        try:
            counts, commit = d.counts, d.last_commit
            if look.info is not None and work in ("full", "ahead_behind"):
                async with self._limiter:
                    counts = await self._counts(look, d.counts, work)
            head = look.refs.head if look.refs is not None else (counts.oid if counts else None)
            if look.info is not None and head is not None:
                commit = await self._commit(look, head)
            d.look, d.counts, d.last_commit, d.error, d.failures = (
                look,
                counts,
                commit if head else None,
                look.error,
                0,
            )
            self.refreshes[work if work != "none" else "refs"] += 1
            d.next_check = 0.0
        except (GitError, OSError) as exc:
            d.look, d.error = look, str(exc)
            d.files_changed = True  # the next look runs git again, after the retry delay
            d.failures += 1
            d.next_check = trio.current_time() + min(RETRY_MAX_S, self._interval * 2**d.failures)
            if d.failures == 1:
                log.warning("workspace status of %s failed: %s", d.path, exc)
        finally:
            event, d.refreshing = d.refreshing, None
            event.set()
        self._compose(d)

    async def _counts(self, look: st.Look, old: st.Counts | None, work: st.Work) -> st.Counts:
        assert self._git is not None and look.info is not None
        cwd = look.info.worktree
        if (
            work == "ahead_behind"
            and old is not None
            and look.refs is not None
            and look.refs.head
            and look.refs.upstream_oid
        ):
            out = await self._git.run(
                st.ahead_behind_argv(look.refs.head, look.refs.upstream_oid),
                cwd=cwd,
                read_only=True,
            )
            ab = st.parse_ahead_behind(out.stdout)
            if ab is not None:
                return attrs.evolve(old, upstream=look.refs.upstream, ahead=ab[0], behind=ab[1])
        out = await self._git.run(st.STATUS_ARGV, cwd=cwd, read_only=True, output_cap=st.STATUS_CAP)
        return st.parse_status(out.stdout, truncated=out.truncated)

    async def _commit(self, look: st.Look, oid: str) -> dict[str, str]:
        cached = self._commits.get(oid)
        if cached is not None:
            self._commits.move_to_end(oid)
            return cached
        assert self._git is not None and look.info is not None
        commit = await refs_for(look.info, self._git).read_commit(oid)
        value = {"oid": oid, "subject": st.subject(commit.message)}
        self._commits[oid] = value
        while len(self._commits) > MAX_COMMITS:
            self._commits.popitem(last=False)
        return value

    # --- values -----------------------------------------------------------------------------

    def _compose(self, d: _Dir) -> None:
        look = d.look
        if look is None:
            return
        branch = (
            look.refs.branch if look.refs is not None else (d.counts.branch if d.counts else None)
        )
        upstream = st.tracked(look, branch)
        remote = forge.parse_remote(upstream.url) if upstream is not None else None
        d.query = (
            PrQuery(remote, upstream.branch)
            if remote is not None and upstream is not None
            else None
        )
        pr = (
            self._prs.value(d.query)
            if self._pull_requests and self._prs is not None and d.query is not None
            else None
        )
        value = st.status_value(
            d.path, look, d.counts, last_commit=d.last_commit, error=d.error, pr=pr
        )
        self._set_value(d, value)

    def _set_value(self, d: _Dir, value: dict[str, Any], *, publish: bool = True) -> None:
        data = dumps_sized(value)
        if data == d.data:
            return
        d.value, d.data = value, data
        if publish:
            self._publish_cb(d.path, frozenset(d.threads), data)

    def _pr_changed(self, query: PrQuery) -> None:
        for d in self._dirs.values():
            if d.query == query:
                self._compose(d)

    # --- workspace.status -------------------------------------------------------------------

    async def status_of(self, thread_id: str, *, refresh: bool) -> dict[str, Any] | None:
        """The thread's workspace now: looked at (and git asked if anything changed, or with
        ``refresh`` in any case); the directory is then watched for `LEASE_S`."""
        path = self._thread_dir.get(thread_id)
        if path is None or self._git is None or self._nursery is None:
            return None if path is None else self._dirs[path].value
        d = self._dirs[path]
        d.lease_until = trio.current_time() + LEASE_S
        while d.refreshing is not None:
            await d.refreshing.wait()
        if refresh:
            d.files_changed = True
        [new] = await trio.to_thread.run_sync(
            _look_all, [(d.path, None if d.files_changed else d.look)]
        )
        if new is not None and d.refreshing is None:
            self._start(self._nursery, d, new)
        if d.refreshing is not None:
            await d.refreshing.wait()
        self._wake.set()  # the lease may start pull-request probes
        return d.value

    def statistics(self) -> dict[str, Any]:
        now = trio.current_time() if trio.lowlevel.in_trio_run() else 0.0
        watched = self._watched(now) if self._git is not None else []
        return {
            "workspaces": len(self._dirs),
            "watched": len(watched),
            "checks": self.checks,
            "git_processes": self._git.processes if self._git is not None else 0,
            "refreshes": dict(self.refreshes),
            "pull_requests": self._prs.statistics() if self._prs is not None else None,
        }


def _look_all(wanted: list[tuple[str, st.Look | None]]) -> list[tuple[st.Look, str | None] | None]:
    """For each (directory, last look): None if nothing it depends on changed, else a new
    look and the real path of its checkout's top. Blocking: on a worker thread."""
    out: list[tuple[st.Look, str | None] | None] = []
    for path, last in wanted:
        if last is not None and st.unchanged(last):
            out.append(None)
            continue
        new = st.look(path)
        repository = None
        if new.info is not None:
            with contextlib.suppress(OSError):
                repository = os.path.realpath(new.info.worktree)
        out.append((new, repository))
    return out
