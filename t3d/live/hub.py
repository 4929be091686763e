"""The live hub: committed events fanned out to subscriptions.

Rules:
- `publish` runs on the loop right after COMMIT, in sequence order. Each event
  is turned into its wire form and encoded once; every subscription that
  wants it gets the same bytes.
- Fan-out never awaits: each subscription has a bounded buffer
  (`MAX_ITEMS` frames or `MAX_BYTES`). A subscription that would pass the bound
  drops its buffer and is marked for resync: its connection sends ``resync``,
  a fresh snapshot, then live events again. A slow client never slows the
  hub or other clients, and never grows memory.
- Thread subscriptions get their thread's events. Shell subscriptions get
  project updates and one recomputed shell row per touched thread per commit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal

import attrs
import orjson

from t3d.store.commit import Committed

MAX_ITEMS = 1000
MAX_BYTES = 8 * 1024 * 1024

Frame = tuple[int, bytes]  # (sequence, encoded wire event)


def wire_event(kind: str, sequence: int, entity: bytes) -> bytes:
    """``{"kind":K,"sequence":N,"entity":E}`` from already-encoded entity bytes."""
    return b'{"kind":"%s","sequence":%d,"entity":%s}' % (kind.encode(), sequence, entity)


@attrs.define(eq=False)
class Subscription:
    sub_id: str
    topic: Literal["thread", "shell"]
    thread_id: str | None
    # Called (synchronously) whenever frames or a resync are ready.
    wake: Callable[[], None]
    frames: deque[Frame] = attrs.Factory(deque)
    buffered_bytes: int = 0
    needs_resync: bool = False
    resyncs: int = 0
    # Frames at or below the sequence of the snapshot the client holds are covered by it.
    base_seq: int = 0
    # False until the client has its snapshot; frames wait in the buffer meanwhile.
    live: bool = False
    turn_limit: int = 10
    max_items: int = MAX_ITEMS
    max_bytes: int = MAX_BYTES

    def push(self, frame: Frame) -> None:
        if self.needs_resync:
            return  # everything until the fresh snapshot is covered by it
        size = len(frame[1])
        if len(self.frames) >= self.max_items or self.buffered_bytes + size > self.max_bytes:
            self.frames.clear()
            self.buffered_bytes = 0
            self.needs_resync = True
            self.resyncs += 1
        else:
            self.frames.append(frame)
            self.buffered_bytes += size
        self.wake()

    def take(self) -> list[Frame]:
        frames = list(self.frames)
        self.frames.clear()
        self.buffered_bytes = 0
        return frames


@attrs.frozen
class HubStatistics:
    thread_subscriptions: int
    shell_subscriptions: int
    published: int
    resyncs: int


class Hub:
    def __init__(self) -> None:
        self._threads: dict[str, set[Subscription]] = {}
        self._shell: set[Subscription] = set()
        self._published = 0
        self._resyncs_of_closed = 0

    def subscribe(self, sub: Subscription) -> None:
        if sub.topic == "shell":
            self._shell.add(sub)
        else:
            assert sub.thread_id is not None
            self._threads.setdefault(sub.thread_id, set()).add(sub)

    def unsubscribe(self, sub: Subscription) -> None:
        self._resyncs_of_closed += sub.resyncs
        if sub.topic == "shell":
            self._shell.discard(sub)
        elif sub.thread_id is not None:
            subs = self._threads.get(sub.thread_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._threads[sub.thread_id]

    def publish(self, committed: Committed) -> None:
        for event in committed.events:
            self._published += 1
            frame = (event.sequence, wire_event(event.kind, event.sequence, event.payload))
            if event.kind == "project.updated":
                for sub in self._shell:
                    sub.push(frame)
            elif event.thread_id is not None:
                for sub in self._threads.get(event.thread_id, ()):
                    sub.push(frame)
        for row in committed.shell:
            if row.payload is None:
                body = orjson.dumps({"id": row.thread_id})
                frame = (row.sequence, wire_event("shell.removed", row.sequence, body))
            else:
                frame = (row.sequence, wire_event("shell.updated", row.sequence, row.payload))
            for sub in self._shell:
                sub.push(frame)

    def statistics(self) -> HubStatistics:
        all_subs = [s for subs in self._threads.values() for s in subs] + list(self._shell)
        return HubStatistics(
            thread_subscriptions=sum(len(s) for s in self._threads.values()),
            shell_subscriptions=len(self._shell),
            published=self._published,
            resyncs=self._resyncs_of_closed + sum(s.resyncs for s in all_subs),
        )
