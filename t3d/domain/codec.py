"""Entities to and from plain JSON values (storage and wire share one shape).

One cattrs converter (orjson preconf) so every entity has exactly one JSON
form; `entity_from` is its inverse, keyed by event kind.
"""

from __future__ import annotations

from typing import Any

import orjson
from cattrs.preconf.orjson import make_converter

from t3d.domain.events import Event, EventKind
from t3d.domain.model import (
    Checkpoint,
    Entity,
    Project,
    ProviderSession,
    RuntimeRequest,
    Thread,
    Turn,
    TurnItem,
)

converter = make_converter()

ENTITY_OF_KIND: dict[str, type] = {
    "project.updated": Project,
    "thread.updated": Thread,
    "thread.deleted": Thread,
    "turn.updated": Turn,
    "item.updated": TurnItem,
    "request.updated": RuntimeRequest,
    "session.updated": ProviderSession,
    "checkpoint.updated": Checkpoint,
}


def to_json(entity: Entity) -> dict[str, Any]:
    return converter.unstructure(entity)  # type: ignore[no-any-return]


def entity_from(kind: str, value: dict[str, Any]) -> Entity:
    return converter.structure(value, ENTITY_OF_KIND[kind])


def dumps_sized(value: Any) -> bytes:
    """``orjson.dumps(value)`` in a block of its own size: for bytes that are kept.

    orjson 3.12 returns its bytes in the buffer it wrote them into, 4 KiB at the least and
    grown by powers of two, never trimmed (ijl/orjson c2a6e8f; home-assistant/core#181245):
    a 400-byte entity held 4 KiB (at PRIMARY 150, 1,969 kept payloads held 14.4 MiB;
    docs/benchmarks.md). The copy costs ~0.1 µs."""
    return b"".join((orjson.dumps(value), b""))


def event_payload(event: Event) -> bytes:
    return orjson.dumps(to_json(event.entity))


def event_from(kind: EventKind, payload: bytes) -> Event:
    return Event(kind, entity_from(kind, orjson.loads(payload)))
