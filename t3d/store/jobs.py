"""The writer's jobs: a function of the connection (or a batchable item) and its outcome.

Created and awaited on the loop; run on the writer thread (writer.py), which sets
``result`` and, back on the loop, ``done``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

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


class BatchableJob(Job[T]):
    """A job that may share a transaction: ``item`` goes to ``execute_batch``."""

    __slots__ = ("item", "size")

    def __init__(self, item: object, size: int, deliver: Callable[[T], None] | None) -> None:
        super().__init__(_unbatched, deliver)
        self.item = item
        self.size = size


def _unbatched(conn: apsw.Connection) -> Any:
    raise AssertionError("a batchable job runs through execute_batch")


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


ExecuteBatch = Callable[[apsw.Connection, list[Any]], list[outcome.Outcome[Any]]]
