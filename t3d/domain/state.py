"""What `decide` may read, and the in-memory fold of events.

`StateView` is the read interface of the projections. The store implements it
on the writer connection inside the command's transaction; `State` implements
it in memory and is the reference fold (`project`) used by the property tests:
the store's tables must always equal ``fold(project, events)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import attrs

from t3d.domain.events import Event
from t3d.domain.model import (
    Checkpoint,
    Project,
    ProviderSession,
    RuntimeRequest,
    Thread,
    Turn,
    TurnItem,
)


class StateView(Protocol):
    def project(self, project_id: str) -> Project | None: ...
    def project_by_path(self, path: str) -> Project | None: ...
    def thread(self, thread_id: str) -> Thread | None: ...
    def turn(self, turn_id: str) -> Turn | None: ...
    def turn_count(self, thread_id: str) -> int: ...
    def open_turns(self, thread_id: str) -> list[Turn]:
        """Non-terminal turns of a thread, by ordinal."""
        ...

    def item(self, item_id: str) -> TurnItem | None: ...
    def item_count(self, turn_id: str) -> int: ...
    def request(self, request_id: str) -> RuntimeRequest | None: ...
    def pending_requests(self, turn_id: str) -> list[RuntimeRequest]: ...
    def all_open_turns(self) -> list[Turn]: ...
    def all_pending_requests(self) -> list[RuntimeRequest]: ...
    def live_sessions(self) -> list[ProviderSession]: ...
    def thread_turns(self, thread_id: str) -> list[Turn]:
        """Every turn of a thread, by ordinal (for rare whole-thread rules: a revert)."""
        ...

    def checkpoint(self, checkpoint_id: str) -> Checkpoint | None: ...
    def child_threads(self, thread_id: str) -> list[Thread]:
        """The threads whose ``parent_thread_id`` is ``thread_id``, oldest first."""
        ...
    def turns_from(self, thread_id: str, ordinal: int) -> list[Turn]:
        """A thread's turns from ``ordinal`` on (the tail of its queue), by ordinal."""
        ...


# Entity type -> the `State` attribute that holds its rows.
_TABLE_OF: dict[type, str] = {
    Project: "projects",
    Thread: "threads",
    Turn: "turns",
    TurnItem: "items",
    RuntimeRequest: "requests",
    ProviderSession: "sessions",
    Checkpoint: "checkpoints",
}


@attrs.define
class State:
    """Projections held in memory: the reference implementation of `StateView`."""

    projects: dict[str, Project] = attrs.Factory(dict)
    threads: dict[str, Thread] = attrs.Factory(dict)
    turns: dict[str, Turn] = attrs.Factory(dict)
    items: dict[str, TurnItem] = attrs.Factory(dict)
    requests: dict[str, RuntimeRequest] = attrs.Factory(dict)
    sessions: dict[str, ProviderSession] = attrs.Factory(dict)
    checkpoints: dict[str, Checkpoint] = attrs.Factory(dict)

    # --- StateView ---
    def project(self, project_id: str) -> Project | None:
        return self.projects.get(project_id)

    def project_by_path(self, path: str) -> Project | None:
        return next((p for p in self.projects.values() if p.path == path), None)

    def thread(self, thread_id: str) -> Thread | None:
        return self.threads.get(thread_id)

    def turn(self, turn_id: str) -> Turn | None:
        return self.turns.get(turn_id)

    def turn_count(self, thread_id: str) -> int:
        return sum(1 for t in self.turns.values() if t.thread_id == thread_id)

    def open_turns(self, thread_id: str) -> list[Turn]:
        found = [t for t in self.turns.values() if t.thread_id == thread_id and not t.terminal]
        return sorted(found, key=lambda t: t.ordinal)

    def item(self, item_id: str) -> TurnItem | None:
        return self.items.get(item_id)

    def item_count(self, turn_id: str) -> int:
        return sum(1 for i in self.items.values() if i.turn_id == turn_id)

    def request(self, request_id: str) -> RuntimeRequest | None:
        return self.requests.get(request_id)

    def pending_requests(self, turn_id: str) -> list[RuntimeRequest]:
        return [r for r in self.requests.values() if r.turn_id == turn_id and r.status == "pending"]

    def all_open_turns(self) -> list[Turn]:
        return sorted(
            (t for t in self.turns.values() if not t.terminal),
            key=lambda t: (t.thread_id, t.ordinal),
        )

    def all_pending_requests(self) -> list[RuntimeRequest]:
        return [r for r in self.requests.values() if r.status == "pending"]

    def live_sessions(self) -> list[ProviderSession]:
        return [s for s in self.sessions.values() if s.status != "exited"]

    def thread_turns(self, thread_id: str) -> list[Turn]:
        return sorted((t for t in self.turns.values() if t.thread_id == thread_id), key=lambda t: t.ordinal)

    def checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        return self.checkpoints.get(checkpoint_id)

    def turns_from(self, thread_id: str, ordinal: int) -> list[Turn]:
        return [t for t in self.thread_turns(thread_id) if t.ordinal >= ordinal]

    def child_threads(self, thread_id: str) -> list[Thread]:
        found = [t for t in self.threads.values() if t.parent_thread_id == thread_id]
        return sorted(found, key=lambda t: (t.created_at, t.id))

    # --- fold ---
    def apply(self, event: Event) -> None:
        """Project one event: replace the entity's row, or delete a thread's rows."""
        entity = event.entity
        if event.kind == "thread.deleted":
            self._delete_thread(entity.id)
            return
        table = self._table_of(entity)
        table[entity.id] = entity

    def _table_of(self, entity: object) -> dict[str, object]:
        return getattr(self, _TABLE_OF[type(entity)])  # type: ignore[no-any-return]

    def _delete_thread(self, thread_id: str) -> None:
        self.threads.pop(thread_id, None)
        for table in (self.turns, self.items, self.requests, self.sessions, self.checkpoints):
            for key in [k for k, v in table.items() if v.thread_id == thread_id]:
                del table[key]


def fold(events: Iterable[Event]) -> State:
    state = State()
    for event in events:
        state.apply(event)
    return state
