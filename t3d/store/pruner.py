"""`run_pruner`: retention as a task of the daemon, and `Pruner`, which runs one pass.

A pass surveys the database on a reader, then runs the steps the plan gives
(retention_plan.py) one at a time: each as an ordinary writer job (one short
transaction), so other writes interleave; after each step it pauses (the plan's
duty cycle), and while the writer's queue is deep it waits. A dry run reads
instead and changes nothing. One pass runs at a time (``t3d ctl db prune``
waits for the automatic one to end).

The task runs a pass every ``interval_s`` (the first one interval after
start), and at once after a thread is deleted (its events go then, in steps). With age-based retention off
it only purges deleted threads. A pass that fails (the disk is full, say) is
logged and tried again at the next interval.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from t3d.errors import StoreError
from t3d.store.commit import Committed
from t3d.store.read_classes import ReadClass
from t3d.store.retention import PURGES_PER_PASS, count_step, run_step, survey
from t3d.store.retention_plan import (
    Outbox,
    Pass,
    Policy,
    Step,
    StepResult,
    Survey,
    pause_after,
    writer_busy,
)
from t3d.store.store import Store

log = logging.getLogger("t3d.store")

BUSY_POLL_S = 0.05


@attrs.frozen
class PassReport:
    dry_run: bool
    elapsed_s: float
    steps: int
    rows: dict[str, int]  # rows deleted (or, dry, that would be) by phase
    bytes: dict[str, int]  # their stored bytes (events' payloads)
    compacted: dict[str, int]  # events compacted (or, dry, that would be) by phase
    compacted_bytes: dict[str, int]  # the payload bytes they dropped
    packed: int  # item rows stored packed (or, dry, that would be: packing.py)
    packed_bytes: int  # the bytes that saved
    writer_s: dict[str, float]  # the steps' time on the writer, by phase (the pass also pauses)
    cursors: dict[str, int]
    free_pages: int
    more: bool  # there is more to purge: another pass follows at once

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class Pruner:
    def __init__(
        self, store: Store, policy: Policy, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self.policy = policy
        self._clock = clock
        self._lock = trio.Lock()
        self._woken = trio.Event()
        self.passes = 0
        self.last: PassReport | None = None
        # Over the daemon's life, dry runs aside: steps run, events deleted and compacted.
        self.steps = 0
        self.deleted = 0
        self.compacted = 0

    def on_commit(self, committed: Committed) -> None:
        """A store listener: a deleted thread wakes the pruner (its events are to go)."""
        if any(event.kind == "thread.deleted" for event in committed.events):
            self._woken.set()

    def statistics(self) -> dict[str, Any]:
        """For /api/health and /metrics: passes so far, whether one runs, the steps run and
        the events deleted and compacted since start, and what the last pass did."""
        last = self.last
        return {
            "passes": self.passes,
            "running": self._lock.locked(),
            "steps": self.steps,
            "deleted": self.deleted,
            "compacted": self.compacted,
            "last_pass": None
            if last is None
            else {
                "elapsed_s": round(last.elapsed_s, 3),
                "steps": last.steps,
                "deleted": last.rows,
                "compacted": last.compacted,
            },
        }

    async def wait_woken(self) -> None:
        await self._woken.wait()
        self._woken = trio.Event()

    async def run_pass(
        self,
        *,
        dry_run: bool = False,
        policy: Policy | None = None,
        progress: Callable[[Pass], None] | None = None,
    ) -> PassReport:
        """One pass (see the module docstring); ``progress`` sees the plan after each step."""
        policy = policy or self.policy
        async with self._lock:
            started = time.monotonic()
            now = self._clock()
            found: Survey = await self._store.read(
                lambda conn: survey(conn, now, policy), _same, ReadClass.HISTORY
            )
            plan = Pass(found, policy, dry_run=dry_run)
            if progress is not None:
                progress(plan)
            steps = 0
            while (step := plan.next_step()) is not None:
                result = await (self._count(step) if dry_run else self._run(step, policy))
                plan.finished(step, result)
                steps += 1
                if progress is not None:
                    progress(plan)
                if not dry_run:
                    self.steps += 1
                    if not isinstance(step, Outbox):  # its rows are done outbox rows, not events
                        self.deleted += result.rows
                    self.compacted += result.compacted
                    await trio.sleep(pause_after(result.elapsed_s, policy))
            plan.done = plan.total
            self.passes += not dry_run
            report = PassReport(
                dry_run,
                time.monotonic() - started,
                steps,
                dict(plan.rows),
                dict(plan.bytes),
                dict(plan.compacted),
                dict(plan.compacted_bytes),
                plan.packed,
                plan.packed_bytes,
                {phase: round(s, 3) for phase, s in plan.writer_s.items()},
                dict(plan.cursors),
                plan.free_pages,
                more=not dry_run and len(found.purges) >= PURGES_PER_PASS,
            )
            if not dry_run:
                self.last = report
            return report

    async def _run(self, step: Step, policy: Policy) -> StepResult:
        # The writer's queue depth has no event to wait on: it is polled, every 50 ms.
        while writer_busy(self._store.statistics().writer_queue, policy):  # noqa: ASYNC110
            await trio.sleep(BUSY_POLL_S)
        return await self._store.maintain(lambda conn: run_step(conn, step))

    async def _count(self, step: Step) -> StepResult:
        return await self._store.read(lambda conn: count_step(conn, step), _same, ReadClass.HISTORY)


def _same(value: Any) -> Any:
    return value


async def run_pruner(
    pruner: Pruner,
    *,
    interval_s: float,
    enabled: bool,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Prune every ``interval_s`` and after each thread delete; with ``enabled``
    false only deleted threads are purged (age-based retention off, for comparison)."""
    policy = (
        pruner.policy if enabled else attrs.evolve(pruner.policy, item_age_s=None, state_age_s=None)
    )
    task_status.started()
    again = False  # the first pass comes one interval after start: start-up has enough to do
    while True:
        if not again:
            with trio.move_on_after(interval_s if enabled else math.inf):
                await pruner.wait_woken()
        try:
            report = await pruner.run_pass(policy=policy)
        except StoreError as exc:
            log.warning("retention: %s; trying again in %g s", exc, interval_s)
            again = False
            continue
        again = report.more
        if any(report.rows.values()) or any(report.compacted.values()):
            log.info(
                "retention: deleted %s; compacted %s; packed %d item(s), %d bytes saved; in %.1f s (%d steps)",
                ", ".join(f"{n} {phase}" for phase, n in report.rows.items() if n) or "nothing",
                ", ".join(f"{n} {phase}" for phase, n in report.compacted.items() if n) or "nothing",
                report.packed,
                report.packed_bytes,
                report.elapsed_s,
                report.steps,
            )
