"""The live hub: committed events fanned out to subscriptions. Pure: no trio, no I/O.

Rules:
- `publish` runs on the loop right after COMMIT, in sequence order. Each event
  is turned into its wire form (large fields summarized, wire.py) and encoded
  once, only if someone wants it; every subscription that wants it gets the
  same bytes object. (``encode_once=False`` projects and encodes per
  subscriber instead: the old way, kept as a setting to measure against.)
- Fan-out never awaits: each subscription has a bounded buffer (`MAX_ITEMS`
  frames or `MAX_BYTES`). A frame that would pass the bound drops the whole
  buffer and marks the subscription for resync: its connection sends
  ``resync``, a fresh snapshot, then live events again. A slow client never
  slows the hub or other clients, and never grows memory.
- The subscriptions of one connection also share its byte budget
  (budget.py): a frame that would take the connection past it first
  resyncs that connection's fullest subscriptions.
- Thread subscriptions get their thread's events. Shell subscriptions get
  project updates and the shell rows the writer recomputed once per touched
  thread per commit, in sequence order.
- A subscription buffers from the moment it joins, before its base (snapshot
  or replay) is read; once the base is sent it goes live at the base's
  sequence, and frames at or below it (already in the base) are skipped.
- The in-memory shell (`shell_rows`, t3d/live/shell_rows.py) takes every commit here,
  before the fan-out: a shell served from it at any moment reflects exactly the commits
  published up to then, and a subscriber registered before it is taken gets the rest.
- Workspace statuses (`WorkspaceView`, kept in memory by t3d/git/workspaces.py) are
  not events: shell rows carry their thread's (spliced in as they go out), and
  `publish_workspace` posts a changed one to the shell subscriptions and to the
  thread subscriptions of the threads working there that asked for them
  (``watch_workspace``: each such subscription is a lease on the workspaces it
  covers, `watchers`). A subscription keeps only
  the latest value per workspace (`Subscription.workspace`): a slow client
  never builds a backlog of them, and the bound is one per workspace.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, Protocol

import attrs
import orjson

from t3d.domain.codec import to_json
from t3d.live.budget import Budget
from t3d.live.shell_rows import ShellRows
from t3d.live.wire import event_frame, shell_row_frame, with_workspace
from t3d.store.commit import Committed, StoredEvent

MAX_ITEMS = 1000
MAX_BYTES = 8 * 1024 * 1024

Frame = tuple[int, bytes]  # (sequence, encoded wire event)


class WorkspaceView(Protocol):
    """The in-memory workspace statuses, as encoded values (t3d/git/workspaces.py)."""

    def row(self, thread_id: str) -> bytes | None:
        """The value a thread's shell row carries as ``workspace``."""

    def rows(self) -> Mapping[str, bytes]:
        """Thread id -> that value, for every thread (a copy: read off the loop)."""

    def of_thread(self, thread_id: str) -> tuple[str, bytes] | None:
        """The thread's workspace path and value."""

    def every(self) -> Mapping[str, bytes]:
        """Workspace path -> value."""

    def watchers_changed(self) -> None:
        """A subscription came or went (the set of watched workspaces may have changed)."""


