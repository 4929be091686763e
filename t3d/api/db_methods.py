"""The ``db.*`` methods: database statistics, and maintenance jobs with progress.

``db.stats`` answers at once (one read on the reader pool). ``db.prune``,
``db.vacuum``, ``db.check`` and ``db.backup`` start a job and answer with it; the
job runs in the daemon's nursery whatever happens to the connection that
started it, and ``db.job`` tells how far it got (``phase``, ``done`` of
``total`` units, 0 of 0 when SQLite cannot tell) and, once it ended, its
``result`` or ``error``; ``db.cancel`` stops it between two steps.

One job runs at a time: a second is refused with the running job's id. The
last `KEEP_JOBS` finished jobs are kept for ``db.job``; older ones are forgotten.
These methods take no ``command_id``: a retried ``db.prune`` or ``db.vacuum``
finds less to do and does no harm; a retried ``db.backup`` is refused because
its file exists.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from t3d.api.jsonrpc import CONFLICT, DOMAIN_CODES, NOT_FOUND, Params, RpcError
from t3d.errors import StoreError
from t3d.store import maintenance
from t3d.store.pruner import Pruner
from t3d.store.read_classes import ReadClass
from t3d.store.retention_plan import Pass
from t3d.store.store import Store

KEEP_JOBS = 16
JOB_STATES = ("running", "done", "failed", "cancelled")

Work = Callable[[maintenance.Progress], Awaitable[dict[str, Any]]]


@attrs.define(eq=False)
class Job:
    id: str
    kind: str
    params: dict[str, Any]
    started_at: float  # seconds since the epoch
    started: float  # trio clock
    scope: trio.CancelScope
    cancellable: bool = True
    state: str = "running"
    phase: str = "starting"
    done: int = 0
    total: int = 0
    finished: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None

    def progress(self, phase: str, done: int, total: int) -> None:
        self.phase, self.done, self.total = phase, done, total

    def as_json(self) -> dict[str, Any]:
        end = self.finished if self.finished is not None else trio.current_time()
        return {
            "job_id": self.id,
            "kind": self.kind,
            "params": self.params,
            "state": self.state,
            "phase": self.phase,
            "done": self.done,
            "total": self.total,
            "started_at": self.started_at,
            "elapsed_s": round(end - self.started, 3),
            "result": self.result,
            "error": self.error,
        }


class DbJobs:
    """The running job and the last finished ones (see the module docstring)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._ids = itertools.count(1)
        self._running: Job | None = None
        self._finished: deque[Job] = deque(maxlen=KEEP_JOBS)

    def start(self, kind: str, params: dict[str, Any], work: Work, *, cancellable: bool = True) -> Job:
        if self._running is not None:
            raise RpcError(
                CONFLICT,
                f"a db.{self._running.kind} job ({self._running.id}) is running; one runs at a time: "
                "follow it with db.job, or stop it with db.cancel",
            )
        job = Job(f"j{next(self._ids)}", kind, params, time.time(), trio.current_time(), trio.CancelScope(), cancellable)
        self._running = job
        self._nursery.start_soon(self._run, job, work)
        return job

    async def _run(self, job: Job, work: Work) -> None:
        try:
            with job.scope:
                job.result = await work(job.progress)
                job.state = "done"
        except StoreError as exc:
            job.state, job.error = "failed", str(exc)
        finally:
            if job.state == "running":
                job.state = "cancelled"
            job.finished = trio.current_time()
            self._running = None
            self._finished.append(job)

    def get(self, job_id: str) -> Job:
        for job in (self._running, *self._finished):
            if job is not None and job.id == job_id:
                return job
        raise RpcError(NOT_FOUND, f"no db job {job_id!r}; only the running one and the last {KEEP_JOBS} are kept")

    def running(self) -> Job | None:
        return self._running


class DbMethods:
    def __init__(self, store: Store, pruner: Pruner, jobs: DbJobs, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._pruner = pruner
        self._jobs = jobs
        self._clock = clock
        self.table = {
            "db.stats": self.stats,
            "db.prune": self.prune,
            "db.vacuum": self.vacuum,
            "db.check": self.check,
            "db.backup": self.backup,
            "db.job": self.job,
            "db.cancel": self.cancel,
        }

    async def stats(self, p: Params) -> Any:
        """Sizes, free pages, events by kind and age, the largest threads, retention's cursors."""
        p.check()
        query = maintenance.stats_query(self._store.path, self._clock())
        return await self._store.read(query, _same, ReadClass.HISTORY)

    async def prune(self, p: Params) -> Any:
        """A retention pass now, with the configured ages; ``dry_run`` counts instead."""
        dry_run = p.opt_bool("dry_run", default=False)
        p.check()

        async def work(progress: maintenance.Progress) -> dict[str, Any]:
            def seen(plan: Pass) -> None:
                progress(plan.phase(), plan.done, plan.total)

            return (await self._pruner.run_pass(dry_run=dry_run, progress=seen)).as_json()

        return self._jobs.start("prune", {"dry_run": dry_run}, work).as_json()

    async def vacuum(self, p: Params) -> Any:
        """Hand free pages back: in small steps, or (``full``, or once on a database from
        before incremental auto-vacuum) by one VACUUM that holds every write until done."""
        full = p.opt_bool("full", default=False)
        p.check()

        async def work(progress: maintenance.Progress) -> dict[str, Any]:
            return await maintenance.run_vacuum(self._store, full=full, progress=progress)

        # A VACUUM, once it runs on the writer, ends when it ends; its steps can stop.
        return self._jobs.start("vacuum", {"full": full}, work, cancellable=not full).as_json()

    async def check(self, p: Params) -> Any:
        """integrity_check of every table and index, foreign keys, the projections' invariants."""
        p.check()

        async def work(progress: maintenance.Progress) -> dict[str, Any]:
            return await maintenance.run_check(self._store.path, progress=progress)

        return self._jobs.start("check", {}, work).as_json()

    async def backup(self, p: Params) -> Any:
        """An online copy of the database, as of one commit, to ``path`` (a new file)."""
        raw = p.str("path", max_len=4096)
        p.check()
        try:
            target = await trio.to_thread.run_sync(maintenance.check_backup_target, raw, self._store.path)
        except StoreError as exc:
            raise RpcError(DOMAIN_CODES["invalid"], str(exc)) from None

        async def work(progress: maintenance.Progress) -> dict[str, Any]:
            return await maintenance.run_backup(self._store.path, target, progress=progress)

        return self._jobs.start("backup", {"path": str(target)}, work).as_json()

    async def job(self, p: Params) -> Any:
        job_id = p.str("job_id", max_len=50)
        p.check()
        return self._jobs.get(job_id).as_json()

    async def cancel(self, p: Params) -> Any:
        job_id = p.str("job_id", max_len=50)
        p.check()
        job = self._jobs.get(job_id)
        if job.state == "running":
            if not job.cancellable:
                raise RpcError(CONFLICT, f"job {job_id} runs a VACUUM, which cannot be stopped once started; wait for it")
            job.scope.cancel()
        return job.as_json()


def _same(value: Any) -> Any:
    return value
