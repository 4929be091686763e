"""Long-polls for runtime requests (``requests.wait``): which requests are pending, and who
waits for the next one. Pure bookkeeping: no trio, no I/O.

Theory of operation. Every pending runtime request is indexed by the global sequence of
the ``request.updated`` event that opened it. `on_commit` (a store listener: it runs on the
loop right after COMMIT, in sequence order) indexes each request that became pending and
forgets each one that was answered, expired or cancelled, or deleted with its thread. A
cursor is a sequence, and a request is *newer than the cursor* when its opening sequence
is greater; so a client that passes back the cursor it was given misses no request opened
in between. A long-poll adds a `Waiter` first, then looks at the index for requests newer
than its cursor, and only if there are none it sleeps until `on_commit` hands it one:
added before it looks, it cannot miss one opened in between. Sleeping waiters cost
nothing: no timer, no read; a commit wakes only the waiters whose filter matches.

The index is filled from the database once (`begin_seed`, then `seed` with what the read
found), for requests opened before this process started listening; openings and
closings committed while that read runs are merged, never lost or resurrected.

Rules (every bound has its policy):
- At most ``max_waiters`` waiters in all and ``max_per_owner`` per owner (a WebSocket
  connection); one more is refused with `WaitersFull`, whose message names the bound and
  the fix. Over HTTP/1.1 a connection has one request at a time, so only the total applies.
- A waiter keeps at most ``limit`` requests it was handed; later ones stay in the index
  and the next long-poll (with the cursor of the last one returned) gets them at once.
- The wire JSON of at most ``max_wires`` indexed requests (the newest opened by commits)
  is kept, so that a long-poll whose cursor is behind them answers without a read (every
  bot a request wakes comes back for the next one at once); past the bound the oldest is
  dropped, and a long-poll that needs it reads it from the database.
- At most ``max_pending`` pending requests are indexed. One more is not indexed: the index
  is marked overflowed, long-polls refuse with `WaitersFull` until a re-read of the
  database (done by the driver while the index is overflowed) fits again.

A commit wakes the waiters of the request's own thread before those of every thread (a
thread's own bot is the one that answers); trio may still run one batch of woken tasks in
either order. Timing for ``/metrics`` (t3d/observe/metrics.py sets the hooks): per request
opened, seconds from its ``created_at`` (when its command was handed to the writer) to its
commit reaching `on_commit`; per request a long-poll reply carries, seconds from that
commit to the reply being built (`replied`, called by the driver with no await before the
transport writes it). Requests found by the seed read have no commit time and are not timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from t3d.errors import T3dError
from t3d.live.wire import summarize_payload
from t3d.store.commit import Committed

MAX_WAITERS = 512
MAX_PER_OWNER = 16
MAX_PENDING = 100_000
MAX_WIRES = 1024

# (opening sequence, request id, the request's wire JSON: large fields summarized)
Found = tuple[int, str, bytes]


class WaitersFull(T3dError):
    """A long-poll was refused at one of the registry's bounds."""


@attrs.frozen
class PendingRequest:
    request_id: str
    thread_id: str
    sequence: int  # of the request.updated event that opened it
    committed_at: float = 0.0  # time.monotonic() when its commit reached on_commit; 0: not known


def _ignore() -> None:
    return None


def _ignore_seconds(seconds: float) -> None:
    return None


def _ignore_reply(via: str, seconds: float) -> None:
    return None


@attrs.define(eq=False)
class Waiter:
    """One long-poll: requests opened after ``after`` (of the ``threads``; None: of any thread)."""

    after: int
    threads: frozenset[str] | None
    limit: int
    owner: object | None = None
    # Called (synchronously, from `on_commit`) when ``found`` gained a request.
    wake: Callable[[], None] = _ignore
    found: list[Found] = attrs.Factory(list)


@attrs.frozen
class WaitersStatistics:
    waiters: int
    pending_indexed: int
    overflowed: bool


