"""One base read per wave: subscribers that need the same snapshot at once share one read.

Theory of operation: a caller first `join`s the wave of its key (synchronously,
so it joins before its next checkpoint), may then do other work (send
``resync``), and finally awaits `Wave.result`. The first member to ask for the
result runs the read; from that moment the wave is closed and later callers
start a new one. A read that starts after a member joined covers everything
that member's buffer dropped, which is what makes sharing correct.

Rules:
- Members that are slow to ask (a client slow to take its ``resync``) never
  delay the others: whoever asks first reads.
- If the reading member is cancelled (its connection went away) or its read
  fails with anything but a `T3dError`, the others start a new wave. A
  `T3dError` of the read (the database refused it) is every member's error.
- Waves hold nothing once their members have their result; the table of open
  waves holds at most one per key, and only until its read starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import attrs
import trio

from t3d.errors import T3dError

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@attrs.frozen
class SharedReadStatistics:
    reads: int  # reads started
    served: int  # results handed to members (one read can serve many)


class Wave(Generic[K, T]):
    def __init__(self, owner: SharedReads[K, T], key: K) -> None:
        self._owner = owner
        self._key = key
        self._started = False
        self._done = trio.Event()
        self._value: tuple[T] | None = None
        self._error: T3dError | None = None

    async def result(self) -> T:
        """The wave's read result (read by the first member that asks)."""
        wave = self
        while True:
            if not wave._started:
                await wave._read()
            else:
                await wave._done.wait()
            if wave._error is not None:
                raise wave._error
            if wave._value is not None:
                self._owner._served += 1
                return wave._value[0]
            wave = self._owner.join(self._key)  # the reader was cancelled: read again

    async def _read(self) -> None:
        self._started = True
        self._owner._close(self)
        self._owner._reads += 1
        try:
            self._value = (await self._owner._read(self._key),)
        except T3dError as exc:
            self._error = exc
        finally:
            self._done.set()


class SharedReads(Generic[K, T]):
    """``share=False`` gives every caller its own read (to measure against)."""

    def __init__(self, read: Callable[[K], Awaitable[T]], *, share: bool = True) -> None:
        self._read = read
        self._share = share
        self._open: dict[K, Wave[K, T]] = {}
        self._reads = 0
        self._served = 0

    def join(self, key: K) -> Wave[K, T]:
        """The open (not yet started) wave of ``key``, or a new one."""
        if not self._share:
            return Wave(self, key)
        wave = self._open.get(key)
        if wave is None:
            wave = self._open[key] = Wave(self, key)
        return wave

    async def read(self, key: K) -> T:
        return await self.join(key).result()

    def _close(self, wave: Wave[K, T]) -> None:
        if self._open.get(wave._key) is wave:
            del self._open[wave._key]

    def statistics(self) -> SharedReadStatistics:
        return SharedReadStatistics(self._reads, self._served)
