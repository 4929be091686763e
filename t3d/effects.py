"""`run_effects`: the outbox worker.

Effects are committed with the events that call for them; this worker runs
them after COMMIT, in commit order, and marks them done once handed over
(a checkpoint capture is marked done by its handler once it is taken:
`DONE_WHEN_FINISHED`). The in-memory queue
is bounded (`QUEUE_SIZE`): if a burst fills it, the worker drops the queue
and re-reads the undone effects from the outbox table, so no effect is lost
and memory stays bounded. At start-up it runs what the outbox still holds
(e.g. queued turns that recovery started).

While the database cannot take writes, the worker goes on running effects and
keeps the ids it could not mark done (at most `QUEUE_SIZE`; beyond that the
oldest stay open in the outbox, where restart recovery supersedes them), and
marks them at the next round or every `RETRY_S`. An effect runs once: the
worker never dispatches an id twice, marked or not.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import trio

from t3d.domain.events import DONE_WHEN_FINISHED, Effect
from t3d.errors import DatabaseUnavailableError
from t3d.store.commit import Committed
from t3d.store.store import Store

log = logging.getLogger("t3d.effects")

QUEUE_SIZE = 10_000
# How often effects run but not yet marked done are marked again while the database is unavailable.
RETRY_S = 1.0


class EffectQueue:
    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[tuple[int, Effect]](QUEUE_SIZE)
        self.overflowed = False

    def on_commit(self, committed: Committed) -> None:
        for item in committed.effects:
            if self.overflowed:
                return
            try:
                self._send.send_nowait(item)
            except trio.WouldBlock:
                self.overflowed = True

    def drain_nowait(self) -> list[tuple[int, Effect]]:
        items = []
        while True:
            try:
                items.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                return items

    async def wait(self) -> tuple[int, Effect]:
        return await self._receive.receive()


async def run_effects(
    store: Store,
    queue: EffectQueue,
    dispatch: Callable[[Effect], Awaitable[None]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    seen = -1  # highest outbox id dispatched: a re-read never runs an effect twice
    unmarked: list[int] = []  # dispatched, not yet marked done (the database could not take it)
    backlog = await store.pending_effects()
    task_status.started()
    while True:
        if not backlog:
            with trio.move_on_after(RETRY_S if unmarked else math.inf):
                backlog = [await queue.wait()]
            backlog += queue.drain_nowait()
        if queue.overflowed:
            queue.drain_nowait()
            queue.overflowed = False
            backlog = await store.pending_effects()
        for effect_id, effect in backlog:
            if effect_id <= seen:
                continue
            seen = effect_id
            await dispatch(effect)
            if not isinstance(effect, DONE_WHEN_FINISHED):
                unmarked.append(effect_id)
        backlog = []
        if unmarked:
            unmarked = await _mark_done(store, unmarked)


async def _mark_done(store: Store, ids: list[int]) -> list[int]:
    """Mark ``ids`` done; the ids still to mark (all of them if the database could not)."""
    try:
        await store.mark_effects_done(ids)
    except DatabaseUnavailableError:
        if len(ids) > QUEUE_SIZE:
            log.warning("%d effects ran but could not be marked done; restart recovery will", len(ids) - QUEUE_SIZE)
            return ids[-QUEUE_SIZE:]
        return ids
    return []
