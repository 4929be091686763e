"""`recover_after_restart`: at start-up, take over the agents the last daemon left running,
and close everything else it left open.

The order matters, so recovery never runs blind:

1. The spawner is asked for the orphans of this state dir (`Spawner.adopt`; children
   of other state dirs are not touched, nor listed).
2. An orphan is kept if its provider session is still live in the database, its
   thread exists and is not archived, and its provider's session can take a process
   over (`registry.REATTACHABLE`), one per thread. The others are stopped.
3. Restart recovery (`Store.recover_after_restart`) closes every open turn whose
   agent is not kept (``interrupted``, reason ``server_restart``; its requests expire)
   and supersedes the old effects; turns of kept agents keep their status, their
   pending requests stay pending, and the interrupts, answers and stops queued for
   them still run.
4. Each kept agent gets a session that replays its open turn's output and reads on
   (`Sessions.reattach`); one that cannot be attached is stopped and its turn fails.
   Up to `REATTACH_AT_ONCE` are taken over at once: each waits on a database read and a
   spawner round trip, and one after another those waits would add up to most of a
   restart's down time with a hundred agents.

All of this happens before the effect worker starts, so no effect reaches a thread
before its agent is back. A direct spawner (``T3D_PROCESS_SPAWNER=off``) has no
orphans: every open turn is closed.
"""

from __future__ import annotations

import logging

import trio

from t3d.errors import SpawnerError
from t3d.providers import registry
from t3d.sessions import Sessions
from t3d.spawn.child import Orphan, Spawner
from t3d.store.store import Store

log = logging.getLogger("t3d.restart")

# Agents taken over at once (each holds a reader for its context, then a spawner request).
REATTACH_AT_ONCE = 16


async def recover_after_restart(store: Store, spawner: Spawner, sessions: Sessions) -> int:
    """Returns how many agents were taken over."""
    try:
        orphans = await spawner.adopt()
    except SpawnerError as exc:
        log.warning("could not ask the spawner for agents left running (%s); recovering without them", exc)
        orphans = []
    live = await store.reattachable_sessions() if orphans else {}
    keep: list[Orphan] = []
    stop: list[Orphan] = []
    threads: set[str] = set()
    for orphan in orphans:
        session_id, thread_id = orphan.meta.get("session_id"), orphan.meta.get("thread_id")
        reattachable = orphan.meta.get("provider") in registry.REATTACHABLE
        if reattachable and isinstance(session_id, str) and isinstance(thread_id, str) and live.get(session_id) == thread_id and thread_id not in threads:
            keep.append(orphan)
            threads.add(thread_id)
        else:
            stop.append(orphan)
    await store.recover_after_restart(frozenset(str(o.meta["session_id"]) for o in keep))
    async with trio.open_nursery() as nursery:
        for orphan in stop:
            log.warning(
                "stopping pid %d (%s), left running by a previous daemon: its session is over", orphan.pid, orphan.tag or "no tag"
            )
            nursery.start_soon(spawner.stop_orphan, orphan)
    limiter = trio.CapacityLimiter(REATTACH_AT_ONCE)
    attached: list[bool] = []

    async def reattach(orphan: Orphan) -> None:
        async with limiter:
            attached.append(await sessions.reattach(orphan))

    async with trio.open_nursery() as nursery:
        for orphan in keep:
            nursery.start_soon(reattach, orphan)
    taken = sum(attached)
    if orphans:
        log.info("took over %d agent(s) left running by the previous daemon; stopped %d", taken, len(orphans) - taken)
    return taken
