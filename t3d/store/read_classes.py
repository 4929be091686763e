"""Read classes, and which waiting read gets the next free reader. Pure: no trio, no apsw.

Theory of operation:
- Every read is classed. ``small``: what a person or a poller is waiting on right now
  (the shell, one thread's row, pending requests). ``page``: a bounded thread snapshot.
  ``history``: reaching back (history pages, event replays, the full value of a huge
  field). The class changes only the order of reads under contention, never a result.
- A free reader goes to the best waiting read that may run:
  1. an *aged* read first (one that has waited while `AGE_LIMIT` reads were granted),
     oldest first;
  2. otherwise ``small`` before ``page`` before ``history``;
  3. within a class, in arrival order.
- ``history`` reads hold at most `history_cap` readers (pool - 1, and 1 for a pool of
  one), so with two or more readers a ``small`` read never waits behind history.
- Work-conserving: no reader stays free while a read that may run is waiting (a
  ``history`` read may run while history holds fewer than `history_cap` readers).
- No starvation: while a read may run, at most `AGE_LIMIT` reads that arrived after it
  are granted before it (after that it is aged, and aged reads go oldest first).

Bound: one entry per task awaiting a read; those tasks are bounded by the API's
connection and request limits, so the queue needs no bound of its own (a full queue
would only move the wait somewhere less visible).
"""

from __future__ import annotations

import enum
import itertools
from collections import deque

import attrs

# Grants a waiting read may see go to others before it goes first. Small enough that a
# history read under a flood of small reads waits for a handful of reads, not forever;
# large enough that a wave of small reads is not broken up by every page behind it.
AGE_LIMIT = 8


class ReadClass(enum.Enum):
    SMALL = "small"
    PAGE = "page"
    HISTORY = "history"


# Highest priority first.
PRIORITY = (ReadClass.SMALL, ReadClass.PAGE, ReadClass.HISTORY)


def history_cap(readers: int) -> int:
    """Readers that history reads may hold at once: all but one, so a small read always
    finds one (a pool of one has nothing to spare: history then shares its only reader)."""
    return max(1, readers - 1)


@attrs.define(eq=False)
class Ticket:
    """One read's place: waiting until granted, then running until it leaves."""

    read_class: ReadClass
    arrival: int  # arrival order across all classes
    grants_at_arrival: int  # the scheduler's grant count when it arrived
    running: bool = False


class ReadScheduler:
    """Decides which waiting read runs next on a pool of ``readers`` readers."""

    def __init__(self, readers: int, *, age_limit: int = AGE_LIMIT) -> None:
        if readers < 1:
            raise ValueError(f"a reader pool needs at least one reader, not {readers}")
        self.readers = readers
        self.history_cap = history_cap(readers)
        self._age_limit = age_limit
        self._arrivals = itertools.count()
        self._waiting: dict[ReadClass, deque[Ticket]] = {c: deque() for c in ReadClass}
        self._running: dict[ReadClass, int] = dict.fromkeys(ReadClass, 0)
        self.grants = 0  # reads granted a reader so far

    def arrive(self, read_class: ReadClass) -> Ticket:
        """Queue a read; `grant` decides when it runs."""
        ticket = Ticket(read_class, next(self._arrivals), self.grants)
        self._waiting[read_class].append(ticket)
        return ticket

    def grant(self) -> Ticket | None:
        """The read that takes a free reader now (marked running), or None if no reader is
        free or no waiting read may run. Call until None after every `arrive` and `leave`."""
        if self.running() >= self.readers:
            return None
        heads = [q[0] for c in PRIORITY if (q := self._waiting[c]) and self._may_run(c)]
        if not heads:
            return None
        aged = [t for t in heads if self.grants - t.grants_at_arrival >= self._age_limit]
        chosen = min(aged, key=lambda t: t.arrival) if aged else heads[0]
        self._waiting[chosen.read_class].popleft()
        chosen.running = True
        self._running[chosen.read_class] += 1
        self.grants += 1
        return chosen

    def leave(self, ticket: Ticket) -> None:
        """The read is done (its reader is free) or gave up waiting (it leaves the queue)."""
        if ticket.running:
            ticket.running = False
            self._running[ticket.read_class] -= 1
        else:
            self._waiting[ticket.read_class].remove(ticket)

    def _may_run(self, read_class: ReadClass) -> bool:
        return (
            read_class is not ReadClass.HISTORY
            or self._running[ReadClass.HISTORY] < self.history_cap
        )

    def waiting(self, read_class: ReadClass | None = None) -> int:
        if read_class is None:
            return sum(len(q) for q in self._waiting.values())
        return len(self._waiting[read_class])

    def running(self, read_class: ReadClass | None = None) -> int:
        if read_class is None:
            return sum(self._running.values())
        return self._running[read_class]
