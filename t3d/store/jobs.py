"""The writer's jobs: a function of the connection (or a batchable item) and its outcome.

Created and awaited on the loop; run on the writer thread (writer.py), which sets
``result`` and, back on the loop, ``done``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import apsw
import outcome
import trio

T = TypeVar("T")


class Job(Generic[T]):
    __slots__ = ("deliver", "done", "fn", "result")

    def __init__(self, fn: Callable[[apsw.Connection], T], deliver: Callable[[T], None] | None) -> None:
        self.fn = fn
        self.deliver = deliver
        self.done = trio.Event()
        self.result: outcome.Outcome[T] | None = None


class JoinableJob(Job[T]):
    """A job that runs alone (``fn``) when the writer is idle, or, when it arrives while a
    batch's transaction is open, is applied to it (``item``, through the writer's
    `Transaction`) and commits it at once: a client's command waits for one COMMIT, not for
    the batch's and then its own. It is never held like a batchable job."""

    __slots__ = ("item",)

    def __init__(self, fn: Callable[[apsw.Connection], T], item: object, deliver: Callable[[T], None] | None) -> None:
        super().__init__(fn, deliver)
        self.item = item


class BatchableJob(Job[T]):
    """A job that may share a transaction: ``item`` goes to the writer's `Transaction`."""

    __slots__ = ("item", "size")

    def __init__(self, item: object, size: int, deliver: Callable[[T], None] | None) -> None:
        super().__init__(_unbatched, deliver)
        self.item = item
        self.size = size


def _unbatched(conn: apsw.Connection) -> Any:
    raise AssertionError("a batchable job runs through the writer's Transaction")


class Pending(Generic[T]):
    """A job handed to the writer whose outcome is awaited later."""

    __slots__ = ("_job",)

    def __init__(self, job: Job[T]) -> None:
        self._job = job

    @property
    def done(self) -> bool:
        """Has the job's outcome been delivered?"""
        return self._job.done.is_set()

    async def settled(self) -> None:
        """Wait until the job is done, leaving its outcome to `outcome`."""
        await self._job.done.wait()

    async def outcome(self) -> T:
        """The job's result once it committed, or its error (a cancelled wait leaves the
        job running: it still commits)."""
        await self._job.done.wait()
        assert self._job.result is not None
        return self._job.result.unwrap()


class Transaction(Protocol):
    """How the writer commits batchable items: one transaction, each item applied as it
    is taken (`t3d.store.commit.BatchTransaction`)."""

    def begin(self, conn: apsw.Connection) -> None: ...

    def apply(self, conn: apsw.Connection, item: Any) -> outcome.Outcome[Any]:
        """The item's own outcome; raises for an error that fails the whole transaction."""
        ...

    def commit(self, conn: apsw.Connection) -> None: ...

    def rollback(self, conn: apsw.Connection) -> None:
        """After a raise from any step: undo whatever the transaction still holds."""
        ...
