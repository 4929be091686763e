"""Coalescing of streaming item updates, for any provider's session driver.

Theory of operation: a provider streams an item (assistant text, a command's
output) as many small updates. `ItemCoalescer.stream` keeps the latest state
of each item and records it through ``commit_items`` at a bounded rate; the
background flusher (`ItemCoalescer.run`, started in the session's nursery)
records the ones that were held back once they are due. Every other commit of
the session goes through `ItemCoalescer.commit`, under the same lock.

Rules:
- An item's first update is recorded at once; a later one no sooner than
  `COALESCE_S` after the item's previous flush, whoever flushed it.
- A commit (an item's final state, a request, the turn's end) first records
  everything pending, so the store sees updates in the order they happened.
- One turn at a time: `reset` when the turn ends drops what is still pending.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable

import trio

from t3d.domain.model import TurnItem

COALESCE_S = 0.05


class ItemCoalescer:
    def __init__(
        self, commit_items: Callable[[str, tuple[TurnItem, ...]], Awaitable[None]]
    ) -> None:
        self._commit_items = commit_items
        # Held while committing: flushes and other commits never interleave.
        self._lock = trio.Lock()
        self._turn_id = ""  # the turn the pending items belong to
        # Item id -> its latest state not yet recorded.
        self._pending: dict[str, TurnItem] = {}
        self._last_flush: dict[str, float] = {}
        self._dirty = trio.Event()

    async def stream(self, turn_id: str, item: TurnItem) -> None:
        """Take an item's new state; record it now if it is due, else leave it to the flusher."""
        self._turn_id = turn_id
        self._pending[item.id] = item
        if trio.current_time() >= self._due_at(item.id):
            async with self._lock:
                await self._flush_locked(due_only=True)
        else:
            self._dirty.set()

    async def commit(self, commit: Callable[[], Awaitable[object]]) -> None:
        """Record everything pending, then run ``commit``, both under the lock."""
        async with self._lock:
            await self._flush_locked(due_only=False)
            await commit()

    def forget(self, item_ids: Iterable[str]) -> None:
        """Drop the pending states of these items (their final state supersedes them)."""
        for item_id in item_ids:
            self._pending.pop(item_id, None)

    def reset(self) -> None:
        """The turn has ended: drop its pending items and its flush times."""
        self._pending.clear()
        self._last_flush.clear()

    async def run(self) -> None:
        """The flusher: record held-back items as they come due. Runs until cancelled."""
        while True:
            await self._dirty.wait()
            self._dirty = trio.Event()
            while self._pending:
                # Sleep until the earliest one is due: none goes out early, whoever flushed it last.
                due = min(self._due_at(item_id) for item_id in self._pending)
                if due > trio.current_time():
                    await trio.sleep_until(due)
                async with self._lock:
                    await self._flush_locked(due_only=True)

    def _due_at(self, item_id: str) -> float:
        return self._last_flush.get(item_id, -math.inf) + COALESCE_S

    async def _flush_locked(self, *, due_only: bool) -> None:
        """Record pending items: all of them (before a commit, to keep order) or the due ones."""
        now = trio.current_time()
        items = tuple(
            item for item in self._pending.values() if not due_only or now >= self._due_at(item.id)
        )
        if not items:
            return
        for item in items:
            del self._pending[item.id]
            self._last_flush[item.id] = now
        await self._commit_items(self._turn_id, items)
