"""The wire form of entities and events: large fields summarized, encoded once. Pure.

Rules:
- An entity goes on the wire as its summary (t3d/store/summary.py: an entity up
  to `FIELD_LIMIT` bytes as stored, the same bytes object; in a larger one every
  large field cut to its head and listed in ``truncated``, which ``item.detail``
  returns whole).
- The functions are deterministic: the same payload gives the same bytes,
  whether it goes out live, in a replay or in a snapshot.
"""

from __future__ import annotations

import orjson

from t3d.store.summary import (
    ENTITY_LIMIT,
    FIELD_LIMIT,
    HEAD_BYTES,
    MESSAGE_KINDS,
    TEXT_LIMIT,
    Path,
    summarize_entity,
    summarize_payload,
    value_at,
)

__all__ = [
    "ENTITY_LIMIT",
    "FIELD_LIMIT",
    "HEAD_BYTES",
    "MESSAGE_KINDS",
    "TEXT_LIMIT",
    "Path",
    "event_frame",
    "shell_row_frame",
    "summarize_entity",
    "summarize_payload",
    "value_at",
    "wire_event",
    "with_workspace",
]


def wire_event(kind: str, sequence: int, entity: bytes) -> bytes:
    """``{"kind":K,"sequence":N,"entity":E}`` from already-encoded entity bytes."""
    return b'{"kind":"%s","sequence":%d,"entity":%s}' % (kind.encode(), sequence, entity)


def event_frame(kind: str, sequence: int, payload: bytes) -> bytes:
    """The wire event of a stored event payload, large fields summarized."""
    return wire_event(kind, sequence, summarize_payload(payload))


def shell_row_frame(thread_id: str, sequence: int, payload: bytes | None) -> bytes:
    """A thread's shell row (``shell.updated``), or ``shell.removed`` once it is gone."""
    if payload is None:
        return wire_event("shell.removed", sequence, orjson.dumps({"id": thread_id}))
    return wire_event("shell.updated", sequence, payload)


def with_workspace(row: bytes, workspace: bytes | None) -> bytes:
    """A shell row (an encoded object) with ``"workspace": <workspace>`` spliced in last."""
    if workspace is None:
        return row
    return row[:-1] + b',"workspace":' + workspace + b"}"
