"""A connection's byte budget: its subscriptions' buffers and the replies it holds. Pure.

Rules:
- A WebSocket connection holds at most `CONNECTION_BYTES` (16 MiB) for its
  client: the undelivered frames of all its subscriptions (each one also
  bounded by itself, 1,000 frames or 8 MiB: hub.py) plus what it holds until
  sent: snapshot chunks, replayed frames, replies, the live frame being sent
  (`hold` / `release`).
- At the bound room is made, never refused: subscriptions are resynced, the
  one holding the most bytes first, until the new bytes fit. A resynced
  subscription drops its buffer and gets ``resync``, a fresh snapshot, then
  live frames again, as after its own overflow; no stream ends.
- Held bytes are never dropped (a reply must go out for the connection to
  move on). The connection sends one base or snapshot reply at a time
  (t3d/api/feeds.py), so when one reply is larger than the whole budget (a thread
  read with a large ``turn_limit``) the connection holds that reply and
  nothing else: at most max(budget, one reply).
- Frames are encoded once and shared by every subscription that buffers
  them; each subscription's reference is counted, so the budget over-counts
  memory, never under-counts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs

CONNECTION_BYTES = 16 * 1024 * 1024


class Member(Protocol):
    """A subscription as the budget sees it (hub.Subscription)."""

    @property
    def buffered_bytes(self) -> int: ...

    @property
    def wake(self) -> Callable[[], None]: ...

    def overflow(self) -> None:
        """Drop the buffer (the budget's ``buffered`` goes down with it); resync."""
        ...


@attrs.frozen
class BudgetStatistics:
    limit: int
    buffered: int  # undelivered frames of the connection's subscriptions
    held: int  # bases, replies and frames held until sent
    high_water: int  # the most buffered + held ever was
    relieved: int  # subscriptions resynced to make room


@attrs.define(eq=False)
class Budget:
    limit: int = CONNECTION_BYTES
    # Kept by the members as their buffers grow and shrink.
    buffered: int = 0
    held: int = 0
    high_water: int = 0
    relieved: int = 0
    members: set[Member] = attrs.Factory(set)

    @property
    def used(self) -> int:
        return self.buffered + self.held

    def make_room(self, size: int) -> None:
        """Resync members, the one holding the most first, until ``size`` more bytes fit or
        no member holds anything."""
        while self.used + size > self.limit and self.members:
            fullest = max(self.members, key=lambda m: m.buffered_bytes)
            if fullest.buffered_bytes == 0:
                return
            fullest.overflow()
            self.relieved += 1
            fullest.wake()

    def grew(self, size: int) -> None:
        """A member buffered ``size`` more bytes (after `make_room`)."""
        self.buffered += size
        self.high_water = max(self.high_water, self.used)

    def hold(self, size: int) -> None:
        """Hold ``size`` bytes until `release`: room is made first, but the bytes are held
        even if they do not fit (see the module's rules)."""
        self.make_room(size)
        self.held += size
        self.high_water = max(self.high_water, self.used)

    def release(self, size: int) -> None:
        self.held -= size

    def statistics(self) -> BudgetStatistics:
        return BudgetStatistics(
            self.limit, self.buffered, self.held, self.high_water, self.relieved
        )
