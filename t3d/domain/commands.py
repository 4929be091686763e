"""Commands: what clients and provider sessions ask the domain to do.

Client commands come from the API and carry a client-minted ``command_id``
(handled by the store's receipt table, not here). Provider commands come from
provider session drivers. All are imperative and frozen.
"""

from __future__ import annotations

import attrs

from t3d.domain.model import JsonDict, ProviderSession, TurnItem

# --- client commands ---------------------------------------------------------


@attrs.frozen
class CreateProject:
    project_id: str
    path: str
    title: str | None = None


@attrs.frozen
class CreateThread:
    thread_id: str
    project_id: str
    provider: str
    title: str | None = None
    model: str | None = None
    runtime_mode: str | None = None
    worktree_path: str | None = None
    branch: str | None = None
    parent_thread_id: str | None = None


@attrs.frozen
class RenameThread:
    thread_id: str
    title: str


@attrs.frozen
class ArchiveThread:
    thread_id: str


@attrs.frozen
class DeleteThread:
    thread_id: str


@attrs.frozen
class StartTurn:
    thread_id: str
    turn_id: str
    text: str


@attrs.frozen
class InterruptTurn:
    thread_id: str


@attrs.frozen
class RespondToRequest:
    request_id: str
    decision: str
    message: str | None = None


# --- provider commands ---------------------------------------------------------


@attrs.frozen
class HoldTurn:
    """Admission holds a starting turn back: it goes back to ``queued`` with ``reason``."""

    turn_id: str
    reason: str


@attrs.frozen
class AdmitTurn:
    """Admission lets a held turn start."""

    turn_id: str


@attrs.frozen
class MarkTurnRunning:
    """The provider accepted the turn's input."""

    turn_id: str


@attrs.frozen
class RecordItems:
    """Upsert items of a running turn. Ordinals of new items are assigned here."""

    turn_id: str
    items: tuple[TurnItem, ...]


@attrs.frozen
class OpenRequest:
    """The provider asks the user something (a permission prompt)."""

    turn_id: str
    request_id: str
    kind: str
    item: TurnItem
    data: JsonDict | None = None


@attrs.frozen
class FinishTurn:
    """The turn reached a terminal state. Pending requests of the turn are cancelled."""

    turn_id: str
    status: str
    error: str | None = None
    reason: str | None = None
    usage: JsonDict | None = None
    cost_usd: float | None = None


@attrs.frozen
class RecordSession:
    session: ProviderSession


@attrs.frozen
class RecoverAfterRestart:
    """Give every non-terminal turn a terminal record and expire pending requests."""


ClientCommand = (
    CreateProject
    | CreateThread
    | RenameThread
    | ArchiveThread
    | DeleteThread
    | StartTurn
    | InterruptTurn
    | RespondToRequest
)
ProviderCommand = MarkTurnRunning | RecordItems | OpenRequest | FinishTurn | RecordSession
AdmissionCommand = HoldTurn | AdmitTurn
Command = ClientCommand | ProviderCommand | AdmissionCommand | RecoverAfterRestart