@attrs.define(eq=False)
class Subscription:
    sub_id: str
    topic: Literal["thread", "shell"]
    thread_id: str | None
    # Called (synchronously) whenever frames or a resync are ready.
    wake: Callable[[], None]
    frames: deque[Frame] = attrs.Factory(deque)
    buffered_bytes: int = 0
    # Set when the buffer overflowed; frames are ignored until `begin_resync`.
    needs_resync: bool = False
    resyncs: int = 0
    # The sequence of the base (snapshot or replay) the client holds: frames at or
    # below it are covered by the base and never delivered.
    base_seq: int = 0
    # False until the client has its base; frames wait in the buffer meanwhile.
    live: bool = False
    turn_limit: int = 10
    max_items: int = MAX_ITEMS
    max_bytes: int = MAX_BYTES
    # The connection's budget, shared with its other subscriptions (None: only the bounds above).
    budget: Budget | None = None
    # The subscriber asked for workspace.updated notifications (and so watches its workspaces).
    watch_workspace: bool = False
    # Workspace values waiting to be sent: path -> the latest encoded value (one per path).
    workspace: dict[str, bytes] = attrs.Factory(dict)
    # The sequence of the last frame delivered (or the base's): the seq a workspace.updated
    # notification carries, so that resuming from it loses no event.
    delivered_seq: int = 0

    def push(self, frame: Frame) -> None:
        if self.needs_resync:
            return  # everything until the fresh snapshot is covered by it
        size = len(frame[1])
        if len(self.frames) >= self.max_items or self.buffered_bytes + size > self.max_bytes:
            self.overflow()
        else:
            if self.budget is not None:
                self.budget.make_room(size)  # may resync this subscription itself
            if not self.needs_resync:
                self.frames.append(frame)
                self.buffered_bytes += size
                if self.budget is not None:
                    self.budget.grew(size)
        self.wake()

    def overflow(self) -> None:
        """Drop the buffer and ignore frames until `begin_resync` (a fresh base follows)."""
        self.take()
        self.needs_resync = True
        self.resyncs += 1

    def pop(self) -> Frame | None:
        """The next frame to deliver (newer than the base), or None. Only while live."""
        while self.live and not self.needs_resync and self.frames:
            frame = self.frames.popleft()
            self._shrunk(len(frame[1]))
            if frame[0] > self.base_seq:
                self.delivered_seq = frame[0]
                return frame
        return None

    def post_workspace(self, path: str, value: bytes) -> None:
        """The workspace at ``path`` now has ``value`` (it replaces any unsent one)."""
        if self.workspace.get(path) is not value:
            self.workspace[path] = value
            self.wake()

    def take(self) -> list[Frame]:
        """Every buffered frame, delivered or not (tests and diagnostics)."""
        frames = list(self.frames)
        self.frames.clear()
        self._shrunk(self.buffered_bytes)
        return frames

    def _shrunk(self, size: int) -> None:
        self.buffered_bytes -= size
        if self.budget is not None:
            self.budget.buffered -= size

    def begin_resync(self) -> None:
        """Start over: drop the buffer and buffer again from now; a fresh base must follow,
        read after this call, so that it covers every frame this subscription ignored."""
        self.live = False
        self.needs_resync = False
        self.take()

    def went_live(self, base_seq: int) -> None:
        """The client holds a base up to ``base_seq``; deliver newer frames from now on."""
        self.base_seq = base_seq
        self.delivered_seq = max(self.delivered_seq, base_seq)
        self.live = True
        self.wake()


@attrs.frozen
class HubStatistics:
    thread_subscriptions: int
    shell_subscriptions: int
    published: int
    resyncs: int
    buffered_frames: int
    buffered_bytes: int


