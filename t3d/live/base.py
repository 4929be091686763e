"""A subscription's base: a fresh snapshot, or a replay of what it missed. Pure.

The decoders here run on a reader thread, right after the read transaction
(`Store.read`): they summarize large fields and encode the chunks there, so
the loop only wraps finished bytes in notification envelopes.

- `Snapshot`: ``snapshot.chunk`` payloads (see chunks.py), then ``snapshot.end``.
- `Replay`: the wire frames of the missed events, exactly as they went out
  live (same projection, same bytes), then ``synced``.
Either way the subscriber then holds everything up to ``sequence``, and live
frames at or below it are dropped as duplicates.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import orjson

from t3d.live.chunks import Parts, chunk_objects
from t3d.live.hub import Frame
from t3d.live.wire import event_frame, shell_row_frame, summarize_payload, with_workspace
from t3d.store.commit import shell_payload
from t3d.store.queries import ShellRaw, SnapshotRaw
from t3d.store.replay import ShellReplayRaw, ThreadReplayRaw

THREAD_LISTS = ("turns", "items", "requests", "tasks")
SHELL_LISTS = ("projects", "threads")


@attrs.frozen
class Snapshot:
    sequence: int
    chunks: tuple[bytes, ...]  # the ``data`` of each snapshot.chunk, in order


@attrs.frozen
class Replay:
    sequence: int
    frames: tuple[Frame, ...]  # missed events' wire frames, in sequence order


Base = Snapshot | Replay


def thread_parts(raw: SnapshotRaw) -> Parts | None:
    """The thread snapshot as parts, streamed turn by turn: each turn's items, then the turn
    (a client sees a turn's items before the turn), then pending requests. None: no thread."""
    if raw.thread is None:
        return None
    before = b"null"
    if raw.has_more and raw.turns:
        before = b"%d" % orjson.loads(raw.turns[0])["ordinal"]
    head = (
        ("sequence", b"%d" % raw.sequence),
        ("thread", raw.thread),
        ("has_more", b"true" if raw.has_more else b"false"),
        ("before", before),
    )
    elements: list[tuple[int, bytes]] = []
    items = iter(raw.items)
    for turn, count in zip(raw.turns, raw.turn_items, strict=True):
        elements += [(1, summarize_payload(next(items))) for _ in range(count)]
        elements.append((0, summarize_payload(turn)))
    elements += [(2, summarize_payload(request)) for request in raw.requests]
    elements += [(3, summarize_payload(task)) for task in raw.tasks]
    if raw.children is None:
        return Parts(head, THREAD_LISTS, tuple(elements))
    elements += [(4, summarize_payload(child)) for child in raw.children]
    return Parts(head, (*THREAD_LISTS, "children"), tuple(elements))


NO_WORKSPACES: Mapping[str, bytes] = {}


def shell_parts(raw: ShellRaw, workspaces: Mapping[str, bytes] = NO_WORKSPACES) -> Parts:
    """The shell as parts; each thread's row carries its ``workspace`` from ``workspaces``
    (thread id -> encoded status, taken on the loop before the read)."""
    elements = [(0, p) for p in raw.projects]
    if workspaces:
        rows = zip(raw.thread_ids, raw.threads, strict=True)
        elements += [(1, with_workspace(shell_payload(*row), workspaces.get(tid))) for tid, row in rows]
    else:
        elements += [(1, shell_payload(*row)) for row in raw.threads]
    return Parts((("sequence", b"%d" % raw.sequence),), SHELL_LISTS, tuple(elements))


def snapshot_of(parts: Parts, sequence: int) -> Snapshot:
    return Snapshot(sequence, tuple(chunk_objects(parts)))


def decode_thread_snapshot(raw: SnapshotRaw) -> Snapshot | None:
    parts = thread_parts(raw)
    return None if parts is None else snapshot_of(parts, raw.sequence)


def decode_shell_snapshot(raw: ShellRaw, workspaces: Mapping[str, bytes] = NO_WORKSPACES) -> Snapshot:
    return snapshot_of(shell_parts(raw, workspaces), raw.sequence)


def decode_thread_resume(raw: ThreadReplayRaw | SnapshotRaw) -> Base | None:
    if isinstance(raw, SnapshotRaw):
        return decode_thread_snapshot(raw)
    return Replay(raw.sequence, tuple((seq, event_frame(kind, seq, payload)) for seq, kind, payload in raw.events))


def decode_shell_resume(raw: ShellReplayRaw | ShellRaw, workspaces: Mapping[str, bytes] = NO_WORKSPACES) -> Base:
    if isinstance(raw, ShellRaw):
        return decode_shell_snapshot(raw, workspaces)
    frames = [(seq, event_frame("project.updated", seq, payload)) for seq, payload in raw.projects]
    for thread_id, seq, row in raw.threads:
        payload = None if row is None else with_workspace(shell_payload(*row), workspaces.get(thread_id))
        frames.append((seq, shell_row_frame(thread_id, seq, payload)))
    frames.sort(key=lambda frame: frame[0])
    return Replay(raw.sequence, tuple(frames))
