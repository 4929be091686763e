"""Retention's plan: which bounded step comes next, and how large. Pure: no trio, no apsw.

Theory of operation (the SQL is in retention.py, the driver in pruner.py):

- An event is *superseded* once a newer event of the same entity (same kind and entity
  id) exists: projections are "replace the row", so only the newest says what is.
- Two classes, each with an age and a cursor (a sequence). ``item`` holds item snapshots
  (``item.updated``); ``state`` holds the thread-state events (thread, turn, request,
  session and checkpoint updates) and ``thread.deleted``. A window step of a class over
  the sequences ``(lo, hi]`` deletes, for every entity with events of the class's kinds
  in the window, every earlier event of that entity, then moves the cursor to ``hi``.
  So once a cursor is at ``H``, exactly the events superseded by an event at or below
  ``H`` are gone, and the newest event of every entity stays.
- Compaction, in the same step: the newest event of an entity in the window that is also
  its entity's newest event of all says what the entity's projection row says, so its
  payload is replaced by `COMPACTED` (an empty blob: no stored event is empty). The
  event stays, with its kind, entity id, thread, sequence and time; its body is the
  row. A compacted event that a later event supersedes goes when the cursor passes
  that one, as any superseded event. Each compacted event raises its thread's
  pruned-through mark as a deleted one does, so no replay ever reaches one (a resume
  from before it gets a snapshot). When the compacted event is an item's, the item's row
  is stored packed in the same step (packing.py). ``thread.deleted`` events are deleted, not
  compacted; ``project.updated`` events are in no class and stay whole. A cursor stops at its
  class's cutoff: the last event older than the age (times grow with the sequence, but
  for a few milliseconds: each write takes its time when it is sent and commits in the
  order sent).
- A ``thread.deleted`` event the state cursor passes goes too (the thread's other events
  went already, see below), and raises the shell's pruned-through mark.
- Deleted threads: every event of a deleted thread below its ``thread.deleted`` goes at
  once, not after an age (that is what deleting a thread means), `Policy.purge_rows` per
  step, even when age-based retention is off.
- Done outbox rows older than the state age go, `Policy.outbox_rows` per step.
- Then, with incremental auto-vacuum, vacuum steps while more than
  `Policy.vacuum_slack_pages` are free; last, one WAL checkpoint. A vacuum step's pages
  adapt as a window's span does (from `Policy.vacuum_pages`): moving a page can cost much
  more on a large file (pruning the 4 M-event database, 256-page steps averaged ~140 ms).
- Every step is one short writer transaction. A window's span adapts so that a step takes
  about `Policy.target_step_s`; after each step the driver pauses so that retention takes
  about `Policy.duty` of the writer's time at most, and waits while the writer's queue is
  deeper than `Policy.busy_queue` (other writes first).
- A dry run plans the same windows as reads that count instead of deleting.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

# What a compacted event's payload is: its entity's body is its projection row.
COMPACTED = b""

ITEM = "item"
STATE = "state"
CLASSES = (ITEM, STATE)
KINDS: dict[str, tuple[str, ...]] = {
    ITEM: ("item.updated",),
    STATE: (
        "thread.updated",
        "turn.updated",
        "request.updated",
        "session.updated",
        "checkpoint.updated",
        "thread.deleted",
    ),
}


@attrs.frozen
class Policy:
    # Seconds an event is kept once superseded (measured from the superseding event's
    # time); None: that class is never pruned by age.
    item_age_s: float | None = 3600.0
    state_age_s: float | None = 7 * 86400.0
    # 3 ms: a command that arrives during a step waits for it. At 10 ms, pruning under
    # PRIMARY 100 had dispatch p95 at 20-30 ms against 14 without; at 3 ms it is within the
    # noise, and the pass deletes ~40 % fewer events a minute under that load (docs/benchmarks.md).
    target_step_s: float = 0.003
    first_span: int = 1000
    min_span: int = 64
    max_span: int = 20_000
    purge_rows: int = 500
    outbox_rows: int = 2000
    vacuum_pages: int = 256  # the first vacuum step's pages (1 MiB of 4 KiB pages)
    min_vacuum_pages: int = 8
    max_vacuum_pages: int = 4096
    vacuum_slack_pages: int = 256  # free pages left for the next inserts to reuse
    duty: float = 0.25
    busy_queue: int = 16

    def age(self, cls: str) -> float | None:
        return self.item_age_s if cls == ITEM else self.state_age_s


@attrs.frozen
class Survey:
    """What the database says at the start of a pass (read in one transaction)."""

    now: float
    cursors: dict[str, int]  # class -> its cursor
    cutoffs: dict[
        str, int
    ]  # class -> the last sequence older than its age (a cursor never passes it)
    purges: tuple[
        tuple[str, int, int], ...
    ] = ()  # (thread id, its thread.deleted sequence, events left)
    incremental: bool = False  # the database has incremental auto-vacuum
    free_pages: int = 0


@attrs.frozen
class Window:
    cls: str
    lo: int
    hi: int


@attrs.frozen
class Purge:
    thread_id: str
    through: int
    limit: int


@attrs.frozen
class Outbox:
    before: float
    limit: int


@attrs.frozen
class Vacuum:
    pages: int


@attrs.frozen
class Checkpoint:
    pass


Step = Window | Purge | Outbox | Vacuum | Checkpoint


@attrs.frozen
class StepResult:
    """What a step did: rows deleted (or counted, in a dry run) and their stored bytes,
    events compacted (a window's) and the payload bytes that dropped, item rows packed and
    the bytes that saved, the free pages it left, and ``elapsed_s`` on the writer (commit
    included)."""

    rows: int = 0
    bytes: int = 0
    free_pages: int = 0
    elapsed_s: float = 0.0
    compacted: int = 0
    compacted_bytes: int = 0
    packed: int = 0  # item rows stored packed (packing.py)
    packed_bytes: int = 0  # the bytes that saved


PHASES = {
    Purge: "deleted threads",
    Outbox: "outbox",
    Vacuum: "vacuum",
    Checkpoint: "wal checkpoint",
}
CLASS_PHASES = {ITEM: "item snapshots", STATE: "thread-state events"}


def phase_of(step: Step) -> str:
    return CLASS_PHASES[step.cls] if isinstance(step, Window) else PHASES[type(step)]


def next_span(span: int, elapsed_s: float, policy: Policy) -> int:
    """The next window's span, so that a step takes about ``target_step_s``: scaled by the
    last step's speed (at most doubled, at least quartered), within ``[min_span, max_span]``."""
    return _scaled(span, elapsed_s, policy.target_step_s, policy.min_span, policy.max_span)


def next_vacuum_pages(pages: int, elapsed_s: float, policy: Policy) -> int:
    """The next vacuum step's pages, as `next_span`, within ``[min_vacuum_pages, max_vacuum_pages]``."""
    return _scaled(pages, elapsed_s, policy.target_step_s, policy.min_vacuum_pages, policy.max_vacuum_pages)


def _scaled(size: int, elapsed_s: float, target_s: float, low: int, high: int) -> int:
    factor = 2.0 if elapsed_s <= 0 else min(2.0, max(0.25, target_s / elapsed_s))
    return max(low, min(high, int(size * factor)))


def pause_after(elapsed_s: float, policy: Policy) -> float:
    """Seconds to leave the writer to others after a step that took ``elapsed_s``."""
    return elapsed_s * (1.0 - policy.duty) / policy.duty


def writer_busy(queued: int, policy: Policy) -> bool:
    """Other writes are waiting: retention waits for the queue to drain below the mark."""
    return queued > policy.busy_queue


def cutoff_time(now: float, age_s: float | None) -> float | None:
    return None if age_s is None else now - age_s


def last_before(
    first_from: Callable[[int], tuple[int, float] | None], lo: int, hi: int, t: float
) -> int:
    """The highest sequence in ``(lo, hi]`` whose event is older than ``t``, or ``lo``;
    ``first_from(s)`` gives the first event at or after ``s`` as (sequence, time), or None.
    A binary search: it takes times to grow with the sequence (see the module docstring)."""
    best, a, b = lo, lo + 1, hi
    while a <= b:
        mid = (a + b) // 2
        found = first_from(mid)
        if found is None or found[0] > b:
            b = mid - 1
        elif found[1] < t:
            best, a = found[0], found[0] + 1
        else:
            b = mid - 1
    return best


@attrs.define
class Pass:
    """One retention pass over a `Survey`: `next_step` until None, reporting each step's
    result with `finished`. Purges first (a deleted thread should go soon), then the item
    windows, the state windows, the outbox, vacuum and the WAL checkpoint."""

    survey: Survey
    policy: Policy
    dry_run: bool = False
    spans: dict[str, int] = attrs.Factory(dict)
    cursors: dict[str, int] = attrs.Factory(dict)
    purges: list[tuple[str, int, int]] = attrs.Factory(list)
    outbox_done: bool = False
    free_pages: int = 0
    vacuum_pages: int = 0  # the next vacuum step's pages (adapting: `next_vacuum_pages`)
    vacuumed: bool = False
    checkpointed: bool = False
    # Totals of what the pass did (or, dry, would do), by phase.
    rows: dict[str, int] = attrs.Factory(dict)
    bytes: dict[str, int] = attrs.Factory(dict)
    compacted: dict[str, int] = attrs.Factory(dict)
    compacted_bytes: dict[str, int] = attrs.Factory(dict)
    packed: int = 0  # item rows stored packed (or, dry, that would be)
    packed_bytes: int = 0  # the bytes that saved
    writer_s: dict[str, float] = attrs.Factory(dict)  # time on the writer, by phase
    # Progress: units of work done and known so far (events scanned or purged, pages freed).
    done: int = 0
    total: int = 0

    def __attrs_post_init__(self) -> None:
        self.cursors = dict(self.survey.cursors)
        self.spans = dict.fromkeys(CLASSES, self.policy.first_span)
        self.purges = list(self.survey.purges)  # one with nothing left still takes a step: its row goes
        self.free_pages = self.survey.free_pages
        self.vacuum_pages = self.policy.vacuum_pages
        self.total = sum(left for _, _, left in self.purges) + sum(
            max(0, self.survey.cutoffs[cls] - self.cursors[cls]) for cls in CLASSES
        )
        if self.dry_run:  # a purge's count is in the survey already
            for _, _, left in self.purges:
                self._add(PHASES[Purge], left, 0)
            self.done += sum(left for _, _, left in self.purges)
            self.purges = []
        else:
            self.total += self._vacuum_work()

    def _vacuum_work(self) -> int:
        if not self.survey.incremental:
            return 0
        return max(0, self.free_pages - self.policy.vacuum_slack_pages)

    def next_step(self) -> Step | None:
        if self.purges:
            thread_id, through, _ = self.purges[0]
            return Purge(thread_id, through, self.policy.purge_rows)
        for cls in CLASSES:
            lo, cutoff = self.cursors[cls], self.survey.cutoffs[cls]
            if lo < cutoff:
                return Window(cls, lo, min(cutoff, lo + self.spans[cls]))
        outbox_before = cutoff_time(self.survey.now, self.policy.state_age_s)
        if not self.outbox_done and outbox_before is not None:
            return Outbox(outbox_before, self.policy.outbox_rows)
        if self.dry_run:
            return None
        if (
            self.survey.incremental
            and not self.vacuumed
            and self.free_pages > self.policy.vacuum_slack_pages
        ):
            return Vacuum(min(self.vacuum_pages, self.free_pages - self.policy.vacuum_slack_pages))
        if not self.checkpointed:
            return Checkpoint()
        return None

    def finished(self, step: Step, result: StepResult) -> None:
        """Take in what ``step`` did (every step reports the free pages it left)."""
        self._add(phase_of(step), result.rows, result.bytes)
        self.writer_s[phase_of(step)] = self.writer_s.get(phase_of(step), 0.0) + result.elapsed_s
        if not self.dry_run and not isinstance(step, Vacuum):
            before = self._vacuum_work()
            self.free_pages = result.free_pages
            self.total += max(0, self._vacuum_work() - before)
        if isinstance(step, Purge):
            thread_id, through, left = self.purges[0]
            if result.rows < step.limit:
                self.done += left
                self.purges.pop(0)
            else:
                self.done += result.rows
                self.purges[0] = (thread_id, through, max(0, left - result.rows))
        elif isinstance(step, Window):
            phase = phase_of(step)
            self.compacted[phase] = self.compacted.get(phase, 0) + result.compacted
            self.compacted_bytes[phase] = self.compacted_bytes.get(phase, 0) + result.compacted_bytes
            self.packed += result.packed
            self.packed_bytes += result.packed_bytes
            self.done += step.hi - step.lo
            self.cursors[step.cls] = step.hi
            self.spans[step.cls] = next_span(step.hi - step.lo, result.elapsed_s, self.policy)
        elif isinstance(step, Outbox):
            self.outbox_done = result.rows == 0 or self.dry_run
        elif isinstance(step, Vacuum):
            freed = max(0, self.free_pages - result.free_pages)
            self.done += freed
            self.vacuumed = freed == 0  # nothing moved: stop, do not spin
            self.free_pages = result.free_pages
            self.vacuum_pages = next_vacuum_pages(step.pages, result.elapsed_s, self.policy)
        else:
            self.checkpointed = True

    def _add(self, phase: str, rows: int, size: int) -> None:
        self.rows[phase] = self.rows.get(phase, 0) + rows
        self.bytes[phase] = self.bytes.get(phase, 0) + size

    def phase(self) -> str:
        step = self.next_step()
        return "done" if step is None else phase_of(step)
