"""Commands into transactions: receipt, events, projections, outbox.

Runs on the writer thread. For each command, `execute_batch` replays the
receipt of a ``command_id`` seen before, otherwise decides the command against
the projections (pure domain code, seeing every earlier write of the same
transaction), appends the events (which take their global sequence numbers),
applies them to the projections, writes the outbox effects and the receipt.
`execute` is a batch of one. The caller publishes a returned `Committed` only
after COMMIT.

A rejected command rolls back its own writes and records a rejected receipt,
so a retry of the same ``command_id`` fails the same way. A receipt keeps the
command's result as it was returned (``sequence`` included), so a retry gets
exactly the first result, and the command's fingerprint (the method and its
params), so the same ``command_id`` sent with other params is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import apsw
import attrs
import orjson
import outcome

from t3d.domain import commands as c
from t3d.domain.codec import converter, dumps_sized, to_json
from t3d.domain.decide import decide
from t3d.domain.events import Effect
from t3d.domain.model import Entity, JsonDict
from t3d.errors import DomainError
from t3d.store.summary import json_copy, summarize_value
from t3d.store.tables import EntityCache, SqlView, apply_event, enqueue_purge

# An item or request whose JSON is over this many bytes is stored once: whole in its
# projection row (what snapshots and item.detail read), while its event keeps the summary
# the wire shows (summary.py), which is also what a replay of it sends.
STORE_ONCE_BYTES = 1 << 20
STORE_ONCE_KINDS = frozenset({"item.updated", "request.updated"})
# Errors of the database, not of a command: they fail the whole batch.
_DATABASE_ERRORS = (apsw.FullError, apsw.BusyError, apsw.IOError)


@attrs.frozen
class StoredEvent:
    sequence: int
    kind: str
    thread_id: str | None
    entity: Entity
    # The entity's JSON, encoded once; the same bytes go to disk and to the wire (for an
    # entity over STORE_ONCE_BYTES: its summary, as the event stores it).
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


@attrs.frozen
class Write:
    """One command to commit: what `execute_batch` takes."""

    command: c.Command
    command_id: str | None
    now: float
    # What a retry of ``command_id`` must repeat (`Params.fingerprint`); None: anything.
    fingerprint: bytes | None = None


@attrs.frozen
class Bookkeeping:
    """One of the daemon's own writes that decides nothing and publishes nothing (the
    outbox's done marks): run alone, or joined to a batch's open transaction, where any
    error it raises is the database's and fails the whole transaction."""

    run: Callable[[apsw.Connection], None]


def execute(
    conn: apsw.Connection,
    command: c.Command,
    command_id: str | None,
    now: float,
    fingerprint: bytes | None = None,
    cache: EntityCache | None = None,
) -> Committed:
    """Decide and commit one command in its own transaction; raises what the command raised."""
    [result] = execute_batch(conn, (Write(command, command_id, now, fingerprint),), cache)
    return result.unwrap()


def execute_batch(
    conn: apsw.Connection, writes: Sequence[Write], cache: EntityCache | None = None
) -> list[outcome.Outcome[Committed]]:
    """Commit several commands in ONE transaction, each inside its own SAVEPOINT.

    A command that fails (a `DomainError`, or any other error of its own) rolls
    back only its own writes, and its outcome carries that error unchanged; the
    others commit. A failed COMMIT, an error that ended the transaction, or one of
    the database itself (full, locked, I/O: never a command's own, and a later
    command must not commit ahead of the one that met it) rolls everything back and
    raises, and then every command of the batch has failed. ``cache`` (the writer's
    `EntityCache`) spares decoding rows written or read before.
    """
    batch = BatchTransaction(cache)
    batch.begin(conn)
    try:
        results = [batch.apply(conn, write) for write in writes]
        batch.commit(conn)
    except BaseException:
        batch.rollback(conn)
        raise
    return results


