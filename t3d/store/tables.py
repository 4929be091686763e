"""The projection tables, as the writer sees them inside a transaction.

`SqlView` implements the domain's `StateView` with point queries on indexed
columns; `apply_event` projects one committed event ("replace the row", or
remove a deleted thread's rows). Both run only on the writer thread.

`EntityCache` spares the writer decoding the rows it has just written or read
(a streaming item is read back by its next update, a turn by every update of
its items): an entity is kept with the exact row body it came from, and a read
uses it only when the row's body, read as always, is still those bytes, so a
rollback, a retention step or any other write is never missed. A settled entity
(an item completed, failed, answered or stopped; a turn ended; a session exited; a
request answered; any checkpoint, written once at its turn's end) is not kept: the
domain seldom reads one again, and under many sessions they would push the live
entities out and hold memory for nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import apsw
import orjson

from t3d.domain.codec import converter
from t3d.domain.events import Event
from t3d.domain.model import (
    SETTLED_ITEM_STATUSES,
    TERMINAL_TURN_STATUSES,
    Checkpoint,
    Project,
    ProviderSession,
    RuntimeRequest,
    Thread,
    Turn,
    TurnItem,
)
from t3d.store.packing import unpack
from t3d.store.schema import TERMINAL

E = TypeVar("E")


def _decode(kind: type[E]) -> Callable[[bytes], E]:
    def decode(body: bytes) -> E:
        return converter.structure(orjson.loads(body), kind)

    return decode


decode_project = _decode(Project)
decode_thread = _decode(Thread)
decode_turn = _decode(Turn)
decode_item = _decode(TurnItem)
decode_request = _decode(RuntimeRequest)
decode_session = _decode(ProviderSession)
decode_checkpoint = _decode(Checkpoint)


def _settled(entity: object) -> bool:
    """Is ``entity`` one the writer seldom reads again (see above)?"""
    if isinstance(entity, TurnItem):
        return entity.status in SETTLED_ITEM_STATUSES
    if isinstance(entity, Turn):
        return entity.status in TERMINAL_TURN_STATUSES
    if isinstance(entity, ProviderSession):
        return entity.status == "exited"
    if isinstance(entity, RuntimeRequest):
        return entity.status != "pending"
    return isinstance(entity, Checkpoint)


class EntityCache:
    """Decoded entities by (type, id), each with the row body it came from. Bounded:
    `MAX_ENTRIES` entries and `MAX_BYTES` of bodies (the oldest go first); a body over
    `MAX_BODY`, and a settled entity, is not kept. Used by the writer thread only."""

    MAX_ENTRIES = 4096
    MAX_BYTES = 16 * 1024 * 1024
    MAX_BODY = 256 * 1024

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[type, str], tuple[bytes, object]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, kind: type, key: str, body: bytes) -> Any:
        """The entity decoded from exactly ``body``, if kept; else None."""
        entry = self._entries.get((kind, key))
        if entry is not None and entry[0] == body:
            self.hits += 1
            return entry[1]
        self.misses += 1
        return None

    def put(self, kind: type, key: str, body: bytes, entity: object) -> None:
        old = self._entries.pop((kind, key), None)
        if old is not None:
            self._bytes -= len(old[0])
        if len(body) > self.MAX_BODY or _settled(entity):
            return
        self._entries[(kind, key)] = (body, entity)
        self._bytes += len(body)
        while len(self._entries) > self.MAX_ENTRIES or self._bytes > self.MAX_BYTES:
            _, (dropped, _) = self._entries.popitem(last=False)
            self._bytes -= len(dropped)


class SqlView:
    """`StateView` over the writer connection (sees the open transaction)."""

    def __init__(self, conn: apsw.Connection, cache: EntityCache | None = None) -> None:
        self._conn = conn
        self._cache = cache

    def _one(self, sql: str, args: tuple[Any, ...], decode: Callable[[bytes], E]) -> E | None:
        for (body,) in self._conn.execute(sql, args):
            return decode(body)
        return None

    def _by_id(self, table: str, key: str, kind: type[E]) -> E | None:
        """The entity of ``table``'s row ``key`` (decoded, or from the cache if its body is
        unchanged)."""
        for (stored,) in self._conn.execute(f"SELECT body FROM {table} WHERE id = ?", (key,)):
            body = unpack(stored)  # an item's may be packed (packing.py)
            cache = self._cache
            if cache is None:
                return converter.structure(orjson.loads(body), kind)
            entity: E | None = cache.get(kind, key, body)
            if entity is None:
                entity = converter.structure(orjson.loads(body), kind)
                cache.put(kind, key, body, entity)
            return entity
        return None

    def _all(self, sql: str, args: tuple[Any, ...], decode: Callable[[bytes], E]) -> list[E]:
        return [decode(body) for (body,) in self._conn.execute(sql, args)]

    def _count(self, sql: str, args: tuple[Any, ...]) -> int:
        for (n,) in self._conn.execute(sql, args):
            return int(n)
        return 0

    def project(self, project_id: str) -> Project | None:
        return self._by_id("projects", project_id, Project)

    def project_by_path(self, path: str) -> Project | None:
        return self._one("SELECT body FROM projects WHERE path = ?", (path,), decode_project)

    def thread(self, thread_id: str) -> Thread | None:
        return self._by_id("threads", thread_id, Thread)

    def turn(self, turn_id: str) -> Turn | None:
        return self._by_id("turns", turn_id, Turn)

    def turn_count(self, thread_id: str) -> int:
        return self._count("SELECT turns FROM thread_counts WHERE thread_id = ?", (thread_id,))

    def open_turns(self, thread_id: str) -> list[Turn]:
        return self._all(
            f"SELECT body FROM turns WHERE thread_id = ? AND status NOT IN {TERMINAL} ORDER BY ordinal",
            (thread_id,),
            decode_turn,
        )

    def item(self, item_id: str) -> TurnItem | None:
        return self._by_id("items", item_id, TurnItem)

    def item_count(self, turn_id: str) -> int:
        return self._count("SELECT items FROM turn_counts WHERE turn_id = ?", (turn_id,))

    def request(self, request_id: str) -> RuntimeRequest | None:
        return self._by_id("requests", request_id, RuntimeRequest)

    def pending_requests(self, turn_id: str) -> list[RuntimeRequest]:
        return self._all(
            "SELECT body FROM requests WHERE turn_id = ? AND status = 'pending'",
            (turn_id,),
            decode_request,
        )

    def all_open_turns(self) -> list[Turn]:
        return self._all(
            f"SELECT body FROM turns WHERE status NOT IN {TERMINAL} ORDER BY thread_id, ordinal",
            (),
            decode_turn,
        )

    def all_pending_requests(self) -> list[RuntimeRequest]:
        return self._all("SELECT body FROM requests WHERE status = 'pending'", (), decode_request)

    def live_sessions(self) -> list[ProviderSession]:
        return self._all("SELECT body FROM sessions WHERE status != 'exited'", (), decode_session)

    def thread_turns(self, thread_id: str) -> list[Turn]:
        return self._all("SELECT body FROM turns WHERE thread_id = ? ORDER BY ordinal", (thread_id,), decode_turn)

    def checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        return self._by_id("checkpoints", checkpoint_id, Checkpoint)

    def turns_from(self, thread_id: str, ordinal: int) -> list[Turn]:
        return self._all(
            "SELECT body FROM turns WHERE thread_id = ? AND ordinal >= ? ORDER BY ordinal", (thread_id, ordinal), decode_turn
        )

    def child_threads(self, thread_id: str) -> list[Thread]:
        return sorted(
            self._all("SELECT body FROM threads WHERE parent_thread_id = ?", (thread_id,), decode_thread),
            key=lambda t: (t.created_at, t.id),
        )



# Entity type -> (table, indexed columns kept beside ``body``, columns an update may change).
# Columns named here are read from the entity's attribute of the same name.
_TABLES: dict[type, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    Project: ("projects", ("path",), ("path",)),
    Thread: ("threads", ("project_id", "parent_thread_id"), ()),
    Turn: ("turns", ("thread_id", "ordinal", "status"), ("ordinal", "status")),
    TurnItem: ("items", ("thread_id", "turn_id", "ordinal"), ("ordinal",)),
    RuntimeRequest: ("requests", ("thread_id", "turn_id", "status"), ("status",)),
    ProviderSession: ("sessions", ("thread_id", "status"), ("status",)),
    Checkpoint: ("checkpoints", ("thread_id", "ordinal", "status"), ("status",)),
}


def _upsert_sql(table: str, columns: tuple[str, ...], updated: tuple[str, ...], body: str = "?") -> str:
    names = ("id", *columns, "body")
    sets = ", ".join(f"{c} = excluded.{c}" for c in (*updated, "body"))
    return (
        f"INSERT INTO {table}({', '.join(names)}) VALUES ({', '.join(['?'] * (len(names) - 1) + [body])}) "
        f"ON CONFLICT(id) DO UPDATE SET {sets}"
    )


_UPSERTS = {kind: (_upsert_sql(*spec), spec[1]) for kind, spec in _TABLES.items()}


# The same, with a body of zeros of the given size, to be written in place afterwards.
_LARGE_UPSERTS = {kind: (_upsert_sql(*spec, body="zeroblob(?)"), spec[0]) for kind, spec in _TABLES.items()}
# A body over this many bytes is written in pieces of this size through SQLite's incremental
# blob I/O: bound whole, SQLite would hold two more copies of it while the statement runs.
BLOB_PIECE_BYTES = 1 << 20


def _park_ordinal(conn: apsw.Connection, turn: Turn) -> None:
    """A queued turn moved (turn.move) takes another's ordinal: that one steps aside (a
    negative ordinal) until its own event, in the same transaction, gives it its new one."""
    conn.execute(
        "UPDATE turns SET ordinal = -ordinal WHERE thread_id = ? AND ordinal = ? AND id != ?",
        (turn.thread_id, turn.ordinal, turn.id),
    )


def _upsert(conn: apsw.Connection, entity: object, body: bytes) -> None:
    """Replace the entity's row (insert it if new: the count triggers fire only then)."""
    if isinstance(entity, Turn) and entity.status == "queued":
        _park_ordinal(conn, entity)
    keys = (entity.id, *(getattr(entity, c) for c in _UPSERTS[type(entity)][1]))  # type: ignore[attr-defined]
    if len(body) <= BLOB_PIECE_BYTES:
        conn.execute(_UPSERTS[type(entity)][0], (*keys, body))
        return
    sql, table = _LARGE_UPSERTS[type(entity)]
    conn.execute(sql, (*keys, len(body)))
    rowid = conn.execute(f"SELECT rowid FROM {table} WHERE id = ?", (keys[0],)).get
    blob = conn.blob_open("main", table, "body", rowid, True)
    try:
        view = memoryview(body)
        for start in range(0, len(body), BLOB_PIECE_BYTES):
            blob.write(view[start : start + BLOB_PIECE_BYTES])
    finally:
        blob.close()


def delete_thread_rows(conn: apsw.Connection, thread_id: str) -> None:
    for table in ("items", "requests", "sessions", "turns", "checkpoints"):
        conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
    conn.execute("DELETE FROM thread_counts WHERE thread_id = ?", (thread_id,))
    conn.execute("DELETE FROM threads WHERE id = ?", (thread_id,))


def enqueue_purge(conn: apsw.Connection, thread_id: str, through: int) -> None:
    """The thread was deleted at sequence ``through``: retention deletes its earlier events
    in bounded steps (t3d/store/retention.py), soon after."""
    conn.execute(
        "INSERT INTO purge_threads(thread_id, through) VALUES (?, ?) "
        "ON CONFLICT(thread_id) DO UPDATE SET through = max(through, excluded.through)",
        (thread_id, through),
    )


def apply_event(conn: apsw.Connection, event: Event, body: bytes) -> None:
    """Project one event. A deleted thread's rows go at once (its projection is the working
    state); its events go after, in steps (`enqueue_purge`, called once it has its sequence)."""
    if event.kind == "thread.deleted":
        delete_thread_rows(conn, event.entity.id)
    else:
        _upsert(conn, event.entity, body)