class RequestWaiters:
    def __init__(
        self, *, max_waiters: int = MAX_WAITERS, max_per_owner: int = MAX_PER_OWNER, max_pending: int = MAX_PENDING,
        max_wires: int = MAX_WIRES,
    ) -> None:  # fmt: skip
        self.max_waiters = max_waiters
        self.max_wires = max_wires
        # The wire JSON of the newest indexed requests, by id, oldest first.
        self._wires: dict[str, bytes] = {}
        self.max_per_owner = max_per_owner
        self.max_pending = max_pending
        # Pending requests by id, in opening-sequence order (hook additions come in sequence
        # order; `seed` re-sorts after merging older ones).
        self._pending: dict[str, PendingRequest] = {}
        # Waiters by the thread they watch (a waiter of several threads is under each);
        # None: waiters of every thread.
        self._waiters: dict[str | None, set[Waiter]] = {}
        self._count = 0
        self._per_owner: dict[object, int] = {}
        # The newest committed sequence the index has seen (commits and the seed's read).
        self.last_sequence = 0
        self._seeded = False
        self.overflowed = False
        # While a seed read runs: requests closed and threads deleted since it began.
        self._closed_while_seeding: set[str] | None = None
        self._deleted_while_seeding: set[str] | None = None
        # Timing hooks (seconds): created_at to commit per opened request; commit to reply
        # (``via``: the transport family, "mcp" or "rpc") per request a reply carries.
        self.on_committed: Callable[[float], None] = _ignore_seconds
        self.on_replied: Callable[[str, float], None] = _ignore_reply

    # --- the index -------------------------------------------------------------------------

    @property
    def needs_seed(self) -> bool:
        """True until the database was read once, and again while the index is overflowed."""
        return not self._seeded or self.overflowed

    def begin_seed(self) -> None:
        """Call right before the seed read starts (its transaction must begin after this)."""
        self._closed_while_seeding, self._deleted_while_seeding = set(), set()

    def abort_seed(self) -> None:
        self._closed_while_seeding = self._deleted_while_seeding = None

    def seed(self, rows: Iterable[tuple[str, str, int]], head: int) -> None:
        """Merge what the seed read found: (request id, thread id, opening sequence) of each
        pending request (at most ``max_pending + 1`` of them), and the newest sequence then."""
        closed = self._closed_while_seeding or set()
        deleted = self._deleted_while_seeding or set()
        self.abort_seed()
        merged = dict(self._pending)
        too_many = False
        for request_id, thread_id, sequence in rows:
            if request_id in merged or request_id in closed or thread_id in deleted:
                continue
            if len(merged) >= self.max_pending:
                too_many = True
                break
            merged[request_id] = PendingRequest(request_id, thread_id, sequence)
        self._pending = dict(sorted(merged.items(), key=lambda pair: pair[1].sequence))
        self.last_sequence = max(self.last_sequence, head)
        self._seeded = True
        self.overflowed = too_many

    def pending_after(self, after: int, threads: frozenset[str] | None, limit: int) -> list[PendingRequest]:
        """The oldest ``limit`` indexed requests opened after ``after`` (of the ``threads``)."""
        newer: list[PendingRequest] = []
        for request in reversed(self._pending.values()):
            if request.sequence <= after:
                break
            if threads is None or request.thread_id in threads:
                newer.append(request)
        newer.reverse()
        return newer[:limit]

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop requests a read found no longer pending (their closing commit may still be on
        its way to `on_commit`, which then finds nothing to do)."""
        for request_id in request_ids:
            self._pending.pop(request_id, None)
            self._wires.pop(request_id, None)

    def pending_wires(self, thread_id: str | None) -> list[bytes] | None:
        """The kept wire JSON of every pending request (of ``thread_id``; None: of every
        thread), oldest first: what a read of the pending requests would find, as of the
        last commit. None when the index cannot tell alone (not seeded, overflowed, a
        request's wire not kept, more than ``max_wires`` pending): read them then."""
        if self.needs_seed or len(self._pending) > self.max_wires:
            return None
        wires = []
        for request in self._pending.values():
            if thread_id is None or request.thread_id == thread_id:
                wire = self._wires.get(request.request_id)
                if wire is None:
                    return None
                wires.append(wire)
        return wires

    def wire_of(self, request_id: str) -> bytes | None:
        """The kept wire JSON of an indexed request (None: not kept; read it)."""
        return self._wires.get(request_id)

    def on_commit(self, committed: Committed) -> None:
        """Index each request opened, forget each one closed; hand new ones to waiters."""
        for event in committed.events:
            self.last_sequence = max(self.last_sequence, event.sequence)
            if event.kind == "request.updated":
                status: Any = getattr(event.entity, "status", None)
                if status == "pending":
                    created: Any = getattr(event.entity, "created_at", None)
                    if isinstance(created, float | int):
                        self.on_committed(max(0.0, time.time() - created))
                    self._opened(event.entity.id, event.thread_id or "", event.sequence, event.payload)
                else:
                    self._closed(event.entity.id)
            elif event.kind == "thread.deleted" and event.thread_id is not None:
                self._thread_deleted(event.thread_id)

    def _opened(self, request_id: str, thread_id: str, sequence: int, payload: bytes) -> None:
        if request_id not in self._pending:
            if len(self._pending) >= self.max_pending:
                self.overflowed = True
            else:
                self._pending[request_id] = PendingRequest(request_id, thread_id, sequence, time.monotonic())
        wire = summarize_payload(payload)  # once, shared by every waiter
        if request_id in self._pending and self.max_wires > 0:
            self._wires.pop(request_id, None)
            if len(self._wires) >= self.max_wires:
                del self._wires[next(iter(self._wires))]
            self._wires[request_id] = wire
        # The thread's own waiters first: its bot is the one that answers.
        for waiter in (*self._waiters.get(thread_id, ()), *self._waiters.get(None, ())):
            if sequence > waiter.after and len(waiter.found) < waiter.limit:
                waiter.found.append((sequence, request_id, wire))
                waiter.wake()

    def _closed(self, request_id: str) -> None:
        request = self._pending.pop(request_id, None)
        self._wires.pop(request_id, None)
        if self._closed_while_seeding is not None:
            self._closed_while_seeding.add(request_id)
        if request is None:
            return
        for waiter in (*self._waiters.get(None, ()), *self._waiters.get(request.thread_id, ())):
            if waiter.found:
                waiter.found = [f for f in waiter.found if f[1] != request_id]

    def _thread_deleted(self, thread_id: str) -> None:
        if self._deleted_while_seeding is not None:
            self._deleted_while_seeding.add(thread_id)
        for request in [r for r in self._pending.values() if r.thread_id == thread_id]:
            self._closed(request.request_id)

    def replied(self, found: Iterable[Found], via: str) -> None:
        """Time a long-poll reply that carries ``found``, built just now (see the module doc)."""
        now = None
        for _, request_id, _ in found:
            request = self._pending.get(request_id)
            if request is not None and request.committed_at:
                now = time.monotonic() if now is None else now
                self.on_replied(via, max(0.0, now - request.committed_at))

    # --- waiters ---------------------------------------------------------------------------

    def add(self, waiter: Waiter) -> None:
        """Register ``waiter``; `WaitersFull` at a bound (nothing is registered then)."""
        if self.overflowed:
            raise WaitersFull(
                f"more than {self.max_pending} runtime requests are pending, more than a long-poll "
                "tracks; answer some (requests.pending lists them) and wait again"
            )
        if self._count >= self.max_waiters:
            raise WaitersFull(
                f"the daemon already holds {self.max_waiters} requests.wait long-polls, its bound; "
                "retry once one returns, and let one long-poll watch several threads (thread_ids) or every thread (no filter)"
            )
        if waiter.threads is not None and not waiter.threads:
            raise ValueError("a waiter watches at least one thread (threads=None: every thread)")
        owner = waiter.owner
        if owner is not None and self._per_owner.get(owner, 0) >= self.max_per_owner:
            raise WaitersFull(
                f"this connection already holds {self.max_per_owner} requests.wait long-polls, the "
                "bound per connection; wait for one to return, or let one long-poll watch several threads "
                "(thread_ids) or every thread (no filter)"
            )
        for key in _keys(waiter):
            self._waiters.setdefault(key, set()).add(waiter)
        self._count += 1
        if owner is not None:
            self._per_owner[owner] = self._per_owner.get(owner, 0) + 1

    def remove(self, waiter: Waiter) -> None:
        """Forget ``waiter`` and what it was handed (idempotent)."""
        keys = _keys(waiter)
        if not keys or waiter not in self._waiters.get(keys[0], ()):
            return
        for key in keys:
            waiters = self._waiters[key]
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[key]
        self._count -= 1
        owner = waiter.owner
        if owner is not None:
            left = self._per_owner[owner] - 1
            if left:
                self._per_owner[owner] = left
            else:
                del self._per_owner[owner]
        waiter.found = []
        waiter.wake = _ignore

    def statistics(self) -> WaitersStatistics:
        return WaitersStatistics(self._count, len(self._pending), self.overflowed)


def _keys(waiter: Waiter) -> tuple[str | None, ...]:
    """Where ``waiter`` is filed: under each thread it watches, or under None for all."""
    return (None,) if waiter.threads is None else tuple(waiter.threads)
