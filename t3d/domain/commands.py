"""Commands: what clients and provider sessions ask the domain to do.

Client commands come from the API and carry a client-minted ``command_id``
(handled by the store's receipt table, not here). Provider commands come from
provider session drivers. All are imperative and frozen.
"""

from __future__ import annotations

import attrs

from t3d.domain.model import Checkpoint, JsonDict, ProviderSession, TurnItem

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
class UnarchiveThread:
    """Undo ArchiveThread: the thread takes turns again; its agent starts on the next one."""

    thread_id: str


@attrs.frozen
class DeleteThread:
    thread_id: str


@attrs.frozen
class StartTurn:
    """A user turn. With ``delivery="steer"`` and a running turn on the thread, the text goes
    into that turn instead (``turn_id`` then names the steered message); with no running turn
    it is an ordinary turn, and the result says so."""

    thread_id: str
    turn_id: str
    text: str
    delivery: str = "queue"


@attrs.frozen
class EditTurn:
    """Change the prompt of a turn that has not started (``queued``)."""

    turn_id: str
    text: str


@attrs.frozen
class MoveTurn:
    """Reorder the thread's queue: ``turn_id`` goes just before ``before`` (another queued
    turn of the thread), or last when ``before`` is None."""

    turn_id: str
    before: str | None = None


@attrs.frozen
class CancelTurn:
    """Cancel a turn that has not started (``queued``); a cancelled turn stays cancelled."""

    turn_id: str


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
class OpenSubagent:
    """The agent of turn ``parent_turn_id`` started a subagent (tool call ``tool_use_id``): a
    child thread (``thread_id``) with one running turn (``turn_id``), the prompt its first
    item. Opening it again (a replay) changes nothing."""

    parent_turn_id: str
    tool_use_id: str
    thread_id: str
    turn_id: str
    subagent_type: str
    description: str
    prompt: str


@attrs.frozen
class RecordSession:
    session: ProviderSession


@attrs.frozen
class OpenProviderTurn:
    """The provider started work with no turn open (a background task's notification woke
    it): a turn started by the provider, ``origin`` saying why. It starts like any turn
    (``starting``, through admission), or waits ``queued`` (``wake_throttled``) when the
    session throttles a provider that keeps waking itself."""

    thread_id: str
    turn_id: str
    origin: JsonDict
    throttled: bool = False


@attrs.frozen
class ReleaseProviderTurn:
    """A throttled provider-started turn may start now (through admission, as any turn)."""

    turn_id: str


@attrs.frozen
class RecordTasks:
    """Upsert background task items (kind ``background_task``) of any turn of the thread, open
    or finished, and keep the thread's list of the ones still running."""

    thread_id: str
    items: tuple[TurnItem, ...]


@attrs.frozen
class RequeueSteer:
    """A message steered into a turn that ended before the provider got it: it becomes an
    ordinary turn (``turn_id``, minted by the client for the steer), queued as usual."""

    thread_id: str
    item_id: str
    turn_id: str
    text: str


@attrs.frozen
class RecoverAfterRestart:
    """Give every non-terminal turn a terminal record and expire pending requests, except
    on the threads of ``live_sessions`` (provider sessions whose agent outlived the last
    daemon and is taken over): their turns, requests and session carry on."""

    live_sessions: tuple[str, ...] = ()


# --- checkpoint commands (t3d/git) ---------------------------------------------------------


@attrs.frozen
class RecordCheckpoint:
    """A turn's checkpoint was captured (or failed): record it and its item in the turn."""

    checkpoint: Checkpoint


@attrs.frozen
class MarkReverted:
    """The thread's files were restored to checkpoint ``ordinal``: later turns are reverted."""

    thread_id: str
    ordinal: int


@attrs.frozen
class MoveThread:
    """The thread works in another directory from its next turn on (it must be idle)."""

    thread_id: str
    worktree_path: str | None
    branch: str | None


ClientCommand = (
    CreateProject
    | CreateThread
    | RenameThread
    | ArchiveThread
    | UnarchiveThread
    | DeleteThread
    | StartTurn
    | EditTurn
    | MoveTurn
    | CancelTurn
    | InterruptTurn
    | RespondToRequest
)
ProviderCommand = (
    MarkTurnRunning
    | RecordItems
    | OpenRequest
    | FinishTurn
    | RecordSession
    | OpenProviderTurn
    | ReleaseProviderTurn
    | RecordTasks
    | RequeueSteer
    | OpenSubagent
)
AdmissionCommand = HoldTurn | AdmitTurn
CheckpointCommand = RecordCheckpoint | MarkReverted | MoveThread
Command = ClientCommand | ProviderCommand | AdmissionCommand | RecoverAfterRestart | CheckpointCommand

# Provider updates that may share a transaction with other sessions' updates.
# The other provider commands (a turn's end, a request opened) are barriers: each
# commits after every update queued before it (closing an open transaction, or alone).
BATCHABLE = (MarkTurnRunning, RecordItems, RecordSession, RecordTasks)

_ENTITY_OVERHEAD = 200  # ids, kinds, timestamps and field names of one entity


def estimated_size(command: Command) -> int:
    """Rough bytes of the entities ``command`` writes, for a batch's byte bound. Pure."""
    if isinstance(command, RecordItems | RecordTasks):
        return sum(_ENTITY_OVERHEAD + json_size(item.title) + json_size(item.text) + json_size(item.data) for item in command.items)
    return _ENTITY_OVERHEAD


def json_size(value: object) -> int:
    """About how many bytes ``value`` takes as JSON (strings by length; no encoding). Pure."""
    size, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, dict):
            size += 2
            for key, inner in item.items():
                size += len(key) + 4
                stack.append(inner)
        elif isinstance(item, list | tuple):
            size += 2 + len(item)
            stack.extend(item)
        else:
            size += 8
    return size
