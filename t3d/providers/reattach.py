"""What a session needs to take over a provider process a previous daemon left running.
Provider-neutral: each provider's session replays its own output through its own mapper.

The child's ``meta`` is what the previous daemon last told the spawner (`Child.ack`):

- ``thread_id``, ``provider``, ``session_id`` (the `ProviderSession` record),
  ``started_at``: what the process is;
- ``turn_id`` and ``turn_offset``: the turn last handed to the process and the stdout
  offset where its output begins (set before its prompt is written, so a turn named
  here may or may not have reached the process; one not named here never did);
- ``native_session_id``, ``cost_so_far``: the provider's session id and the running
  cost it had reported at the last turn's end.
- ``steers`` (Claude): messages steered into that turn (each ends in a result of its own).
  ``turn_id`` is None once a turn's end is acked: what follows is no turn's output yet.

A provider's session may keep more there (Codex: the next JSON-RPC id, the open turn's
turn/start id, the token total, the last finished turns).

Rules a session follows on reattach:
- The thread's open turn is the one named in ``meta``: replay its output from
  ``turn_offset`` through a fresh mapper (item ids are deterministic and writes are
  upserts, so what was committed already is rewritten unchanged), then read on live.
- The open turn is another one: it never reached the process; start it as usual.
- The replay lost the turn's start (over the spawner's bound): read on from the live
  point, keeping what was committed, and record the gap in the turn as an error item.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from t3d.domain.model import RuntimeRequest, Turn, TurnItem
from t3d.spawn.child import Child

GAP_TITLE = "Output lost across a daemon restart"


@attrs.frozen
class Reattach:
    child: Child
    # The thread's active turn (starting, running or waiting), if it has one.
    turn: Turn | None
    # That turn's prompt.
    user_text: str
    # That turn's requests (and its subagents' turns'), whatever their status, and its committed items.
    requests: tuple[RuntimeRequest, ...] = ()
    items: tuple[TurnItem, ...] = ()
    # The thread's background tasks still running (their items), whatever their turn.
    tasks: tuple[TurnItem, ...] = ()

    @property
    def meta(self) -> dict[str, Any]:
        return self.child.meta

    @property
    def same_turn(self) -> bool:
        """The open turn is the one the process was last given."""
        return self.turn is not None and self.meta.get("turn_id") == self.turn.id

    @property
    def turn_offset(self) -> int:
        value = self.meta.get("turn_offset")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def complete(self) -> bool:
        """The replay holds the open turn's output from its first byte."""
        return self.child.replay.start <= self.turn_offset

    @property
    def lost_bytes(self) -> int:
        """How much of the open turn's output the replay lacks (0 when it is complete)."""
        return max(0, self.child.replay.start - self.turn_offset)

    def gap_item(self, provider: str, clock: Callable[[], float]) -> TurnItem:
        """The error item that says, in the open turn, what an incomplete replay lost."""
        assert self.turn is not None
        lost = self.lost_bytes
        return TurnItem(
            id=f"{self.turn.id}:replay-gap:{self.child.replay.start}",
            thread_id=self.turn.thread_id,
            turn_id=self.turn.id,
            ordinal=0,
            kind="error",
            status="failed",
            title=GAP_TITLE,
            text=(
                f"t3d restarted while this turn ran and {lost} bytes of {provider}'s output "
                "were over the spawner's replay buffer; items from before the restart may be incomplete"
            ),
            data={"lost_bytes": lost},
            updated_at=clock(),
        )
