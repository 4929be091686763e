"""Yield to the scheduler only to wait.

Trio's `Lock.acquire` and `Semaphore.acquire` are checkpoints even when the
lock is free: the caller goes to the back of the run queue, behind every other
runnable task. Under load each such trip costs a whole pass of the scheduler
(py-spy and a per-phase trace of PRIMARY 250 subscribes: 5-10 ms each at p95),
and a subscribe crossed nine of them before its first chunk reached the socket.
On those paths a free lock is taken at once; only a held one is waited for.
Cancellation is still seen at the next checkpoint that waits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


async def acquire(lock: trio.Lock | trio.Semaphore) -> None:
    """Take ``lock`` now if it is free; otherwise wait for it as `acquire` does."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()


@asynccontextmanager
async def holding(lock: trio.Lock | trio.Semaphore) -> AsyncIterator[None]:
    """``async with holding(lock)``: `acquire`, then release on the way out."""
    await acquire(lock)
    try:
        yield
    finally:
        lock.release()
