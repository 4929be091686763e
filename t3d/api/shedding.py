"""Which connection makes room when the server is full. Pure: no sockets, no trio.

Theory of operation: every open connection holds a :class:`Slot` in one
:class:`ConnectionTable`, and each slot has a :class:`Standing`:

- ``EXPOSED``: the connection has shown no valid credentials for what it is
  doing now: its request head is unfinished, or its request (or its last one,
  while it waits for the next) carried none. Whatever such a peer holds, it
  holds without having proved anything.
- ``IDLE``: authenticated, and waiting for its next request.
- ``PROTECTED``: authenticated and busy (a body, a response, a WebSocket).

When a new connection would exceed the limit, or the process runs out of
descriptors, the table sheds the exposed slot that has been longest in its
standing, else the longest idle one; protected slots are never shed. So
however many connections a peer without the token holds open, a health probe
or an authenticated client that connects next finds room, and an
authenticated client that is mid-request is never cut off for it.

Rules:
- Every change of standing moves the slot to the back of its queue: "longest
  in its standing" means "longest since it last made progress".
- A slot leaves the table once (shed or closed, whichever comes first).
"""

from __future__ import annotations

import enum
from typing import Generic, TypeVar

T = TypeVar("T")


class Standing(enum.Enum):
    EXPOSED = "exposed"  # shed first
    IDLE = "idle"  # shed when no exposed slot is left
    PROTECTED = "protected"  # never shed


_SHED_ORDER = (Standing.EXPOSED, Standing.IDLE)


class Slot(Generic[T]):
    """One connection's place in the table; ``value`` is what the table hands back when shed."""

    __slots__ = ("_standing", "_table", "value")

    def __init__(self, table: ConnectionTable[T], value: T) -> None:
        self._table = table
        self.value = value
        self._standing: Standing | None = None

    @property
    def open(self) -> bool:
        return self._standing is not None

    @property
    def standing(self) -> Standing | None:
        """None once the slot has left the table."""
        return self._standing

    def stand(self, standing: Standing) -> None:
        """Put the slot at the back of ``standing``'s queue (no-op once it has left)."""
        if self._standing is None:
            return
        del self._table._queues[self._standing][self]
        self._standing = standing
        self._table._queues[standing][self] = None

    def leave(self) -> bool:
        """Take the slot out of the table; True if it was still in it."""
        if self._standing is None:
            return False
        del self._table._queues[self._standing][self]
        self._standing = None
        return True


class ConnectionTable(Generic[T]):
    """The open connections, queued by standing, oldest first."""

    def __init__(self) -> None:
        # dicts as insertion-ordered sets: the first key is the oldest.
        self._queues: dict[Standing, dict[Slot[T], None]] = {s: {} for s in Standing}
        self.shed_total = 0

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def count(self, standing: Standing) -> int:
        return len(self._queues[standing])

    def add(self, value: T) -> Slot[T]:
        """A new connection's slot, ``EXPOSED`` until it shows credentials."""
        slot = Slot(self, value)
        slot._standing = Standing.EXPOSED
        self._queues[Standing.EXPOSED][slot] = None
        return slot

    def shed_one(self) -> T | None:
        """Take out the slot to shed next and return its value; None if every slot is protected."""
        for standing in _SHED_ORDER:
            queue = self._queues[standing]
            if queue:
                slot = next(iter(queue))
                slot.leave()
                self.shed_total += 1
                return slot.value
        return None
