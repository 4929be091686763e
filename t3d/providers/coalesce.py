"""Coalescing of streaming item updates, for any provider's session driver.

Theory of operation: a provider streams an item (assistant text, a command's
output) as many small updates. `ItemCoalescer.stream` keeps the latest state
of each item and records it through ``commit_items`` at a bounded rate, on the
reader's own step whenever it can: a state that is due (and the writer keeps
up) goes at once; one that is not yet due waits for the next state (a provider
streams a block as a run of deltas, so the next one usually comes first), and
a timer makes sure it goes anyway. The flusher (`ItemCoalescer.run`, started in
the session's nursery) records what the timer or the writer's lag held back.
Every other commit of the session goes through `ItemCoalescer.commit`, under
the same lock.

Rules:
- An item's first update is recorded at once; a later one no sooner than
  `COALESCE_S` after the item's previous flush, whoever flushed it, and no later
  than `COALESCE_S` + `LATE_S` after it (unless the writer is behind, below).
- The interval widens while the writer is behind: while what the session handed
  over last has not committed (``writes``: its `WritePipeline`), nothing more is
  handed over; the states that arrive meanwhile merge, and the newest goes once
  the commit lands. When commits are quick again it is `COALESCE_S` again. Only
  intermediate states are skipped: every item's final state, and whatever is
  pending before a commit, is recorded.
- A commit (an item's final state, a request, the turn's end) first records
  everything pending, so the store sees updates in the order they happened.
- One turn at a time: `reset` when the turn ends drops what is still pending.
- Timers: one shared ticker per trio run (`_Ticker`, one system task) runs due
  callbacks on a `TICK_S` grid, rounded up, so an update never goes out early.
  Arming one costs no task switch, and one that finds nothing pending wakes no
  one: a streaming block costs the flusher no step at all.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import trio

from t3d.domain.model import TurnItem

COALESCE_S = 0.05
# How long past its due time a held-back state may wait for the next one to carry it.
LATE_S = COALESCE_S / 2
TICK_S = 0.01


class Settling(Protocol):
    """What the coalescer asks of the session's writes (a `WritePipeline`)."""

    def settled_now(self) -> bool:
        """Has everything handed over so far committed (or failed)?"""
        ...

    async def settled(self) -> None:
        """Wait until everything handed over so far has committed (or failed)."""
        ...


class _Ticker:
    """Runs callbacks at or after their deadline, on a `TICK_S` grid; one per trio run.
    Bounded by its callers: a coalescer arms a timer only earlier than the one it has
    armed, or once that one has fired, so each has a few entries, all due within
    `COALESCE_S` + `LATE_S` + `TICK_S`."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._changed = trio.Event()

    def call_at(self, deadline: float, callback: Callable[[], None]) -> None:
        tick = math.ceil(deadline / TICK_S) * TICK_S
        if not self._heap or tick < self._heap[0][0]:
            self._changed.set()
        heapq.heappush(self._heap, (tick, next(self._order), callback))

    async def run(self) -> None:
        heap = self._heap
        while True:
            self._changed = trio.Event()
            if heap:
                with trio.move_on_at(heap[0][0]):
                    await self._changed.wait()
            else:
                await self._changed.wait()
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                heapq.heappop(heap)[2]()


_TICKER: trio.lowlevel.RunVar[_Ticker] = trio.lowlevel.RunVar("t3d_coalesce_ticker")


def _ticker() -> _Ticker:
    try:
        return _TICKER.get()
    except LookupError:
        ticker = _Ticker()
        _TICKER.set(ticker)
        trio.lowlevel.spawn_system_task(ticker.run, name="t3d coalescing ticker")
        return ticker


class ItemCoalescer:
    def __init__(
        self,
        commit_items: Callable[[str, tuple[TurnItem, ...]], Awaitable[None]],
        writes: Settling | None = None,
    ) -> None:
        self._commit_items = commit_items
        self._writes = writes
        # Held while committing: flushes and other commits never interleave.
        self._lock = trio.Lock()
        # Item id -> its latest state not yet recorded.
        self._pending: dict[str, TurnItem] = {}
        self._last_flush: dict[str, float] = {}
        self._wake = trio.Event()  # the flusher has work (set by the timer or a lagging writer)
        self._timer_at = math.inf  # when the armed timer fires (inf: none armed)

    async def stream(self, item: TurnItem) -> None:
        """Take an item's new state; record it now if it is due and the writer keeps up,
        else leave it to the next state, the timer or the flusher. Each state is recorded
        in its own turn (``item.turn_id``: a turn's, or one of its subagents')."""
        self._pending[item.id] = item
        writes = self._writes
        if writes is not None and not writes.settled_now():
            self._wake.set()  # the flusher waits for the writer, then sends the newest
            return
        due = self._due_at(item.id)
        if trio.current_time() < due:
            self._arm(due + LATE_S)
        elif not self._lock.locked():
            self._lock.acquire_nowait()
            try:
                await self._flush_locked(due_only=True)
            finally:
                self._lock.release()
        else:  # due, but a commit or a flush holds the lock: the flusher waits for it
            self._wake.set()

    def _arm(self, at: float) -> None:
        if at < self._timer_at:
            self._timer_at = at
            _ticker().call_at(at, self._timer)

    def _timer(self) -> None:
        """The armed timer fired (on the ticker, synchronously): wake the flusher only if a
        state is still held back."""
        self._timer_at = math.inf
        if self._pending:
            self._wake.set()

    async def commit(self, commit: Callable[[], Awaitable[object]]) -> None:
        """Record everything pending, then run ``commit``, both under the lock."""
        await self._acquire()
        try:
            await self._flush_locked(due_only=False)
            await commit()
        finally:
            self._lock.release()

    async def _acquire(self) -> None:
        """Take the lock at once when free (a free trio lock still yields: t3d/waits.py)."""
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    def forget(self, item_ids: Iterable[str]) -> None:
        """Drop the pending states of these items (their final state supersedes them)."""
        for item_id in item_ids:
            self._pending.pop(item_id, None)

    def reset(self) -> None:
        """The turn has ended: drop its pending items and its flush times."""
        self._pending.clear()
        self._last_flush.clear()

    async def run(self) -> None:
        """The flusher: record what was held back once it is due. Runs until cancelled."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._pending:
                if self._writes is not None and not self._writes.settled_now():
                    await self._writes.settled()  # the writer is behind: states merge meanwhile
                    continue
                # None goes out early, whoever flushed it last: not due yet, the timer wakes us.
                due = min(self._due_at(item_id) for item_id in self._pending)
                if due > trio.current_time():
                    self._arm(due)
                    break
                await self._acquire()
                try:
                    await self._flush_locked(due_only=True)
                finally:
                    self._lock.release()

    def _due_at(self, item_id: str) -> float:
        return self._last_flush.get(item_id, -math.inf) + COALESCE_S

    async def _flush_locked(self, *, due_only: bool) -> None:
        """Record pending items: all of them (before a commit, to keep order) or the due ones."""
        if not self._pending:
            return
        now = trio.current_time()
        items = tuple(
            item for item in self._pending.values() if not due_only or now >= self._due_at(item.id)
        )
        if not items:
            return
        by_turn: dict[str, list[TurnItem]] = {}
        for item in items:
            del self._pending[item.id]
            self._last_flush[item.id] = now
            by_turn.setdefault(item.turn_id, []).append(item)
        for turn_id, of_turn in by_turn.items():
            await self._commit_items(turn_id, tuple(of_turn))
