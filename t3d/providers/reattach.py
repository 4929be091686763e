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

Rules a session follows on reattach:
- The thread's open turn is the one named in ``meta``: replay its output from
  ``turn_offset`` through a fresh mapper (item ids are deterministic and writes are
  upserts, so what was committed already is rewritten unchanged), then read on live.
- The open turn is another one: it never reached the process; start it as usual.
- The replay lost the turn's start (over the spawner's bound): read on from the live
  point, keeping what was committed, and record the gap in the turn as an error item.
"""

from __future__ import annotations

from typing import Any

import attrs

from t3d.domain.model import RuntimeRequest, Turn, TurnItem
from t3d.spawn.child import Child


@attrs.frozen
class Reattach:
    child: Child
    # The thread's active turn (starting, running or waiting), if it has one.
    turn: Turn | None
    # That turn's prompt.
    user_text: str
    # That turn's requests, whatever their status, and its committed items.
    requests: tuple[RuntimeRequest, ...] = ()
    items: tuple[TurnItem, ...] = ()

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
