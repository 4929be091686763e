"""`WritePipeline`: one provider session's writes, in order, without a round trip each.

Theory of operation. A session used to wait for each update's commit before
reading on, so its own updates never shared a transaction, and a burst cost
one round trip to the writer thread per update. Through the pipeline an
update (an item's new state, the turn going running, the session record) is
handed to the writer's queue at once, its place in the commit order fixed
then, and the session reads on; the writer batches what is queued.

Rules:
- Order: every write enters the one writer queue in the order the session
  made it, so the store sees the session's updates in order.
- Bound: at most ``depth`` updates in flight; the next waits for the oldest
  to commit (with the writer's own bounded queue, this is the backpressure
  that stops the session reading provider output when the disk falls behind).
- Barriers: any other command (a turn's end, a request opened) first waits
  for every update before it, then commits and is awaited, so what a client
  learns from it (a turn is done, a prompt is open) follows the updates.
- `settled` waits for the updates handed over so far (commit order is hand-over
  order, so the last one's outcome is everyone's), without collecting them.
- Errors: an update the domain rejects (its thread was deleted meanwhile) is
  reported to ``on_rejected``, as the session did before; any other error is
  raised from the next `write` or `drain`, so it reaches the session's
  supervisor. A barrier refused at a bound (code ``full``: a turn's pending
  requests) is raised from `write`: the session answers its CLI itself
  (`t3d.providers.prompts`).
- The database unavailable (a full disk, another process's lock) is not an
  error here: the writer holds updates and retries them in order, and a barrier
  goes through `Store.record`, which waits and retries; the session waits at the
  bound meanwhile, so it stops reading its CLI's stdout, and nothing is dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from t3d.domain import commands as c
from t3d.errors import DomainError

# Two writer batches (store.BATCH_JOBS is 64): one session's next full batch
# waits in the queue while its last one commits. At 64 a burst committed in
# batches of ~32 (the other half was still committing); at 128, in full
# batches of 64 (`python -m bench writes`: 31 -> 16 transactions per 1,000).
DEPTH = 128


class Outcome(Protocol):
    async def outcome(self) -> Any: ...

    async def settled(self) -> None: ...

    @property
    def done(self) -> bool: ...


class WritePipeline:
    def __init__(
        self,
        send: Callable[[c.Command], Awaitable[Outcome]],
        record: Callable[[c.Command], Awaitable[Any]],
        on_rejected: Callable[[c.Command, DomainError], None],
        depth: int = DEPTH,
    ) -> None:
        self._send = send
        self._record = record
        self._on_rejected = on_rejected
        self._depth = depth
        self._in_flight: deque[tuple[c.Command, Outcome]] = deque()

    async def write(self, command: c.Command) -> bool:
        """Write ``command`` after every earlier one: an update is handed over and not
        waited for; a barrier waits for the updates before it, then for itself. False: the
        domain refused the barrier (reported to ``on_rejected`` too)."""
        if isinstance(command, c.BATCHABLE):
            while len(self._in_flight) >= self._depth:
                await self._collect_oldest()
            self._in_flight.append((command, await self._send(command)))
            return True
        await self.drain()
        try:
            await self._record(command)
        except DomainError as exc:
            if exc.code == "full":
                raise
            self._on_rejected(command, exc)
            return False
        return True

    def settled_now(self) -> bool:
        """True once every update handed over so far has committed or failed."""
        return not self._in_flight or self._in_flight[-1][1].done

    async def settled(self) -> None:
        """Wait until every update handed over so far has committed or failed (leaving
        their outcomes to `write` and `drain`); later ones are not waited for. The
        coalescer waits here before it hands over more (it widens while the writer lags)."""
        if self._in_flight:
            await self._in_flight[-1][1].settled()

    async def drain(self) -> None:
        """Wait until every update handed over has committed."""
        while self._in_flight:
            await self._collect_oldest()

    async def _collect_oldest(self) -> None:
        command, pending = self._in_flight[0]
        try:
            await pending.outcome()
        except DomainError as exc:
            self._on_rejected(command, exc)
        finally:
            self._in_flight.popleft()
