"""`run_effects`: the outbox worker.

Effects are committed with the events that call for them; this worker runs
them after COMMIT, in commit order, and marks them done once handed over
(a checkpoint capture is marked done by its handler once it is taken:
`DONE_WHEN_FINISHED`). The in-memory queue
is bounded (`QUEUE_SIZE`): if a burst fills it, the worker drops the queue
and re-reads the undone effects from the outbox table, so no effect is lost
and memory stays bounded. At start-up it runs what the outbox still holds
(e.g. queued turns that recovery started).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from t3d.domain.events import DONE_WHEN_FINISHED, Effect
from t3d.store.commit import Committed
from t3d.store.store import Store

log = logging.getLogger("t3d.effects")

QUEUE_SIZE = 10_000


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
    backlog = await store.pending_effects()
    task_status.started()
    while True:
        if not backlog:
            backlog = [await queue.wait()]
            backlog += queue.drain_nowait()
        if queue.overflowed:
            queue.drain_nowait()
            queue.overflowed = False
            backlog = await store.pending_effects()
        done = []
        for effect_id, effect in backlog:
            if effect_id <= seen:
                continue
            seen = effect_id
            await dispatch(effect)
            if not isinstance(effect, DONE_WHEN_FINISHED):
                done.append(effect_id)
        backlog = []
        if done:
            await store.mark_effects_done(done)