class Hub:
    def __init__(self, *, encode_once: bool = True) -> None:
        self.encode_once = encode_once
        self._threads: dict[str, set[Subscription]] = {}
        self._shell: set[Subscription] = set()
        self._published = 0
        self._resyncs_of_closed = 0
        # The workspace statuses shell rows carry (None: workspace status is off).
        self.workspaces: WorkspaceView | None = None
        # The shell in memory (shell_rows.py), kept here from the same rows the shell
        # subscriptions get; unseeded (and holding nothing) until a shell is first served.
        self.shell_rows = ShellRows(self._workspace_row)

    def _workspace_row(self, thread_id: str) -> bytes | None:
        return self.workspaces.row(thread_id) if self.workspaces is not None else None

    def subscribe(self, sub: Subscription, *, every_workspace: bool = False) -> None:
        """Join. A thread subscription is handed its thread's workspace value at once (sent
        after its base); a shell one every workspace's with ``every_workspace`` (a resume,
        whose replay carries only the rows that moved)."""
        if sub.topic == "shell":
            self._shell.add(sub)
        else:
            assert sub.thread_id is not None
            self._threads.setdefault(sub.thread_id, set()).add(sub)
        if self.workspaces is not None and sub.watch_workspace:
            if sub.thread_id is not None and (found := self.workspaces.of_thread(sub.thread_id)) is not None:
                sub.workspace[found[0]] = found[1]
            elif sub.topic == "shell" and every_workspace:
                sub.workspace.update(self.workspaces.every())
            self.workspaces.watchers_changed()

    def unsubscribe(self, sub: Subscription) -> None:
        """Forget ``sub`` and drop its buffer (idempotent)."""
        if sub in self._shell:
            self._shell.discard(sub)
        elif sub.thread_id is not None and sub in self._threads.get(sub.thread_id, ()):
            subs = self._threads[sub.thread_id]
            subs.discard(sub)
            if not subs:
                del self._threads[sub.thread_id]
        else:
            return
        self._resyncs_of_closed += sub.resyncs
        sub.take()
        sub.workspace.clear()
        if self.workspaces is not None and sub.watch_workspace:
            self.workspaces.watchers_changed()

    def watchers(self) -> tuple[bool, frozenset[str]]:
        """Whether a shell subscription watches workspaces, and the threads whose thread
        subscriptions do."""
        shell = any(sub.watch_workspace for sub in self._shell)
        return shell, frozenset(t for t, subs in self._threads.items() if any(s.watch_workspace for s in subs))

    def publish_workspace(self, path: str, thread_ids: Iterable[str], value: bytes) -> None:
        """The workspace at ``path`` (of ``thread_ids``) changed to ``value``."""
        self.shell_rows.workspace_changed(thread_ids)
        for sub in self._shell:
            if sub.watch_workspace:
                sub.post_workspace(path, value)
        for thread_id in thread_ids:
            for sub in self._threads.get(thread_id, ()):
                if sub.watch_workspace:
                    sub.post_workspace(path, value)

    def publish(self, committed: Committed) -> None:
        self.shell_rows.apply(committed)
        shell: list[tuple[int, Callable[[], bytes]]] = []
        for event in committed.events:
            self._published += 1
            if event.kind == "project.updated":
                shell.append((event.sequence, _event_encoder(event)))
            elif event.thread_id is not None and (subs := self._threads.get(event.thread_id)):
                self._fan_out(subs, event.sequence, _event_encoder(event))
        if not self._shell:
            return
        workspaces = self.workspaces
        for row in committed.shell:
            payload = row.payload
            if payload is not None and workspaces is not None:
                payload = with_workspace(payload, workspaces.row(row.thread_id))
            shell.append((row.sequence, _row_encoder(row.thread_id, row.sequence, payload)))
        shell.sort(key=lambda pair: pair[0])
        for sequence, encode in shell:
            self._fan_out(self._shell, sequence, encode)

    def _fan_out(self, subs: Iterable[Subscription], sequence: int, encode: Callable[[], bytes]) -> None:
        if self.encode_once:
            frame = (sequence, encode())
            for sub in subs:
                sub.push(frame)
        else:
            for sub in subs:
                sub.push((sequence, encode()))

    def statistics(self) -> HubStatistics:
        all_subs = [s for subs in self._threads.values() for s in subs] + list(self._shell)
        return HubStatistics(
            thread_subscriptions=sum(len(s) for s in self._threads.values()),
            shell_subscriptions=len(self._shell),
            published=self._published,
            resyncs=self._resyncs_of_closed + sum(s.resyncs for s in all_subs),
            buffered_frames=sum(len(s.frames) for s in all_subs),
            buffered_bytes=sum(s.buffered_bytes for s in all_subs),
        )


def _event_encoder(event: StoredEvent) -> Callable[[], bytes]:
    """The event's wire frame. Called once per event (project once), or once per subscriber
    (``encode_once=False``: then the entity itself is re-encoded each time, as a per-subscriber
    projection would)."""
    first = True

    def encode() -> bytes:
        nonlocal first
        if first:
            first = False
            return event_frame(event.kind, event.sequence, event.payload)
        return event_frame(event.kind, event.sequence, orjson.dumps(to_json(event.entity)))

    return encode


def _row_encoder(thread_id: str, sequence: int, payload: bytes | None) -> Callable[[], bytes]:
    first = True

    def encode() -> bytes:
        nonlocal first
        if first or payload is None:
            first = False
            return shell_row_frame(thread_id, sequence, payload)
        return shell_row_frame(thread_id, sequence, orjson.dumps(orjson.loads(payload)))

    return encode