@attrs.define
class BatchTransaction:
    """`execute_batch` in steps, for a writer that applies each command as it arrives:
    `begin`, `apply` each (its outcome; raises, as `execute_batch` does, for an error
    that fails the whole transaction), then `commit`, or `rollback` after a raise."""

    cache: EntityCache | None = None

    def begin(self, conn: apsw.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def apply(self, conn: apsw.Connection, write: Write | Bookkeeping) -> outcome.Outcome[Any]:
        if isinstance(write, Bookkeeping):
            write.run(conn)
            return outcome.Value(None)
        return _apply(conn, write, self.cache)

    def commit(self, conn: apsw.Connection) -> None:
        conn.execute("COMMIT")

    def rollback(self, conn: apsw.Connection) -> None:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")


def _apply(conn: apsw.Connection, write: Write, cache: EntityCache | None) -> outcome.Outcome[Committed]:
    receipt = _receipt(conn, write.command_id) if write.command_id is not None else None
    if receipt is not None:
        return outcome.capture(_replayed, write, receipt)
    conn.execute("SAVEPOINT command")
    try:
        decision = decide(SqlView(conn, cache), write.command, write.now)
        stored = tuple(_append(conn, event, write.now, cache) for event in decision.events)
        effects = tuple(_enqueue(conn, effect, write.now) for effect in decision.effects)
        result = {**decision.result, "sequence": stored[-1].sequence if stored else None}
        if write.command_id is not None:
            _write_receipt(conn, write, ok=True, body=result)
        shell = _shell_rows(conn, stored)
    except Exception as exc:
        if conn.get_autocommit() or isinstance(exc, _DATABASE_ERRORS):  # the batch fails
            raise
        conn.execute("ROLLBACK TO command")
        conn.execute("RELEASE command")
        if isinstance(exc, DomainError) and write.command_id is not None:
            # A retry of the same command_id fails the same way.
            _write_receipt(conn, write, ok=False, body={"code": exc.code, "message": exc.message})
        return outcome.Error(exc)
    conn.execute("RELEASE command")
    return outcome.Value(Committed(result, stored, shell, effects))


def mark_effects_done(conn: apsw.Connection, ids: list[int], now: float) -> None:
    with conn:
        conn.executemany("UPDATE outbox SET done_at = ? WHERE id = ?", [(now, i) for i in ids])


def finish_effect(conn: apsw.Connection, kind: str, payload: bytes, now: float) -> None:
    """Mark done the open outbox rows of this very effect (the same kind and payload)."""
    with conn:
        conn.execute("UPDATE outbox SET done_at = ? WHERE done_at IS NULL AND kind = ? AND payload = ?", (now, kind, payload))


def _receipt(conn: apsw.Connection, command_id: str) -> tuple[bool, JsonDict, bytes | None] | None:
    for ok, body, fingerprint in conn.execute(
        "SELECT ok, result, fingerprint FROM receipts WHERE command_id = ?", (command_id,)
    ):
        return bool(ok), orjson.loads(body), fingerprint
    return None


def _replayed(write: Write, receipt: tuple[bool, JsonDict, bytes | None]) -> Committed:
    """A retried command returns its original result, or fails the same way; the same
    ``command_id`` with another method or other params is refused."""
    ok, value, fingerprint = receipt
    if write.fingerprint is not None and fingerprint is not None and fingerprint != write.fingerprint:
        raise DomainError(
            "conflict",
            f"command_id {write.command_id!r} was already used for a different call; a retry must repeat "
            "the same method and params, and a new call needs a new command_id",
        )
    if not ok:
        raise DomainError(value["code"], value["message"])
    return Committed(value, replayed=True)


def _write_receipt(conn: apsw.Connection, write: Write, *, ok: bool, body: JsonDict) -> None:
    conn.execute(
        "INSERT INTO receipts(command_id, ok, result, created_at, fingerprint) VALUES (?,?,?,?,?)",
        (write.command_id, int(ok), orjson.dumps(body), write.now, write.fingerprint),
    )


def _append(conn: apsw.Connection, event: Any, now: float, cache: EntityCache | None = None) -> StoredEvent:
    value = to_json(event.entity)
    payload = dumps_sized(value)  # kept: the entity cache, the events on their way out
    apply_event(conn, event, payload)
    if cache is not None and event.kind != "thread.deleted":  # the row's body is now these bytes
        cache.put(type(event.entity), event.entity.id, payload, event.entity)
    if len(payload) > STORE_ONCE_BYTES and event.kind in STORE_ONCE_KINDS:
        # The whole entity is in its row; the event keeps its summary (no copy of the large
        # strings is made for it: they are cut from a copy of the containers only).
        payload = summarize_value(json_copy(value), len(payload)) or payload
    conn.execute(
        "INSERT INTO events(kind, thread_id, entity_id, payload, created_at) VALUES (?,?,?,?,?)",
        (event.kind, event.thread_id, event.entity.id, payload, now),
    )
    sequence = conn.last_insert_rowid()
    if event.kind == "thread.deleted":  # its events go after, in steps (t3d/store/retention.py)
        enqueue_purge(conn, event.entity.id, sequence)
    return StoredEvent(sequence, event.kind, event.thread_id, event.entity, payload, now)


def _enqueue(conn: apsw.Connection, effect: Effect, now: float) -> tuple[int, Effect]:
    conn.execute(
        "INSERT INTO outbox(thread_id, kind, payload, created_at) VALUES (?,?,?,?)",
        (effect.thread_id, type(effect).__name__, orjson.dumps(converter.unstructure(effect)), now),
    )
    return conn.last_insert_rowid(), effect


# A thread's shell columns: its body, its maintained counts, and its last activity (the
# latest time of its newest turn: asked, started or ended; one indexed row per thread).
SHELL_SQL = (
    "SELECT t.body, coalesce(n.turns, 0), coalesce(n.items, 0), "
    "(SELECT max(json_extract(CAST(u.body AS TEXT), '$.requested_at'), "
    "coalesce(json_extract(CAST(u.body AS TEXT), '$.started_at'), 0), "
    "coalesce(json_extract(CAST(u.body AS TEXT), '$.completed_at'), 0)) "
    "FROM turns u WHERE u.thread_id = t.id ORDER BY u.ordinal DESC LIMIT 1) "
    "FROM threads t LEFT JOIN thread_counts n ON n.thread_id = t.id"
)
ShellColumns = tuple[bytes, int, int, float | None]


def shell_payload(body: bytes, turns: int, items: int, last_activity: float | None = None) -> bytes:
    """The thread's stored JSON object with its maintained counts and its last activity added,
    spliced in as bytes: a shell of thousands of threads decodes none of them."""
    counts = b'"turn_count":%d,"item_count":%d,"last_activity_at":%s}' % (turns, items, orjson.dumps(last_activity))
    return body[:-1] + (b"," if body != b"{}" else b"") + counts


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
        for row in conn.execute(SHELL_SQL + " WHERE t.id = ?", (thread_id,)):
            payload = shell_payload(*row)
        rows.append(ShellRow(thread_id, sequence, payload))
    return tuple(rows)
