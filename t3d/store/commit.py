"""One command, one transaction: receipt, events, projections, outbox.

Runs on the writer thread. `execute` opens ``BEGIN IMMEDIATE``, replays the
receipt of a ``command_id`` seen before, otherwise decides the command
against the projections (pure domain code), appends the events (which take
their global sequence numbers), applies them to the projections, writes the
outbox effects and the receipt, and commits. The caller publishes the
returned `Committed` only after COMMIT.

A rejected command rolls back everything and records a rejected receipt, so
a retry of the same ``command_id`` fails the same way.
"""

from __future__ import annotations

from typing import Any

import apsw
import attrs
import orjson

from t3d.domain import commands as c
from t3d.domain.codec import converter, to_json
from t3d.domain.decide import decide
from t3d.domain.events import Effect
from t3d.domain.model import Entity, JsonDict
from t3d.errors import DomainError
from t3d.store.tables import SqlView, apply_event


@attrs.frozen
class StoredEvent:
    sequence: int
    kind: str
    thread_id: str | None
    entity: Entity
    # The entity's JSON, encoded once; the same bytes go to disk and to the wire.
    payload: bytes
    created_at: float


@attrs.frozen
class ShellRow:
    """A thread's shell (thread + maintained counts) after a commit; None payload = deleted."""

    thread_id: str
    sequence: int
    payload: bytes | None


@attrs.frozen
class Committed:
    result: JsonDict
    events: tuple[StoredEvent, ...] = ()
    shell: tuple[ShellRow, ...] = ()
    effects: tuple[tuple[int, Effect], ...] = ()
    replayed: bool = False


def execute(conn: apsw.Connection, command: c.Command, command_id: str | None, now: float) -> Committed:
    conn.execute("BEGIN IMMEDIATE")
    try:
        receipt = _receipt(conn, command_id) if command_id is not None else None
        if receipt is not None:
            conn.execute("ROLLBACK")
            return _replayed(receipt)
        decision = decide(SqlView(conn), command, now)
        stored = tuple(_append(conn, event, now) for event in decision.events)
        effects = tuple(_enqueue(conn, effect, now) for effect in decision.effects)
        if command_id is not None:
            _write_receipt(conn, command_id, ok=True, body=decision.result, now=now)
        shell = _shell_rows(conn, stored)
        conn.execute("COMMIT")
    except DomainError as exc:
        if conn.get_autocommit():  # a replayed rejection: nothing to undo or record
            raise
        conn.execute("ROLLBACK")
        if command_id is not None:
            with conn:
                _write_receipt(conn, command_id, ok=False, body={"code": exc.code, "message": exc.message}, now=now)
        raise
    except BaseException:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise
    return Committed(decision.result, stored, shell, effects)


def mark_effects_done(conn: apsw.Connection, ids: list[int], now: float) -> None:
    with conn:
        conn.executemany("UPDATE outbox SET done_at = ? WHERE id = ?", [(now, i) for i in ids])


def _receipt(conn: apsw.Connection, command_id: str) -> tuple[bool, JsonDict] | None:
    for ok, body in conn.execute("SELECT ok, result FROM receipts WHERE command_id = ?", (command_id,)):
        return bool(ok), orjson.loads(body)
    return None


def _replayed(receipt: tuple[bool, JsonDict]) -> Committed:
    """A retried command returns its original result, or fails the same way."""
    ok, value = receipt
    if not ok:
        raise DomainError(value["code"], value["message"])
    return Committed(value, replayed=True)


def _write_receipt(conn: apsw.Connection, command_id: str, *, ok: bool, body: JsonDict, now: float) -> None:
    conn.execute(
        "INSERT INTO receipts(command_id, ok, result, created_at) VALUES (?,?,?,?)",
        (command_id, int(ok), orjson.dumps(body), now),
    )


def _append(conn: apsw.Connection, event: Any, now: float) -> StoredEvent:
    payload = orjson.dumps(to_json(event.entity))
    conn.execute(
        "INSERT INTO events(kind, thread_id, entity_id, payload, created_at) VALUES (?,?,?,?,?)",
        (event.kind, event.thread_id, event.entity.id, payload, now),
    )
    sequence = conn.last_insert_rowid()
    apply_event(conn, event, payload)
    return StoredEvent(sequence, event.kind, event.thread_id, event.entity, payload, now)


def _enqueue(conn: apsw.Connection, effect: Effect, now: float) -> tuple[int, Effect]:
    conn.execute(
        "INSERT INTO outbox(thread_id, kind, payload, created_at) VALUES (?,?,?,?)",
        (effect.thread_id, type(effect).__name__, orjson.dumps(converter.unstructure(effect)), now),
    )
    return conn.last_insert_rowid(), effect


SHELL_SQL = (
    "SELECT t.body, coalesce(n.turns, 0), coalesce(n.items, 0) "
    "FROM threads t LEFT JOIN thread_counts n ON n.thread_id = t.id"
)


def shell_payload(body: bytes, turns: int, items: int) -> bytes:
    thread = orjson.loads(body)
    thread["turn_count"] = turns
    thread["item_count"] = items
    return orjson.dumps(thread)


# Item updates alone do not move a shell (counts catch up with the turn's next
# update, at the latest its terminal one), so streaming text costs no shell work.
SHELL_KINDS = frozenset({"thread.updated", "thread.deleted", "turn.updated", "request.updated"})


def _shell_rows(conn: apsw.Connection, events: tuple[StoredEvent, ...]) -> tuple[ShellRow, ...]:
    """Recompute each touched thread's shell once for the whole commit."""
    last: dict[str, int] = {}
    for event in events:
        if event.thread_id is not None and event.kind in SHELL_KINDS:
            last[event.thread_id] = event.sequence
    rows = []
    for thread_id, sequence in last.items():
        payload = None
        for body, turns, items in conn.execute(SHELL_SQL + " WHERE t.id = ?", (thread_id,)):
            payload = shell_payload(body, turns, items)
        rows.append(ShellRow(thread_id, sequence, payload))
    return tuple(rows)
