"""Events and outbox effects: what `decide` produces.

An event carries a whole entity; projecting it replaces that entity's row
(``thread.deleted`` removes the thread and everything under it). The store
gives each committed event its place in one global sequence.

An effect is work for the outside world (start a provider turn, send an
interrupt, answer a permission prompt). It is written to the outbox in the
same transaction as the events that call for it, and run after COMMIT.
"""

from __future__ import annotations

from typing import Literal

import attrs

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

EventKind = Literal[
    "project.updated",
    "thread.updated",
    "thread.deleted",
    "turn.updated",
    "item.updated",
    "request.updated",
    "session.updated",
    "checkpoint.updated",
]

KIND_OF_ENTITY: dict[type, EventKind] = {
    Project: "project.updated",
    Thread: "thread.updated",
    Turn: "turn.updated",
    TurnItem: "item.updated",
    RuntimeRequest: "request.updated",
    ProviderSession: "session.updated",
    Checkpoint: "checkpoint.updated",
}


@attrs.frozen
class Event:
    kind: EventKind
    entity: Entity

    @property
    def thread_id(self) -> str | None:
        if isinstance(self.entity, Project):
            return None
        if isinstance(self.entity, Thread):
            return self.entity.id
        return self.entity.thread_id


def updated(entity: Entity) -> Event:
    return Event(KIND_OF_ENTITY[type(entity)], entity)


def deleted(thread: Thread) -> Event:
    return Event("thread.deleted", thread)


@attrs.frozen
class StartProviderTurn:
    """Hand the turn's user text to the thread's provider session."""

    thread_id: str
    turn_id: str
    text: str
    ordinal: int = 0  # the turn's ordinal (0 in effects stored before it was recorded)
    # The provider started the turn itself (a wake): nothing is written to it; the effect
    # only lets its session read on once admission has let the turn start.
    provider_started: bool = False


@attrs.frozen
class SteerProviderTurn:
    """Write a user message into the running turn ``turn_id`` (item ``item_id`` shows it)."""

    thread_id: str
    turn_id: str
    item_id: str
    steer_id: str  # the client's turn id for the message (it becomes that turn if it is late)
    text: str


@attrs.frozen
class InterruptProviderTurn:
    thread_id: str
    turn_id: str


@attrs.frozen
class AnswerProviderRequest:
    thread_id: str
    request_id: str
    decision: str
    message: str | None


@attrs.frozen
class StopProviderSession:
    """The thread was archived or deleted: end its provider process."""

    thread_id: str


@attrs.frozen
class CaptureCheckpoint:
    """The turn ended (whatever its status): commit its worktree's files as its checkpoint."""

    thread_id: str
    turn_id: str
    ordinal: int
    worktree: str  # the directory the turn ran in


Effect = (
    StartProviderTurn
    | SteerProviderTurn
    | InterruptProviderTurn
    | AnswerProviderRequest
    | StopProviderSession
    | CaptureCheckpoint
)

# Effects whose outbox row stays open until their work is finished, not just handed over
# (the handler marks it done), so work cut short by a stop or crash runs again at start-up.
# Their work must be idempotent: a capture keeps a checkpoint ref that already exists.
DONE_WHEN_FINISHED = (CaptureCheckpoint,)
