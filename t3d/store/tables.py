"""The projection tables, as the writer sees them inside a transaction.

`SqlView` implements the domain's `StateView` with point queries on indexed
columns; `apply_event` projects one committed event ("replace the row", or
remove a deleted thread's rows). Both run only on the writer thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import apsw
import orjson

from t3d.domain.codec import converter
from t3d.domain.events import Event
from t3d.domain.model import (
    Project,
    ProviderSession,
    RuntimeRequest,
    Thread,
    Turn,
    TurnItem,
)
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


class SqlView:
    """`StateView` over the writer connection (sees the open transaction)."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def _one(self, sql: str, args: tuple[Any, ...], decode: Callable[[bytes], E]) -> E | None:
        for (body,) in self._conn.execute(sql, args):
            return decode(body)
        return None

    def _all(self, sql: str, args: tuple[Any, ...], decode: Callable[[bytes], E]) -> list[E]:
        return [decode(body) for (body,) in self._conn.execute(sql, args)]

    def _count(self, sql: str, args: tuple[Any, ...]) -> int:
        for (n,) in self._conn.execute(sql, args):
            return int(n)
        return 0

    def project(self, project_id: str) -> Project | None:
        return self._one("SELECT body FROM projects WHERE id = ?", (project_id,), decode_project)

    def project_by_path(self, path: str) -> Project | None:
        return self._one("SELECT body FROM projects WHERE path = ?", (path,), decode_project)

    def thread(self, thread_id: str) -> Thread | None:
        return self._one("SELECT body FROM threads WHERE id = ?", (thread_id,), decode_thread)

    def turn(self, turn_id: str) -> Turn | None:
        return self._one("SELECT body FROM turns WHERE id = ?", (turn_id,), decode_turn)

    def turn_count(self, thread_id: str) -> int:
        return self._count("SELECT turns FROM thread_counts WHERE thread_id = ?", (thread_id,))

    def open_turns(self, thread_id: str) -> list[Turn]:
        return self._all(
            f"SELECT body FROM turns WHERE thread_id = ? AND status NOT IN {TERMINAL} ORDER BY ordinal",
            (thread_id,),
            decode_turn,
        )

    def item(self, item_id: str) -> TurnItem | None:
        return self._one("SELECT body FROM items WHERE id = ?", (item_id,), decode_item)

    def item_count(self, turn_id: str) -> int:
        return self._count("SELECT items FROM turn_counts WHERE turn_id = ?", (turn_id,))

    def request(self, request_id: str) -> RuntimeRequest | None:
        return self._one("SELECT body FROM requests WHERE id = ?", (request_id,), decode_request)

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
        return self._all(
            "SELECT body FROM requests WHERE status = 'pending'", (), decode_request
        )

    def live_sessions(self) -> list[ProviderSession]:
        return self._all(
            "SELECT body FROM sessions WHERE status != 'exited'", (), decode_session
        )


def _upsert(conn: apsw.Connection, entity: object, body: bytes) -> None:
    if isinstance(entity, TurnItem):
        conn.execute(
            "INSERT INTO items(id, thread_id, turn_id, ordinal, body) VALUES (?,?,?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET ordinal = excluded.ordinal, body = excluded.body",
            (entity.id, entity.thread_id, entity.turn_id, entity.ordinal, body),
        )
    elif isinstance(entity, Turn):
        conn.execute(
            "INSERT INTO turns(id, thread_id, ordinal, status, body) VALUES (?,?,?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET status = excluded.status, body = excluded.body",
            (entity.id, entity.thread_id, entity.ordinal, entity.status, body),
        )
    elif isinstance(entity, RuntimeRequest):
        conn.execute(
            "INSERT INTO requests(id, thread_id, turn_id, status, body) VALUES (?,?,?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET status = excluded.status, body = excluded.body",
            (entity.id, entity.thread_id, entity.turn_id, entity.status, body),
        )
    elif isinstance(entity, Thread):
        conn.execute(
            "INSERT INTO threads(id, project_id, body) VALUES (?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET body = excluded.body",
            (entity.id, entity.project_id, body),
        )
    elif isinstance(entity, ProviderSession):
        conn.execute(
            "INSERT INTO sessions(id, thread_id, status, body) VALUES (?,?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET status = excluded.status, body = excluded.body",
            (entity.id, entity.thread_id, entity.status, body),
        )
    elif isinstance(entity, Project):
        conn.execute(
            "INSERT INTO projects(id, path, body) VALUES (?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET path = excluded.path, body = excluded.body",
            (entity.id, entity.path, body),
        )
    else:  # pragma: no cover - the Entity union is closed
        raise TypeError(f"no table for {type(entity).__name__}")


def delete_thread_rows(conn: apsw.Connection, thread_id: str) -> None:
    for table in ("items", "requests", "sessions", "turns"):
        conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
    conn.execute("DELETE FROM thread_counts WHERE thread_id = ?", (thread_id,))
    conn.execute("DELETE FROM threads WHERE id = ?", (thread_id,))


def apply_event(conn: apsw.Connection, event: Event, body: bytes) -> None:
    if event.kind == "thread.deleted":
        delete_thread_rows(conn, event.entity.id)
    else:
        _upsert(conn, event.entity, body)
