"""`decide(view, command, now)`: the domain rules, as a pure function.

Theory of operation: a command is checked against the current projections
(`StateView`) and turned into events (whole entities) and outbox effects. It
never mutates anything; the store applies the events in the same transaction
that records them. A rule that fails raises `DomainError` with a stable
``code`` and a message that says what to do.

Rules worth knowing:
- A thread runs one turn at a time. A turn started while another is open is
  ``queued`` (reason ``thread_busy``) and starts when the open one ends.
- Admission may hold a ``starting`` turn back (``HoldTurn``): it is ``queued``
  again with a hold reason (``loop_saturated``, ``max_active_turns``...), stays
  first on its thread, and starts on ``AdmitTurn``. After a restart a held turn
  starts again (and meets admission again).
- Thread status is derived: ``waiting`` while a turn waits on a request,
  ``running`` while a turn is active, ``queued`` (with the reason) while its
  next turn is held by admission, else ``idle``.
- Every turn ends with exactly one terminal record; pending requests of a
  finished turn are cancelled (expired after a restart).
- After a restart, a thread whose agent is still alive (taken over by the new
  daemon: `RecoverAfterRestart.live_sessions`) keeps its turns, pending requests
  and session as they are; every other open turn ends ``interrupted``
  (``server_restart``), a turn its provider started and that never ran is
  cancelled, and its background tasks are stopped.
- A provider may start a turn itself (`OpenProviderTurn`, ``started_by`` provider):
  it goes before every turn of the thread that has not reached the provider yet,
  which moves one ordinal later (ordinals are the run order: checkpoints count on
  it). A throttled one waits ``queued`` (``wake_throttled``) until released.
- Only turns that have not started (``queued``) can be edited, moved (among the
  thread's queue, behind a turn held by admission) or cancelled. A steered
  message goes into a ``running`` or ``waiting`` turn as an item and an effect;
  with none it is an ordinary turn.
- A turn has at most ``MAX_PENDING_REQUESTS`` pending requests: the next is refused
  (code ``full``), so a provider flooding prompts cannot grow a turn without bound.
- Background task items may change after their turn ended (`RecordTasks`); the
  thread lists the ones still running.
- A subagent is a child thread (`OpenSubagent`: ``parent_thread_id`` and ``subagent``
  set) with one turn, running as soon as it opens, inside its parent's turn. Its prompts
  are answered through the parent's agent (the root thread's session). When a turn
  ends, the open turns of the subagents it started (and theirs) end with it, with its
  status. Clients cannot start or interrupt turns on a subagent thread (its parent's
  are interrupted instead); a subagent's turn takes no checkpoint (the parent's does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from t3d.domain import commands as c
from t3d.domain.events import (
    AnswerProviderRequest,
    CaptureCheckpoint,
    Effect,
    Event,
    InterruptProviderTurn,
    StartProviderTurn,
    SteerProviderTurn,
    StopProviderSession,
    deleted,
    updated,
)
from t3d.domain.model import (
    ACTIVE_TURN_STATUSES,
    DECISIONS,
    DELIVERIES,
    HOLD_REASONS,
    MAX_PENDING_REQUESTS,
    MAX_RUNNING_TASKS,
    MAX_SUBAGENT_DEPTH,
    PROVIDERS,
    RUNNABLE_PROVIDERS,
    SUBAGENT_TITLE,
    TERMINAL_TURN_STATUSES,
    Checkpoint,
    Entity,
    JsonDict,
    Project,
    RuntimeRequest,
    Thread,
    ThreadStatus,
    Turn,
    TurnItem,
)
from t3d.domain.state import StateView
from t3d.errors import DomainError

MAX_TEXT = 1_000_000
MAX_TITLE = 500


@attrs.frozen
class Decision:
    events: list[Event]
    effects: list[Effect]
    result: JsonDict


class _Draft:
    """The view plus the entities this command has changed so far."""

    def __init__(self, view: StateView) -> None:
        self.view = view
        self.events: list[Event] = []
        self.effects: list[Effect] = []
        self._changed: dict[tuple[type, str], Entity] = {}
        self._new_items: dict[str, int] = {}

    def put(self, entity: Entity) -> None:
        self._changed[(type(entity), entity.id)] = entity
        self.events.append(updated(entity))

    def next_item_ordinal(self, turn_id: str) -> int:
        added = self._new_items.get(turn_id, 0) + 1
        self._new_items[turn_id] = added
        return self.view.item_count(turn_id) + added

    def get(self, kind: type, key: str, read: Callable[[str], Any]) -> Any:
        return self._changed.get((kind, key)) or read(key)

    def thread(self, thread_id: str) -> Thread:
        thread = self.get(Thread, thread_id, self.view.thread)
        if thread is None:
            raise DomainError("not_found", f"thread {thread_id!r} does not exist; list threads with GET /api/shell")
        return thread  # type: ignore[no-any-return]

    def turn(self, turn_id: str) -> Turn:
        turn = self.get(Turn, turn_id, self.view.turn)
        if turn is None:
            raise DomainError("not_found", f"turn {turn_id!r} does not exist")
        return turn  # type: ignore[no-any-return]

    def open_turns(self, thread_id: str) -> list[Turn]:
        by_id = {t.id: t for t in self.view.open_turns(thread_id)}
        for (kind, _), entity in self._changed.items():
            if kind is Turn and entity.thread_id == thread_id:  # type: ignore[union-attr]
                by_id[entity.id] = entity  # type: ignore[assignment]
        return sorted((t for t in by_id.values() if not t.terminal), key=lambda t: t.ordinal)

    def refresh_thread_status(self, thread_id: str) -> None:
        thread = self.thread(thread_id)
        open_turns = self.open_turns(thread_id)
        status = _derived_status(open_turns)
        reason = open_turns[0].queue_reason if status == "queued" else None
        if (status, reason) != (thread.status, thread.queue_reason):
            self.put(attrs.evolve(thread, status=status, queue_reason=reason))

    def decision(self, **result: Any) -> Decision:
        return Decision(self.events, self.effects, result)


def _derived_status(open_turns: list[Turn]) -> ThreadStatus:
    statuses = {t.status for t in open_turns}
    if "waiting" in statuses:
        return "waiting"
    if statuses & ACTIVE_TURN_STATUSES:
        return "running"
    if open_turns and open_turns[0].held:
        return "queued"
    return "idle"


def _require(condition: bool, code: str, message: str) -> None:
    if not condition:
        raise DomainError(code, message)


def _clean_title(title: str | None, fallback: str) -> str:
    title = (title or "").strip() or fallback
    _require(len(title) <= MAX_TITLE, "invalid", f"title is longer than {MAX_TITLE} characters; shorten it")
    return title


# --- client commands -----------------------------------------------------------


def _create_project(d: _Draft, cmd: c.CreateProject, now: float) -> Decision:
    _require(cmd.path.startswith("/"), "invalid", f"project path {cmd.path!r} is not absolute; pass an absolute directory path")
    existing = d.view.project_by_path(cmd.path)
    if existing is not None:
        return d.decision(project_id=existing.id, existed=True)
    _require(d.view.project(cmd.project_id) is None, "conflict", f"project id {cmd.project_id!r} is taken; mint a new id")
    title = _clean_title(cmd.title, cmd.path.rstrip("/").rsplit("/", 1)[-1] or cmd.path)
    d.put(Project(id=cmd.project_id, path=cmd.path, title=title, created_at=now))
    return d.decision(project_id=cmd.project_id)


def _create_thread(d: _Draft, cmd: c.CreateThread, now: float) -> Decision:
    _require(d.view.project(cmd.project_id) is not None, "not_found", f"project {cmd.project_id!r} does not exist; create it with project.create")
    _require(cmd.provider in PROVIDERS, "invalid", f"provider {cmd.provider!r} is unknown; use one of {', '.join(PROVIDERS)}")
    _require(
        cmd.provider in RUNNABLE_PROVIDERS,
        "invalid",
        f"provider {cmd.provider!r} is not available in this build yet; use one of {', '.join(RUNNABLE_PROVIDERS)}",
    )
    _require(d.view.thread(cmd.thread_id) is None, "conflict", f"thread id {cmd.thread_id!r} is taken; mint a new id")
    if cmd.parent_thread_id is not None:
        d.thread(cmd.parent_thread_id)
    d.put(
        Thread(
            id=cmd.thread_id,
            project_id=cmd.project_id,
            title=_clean_title(cmd.title, "New thread"),
            provider=cmd.provider,
            model=cmd.model,
            runtime_mode=cmd.runtime_mode or "approval-required",
            worktree_path=cmd.worktree_path,
            branch=cmd.branch,
            parent_thread_id=cmd.parent_thread_id,
            status="idle",
            created_at=now,
        )
    )
    return d.decision(thread_id=cmd.thread_id)


def _rename_thread(d: _Draft, cmd: c.RenameThread, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    d.put(attrs.evolve(thread, title=_clean_title(cmd.title, thread.title)))
    return d.decision(thread_id=thread.id)


def _archive_thread(d: _Draft, cmd: c.ArchiveThread, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    if thread.archived_at is None:
        _finish_open_turns(d, thread.id, now, "cancelled", "thread archived", "archived")
        d.put(attrs.evolve(d.thread(thread.id), archived_at=now))
        d.effects.append(StopProviderSession(thread.id))
    return d.decision(thread_id=thread.id)


def _unarchive_thread(d: _Draft, cmd: c.UnarchiveThread, now: float) -> Decision:
    """The undo of `_archive_thread`: what archiving ended (open turns, the agent) stays
    ended; the thread takes turns again, and its next turn starts its agent anew."""
    thread = d.thread(cmd.thread_id)
    if thread.archived_at is not None:
        d.put(attrs.evolve(thread, archived_at=None))
    return d.decision(thread_id=thread.id)


def _delete_thread(d: _Draft, cmd: c.DeleteThread, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    d.events.append(deleted(thread))
    d.effects.append(StopProviderSession(thread.id))
    _delete_subagents(d, thread.id, 1)
    return d.decision(thread_id=thread.id)


def _delete_subagents(d: _Draft, thread_id: str, depth: int) -> None:
    """A deleted thread's subagent threads go with it (theirs too): they are its work."""
    if depth > MAX_SUBAGENT_DEPTH:
        return
    for child in d.view.child_threads(thread_id):
        if child.subagent is not None:
            d.events.append(deleted(child))
            _delete_subagents(d, child.id, depth + 1)


def _check_prompt(text: str) -> None:
    _require(bool(text.strip()), "invalid", "text is empty; send the prompt as a non-empty string")
    _require(len(text) <= MAX_TEXT, "invalid", f"text is longer than {MAX_TEXT} characters; shorten the prompt")


def _start_turn(d: _Draft, cmd: c.StartTurn, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    _require(thread.archived_at is None, "conflict", f"thread {thread.id!r} is archived; start a new thread")
    _refuse_subagent(thread, "start turns on it; start a turn on its parent thread")
    _check_prompt(cmd.text)
    _require(cmd.delivery in DELIVERIES, "invalid", f"delivery {cmd.delivery!r} is unknown; use one of {', '.join(DELIVERIES)}")
    _require(d.view.turn(cmd.turn_id) is None, "conflict", f"turn id {cmd.turn_id!r} is taken; mint a new id")
    note = None
    if cmd.delivery == "steer":
        # Only into a turn its provider has accepted: a starting turn's prompt may not have
        # reached it yet (and admission may still hold it back).
        running = [t for t in d.open_turns(thread.id) if t.status in ("running", "waiting")]
        if running:
            return _steer(d, running[0], cmd, now)
        note = f"thread {thread.id!r} had no running turn to steer into; the message is an ordinary turn"
    turn = _new_user_turn(d, thread, cmd.turn_id, cmd.text, now)
    result: dict[str, Any] = {"turn_id": turn.id, "status": turn.status, "delivery": "queue"}
    if note is not None:
        result["note"] = note
    return d.decision(**result)


def _new_user_turn(d: _Draft, thread: Thread, turn_id: str, text: str, now: float, data: JsonDict | None = None) -> Turn:
    """A user turn with its prompt: starting if the thread is free, else queued behind."""
    busy = bool(d.open_turns(thread.id))
    turn = Turn(
        id=turn_id,
        thread_id=thread.id,
        ordinal=d.view.turn_count(thread.id) + 1,
        status="queued" if busy else "starting",
        queue_reason="thread_busy" if busy else None,
        requested_at=now,
    )
    d.put(turn)
    d.put(_user_message(f"{turn.id}:user", turn, 1, text, data, now))
    if not busy:
        d.effects.append(StartProviderTurn(thread.id, turn.id, text, turn.ordinal))
    d.refresh_thread_status(thread.id)
    return turn


def _user_message(item_id: str, turn: Turn, ordinal: int, text: str, data: JsonDict | None, now: float) -> TurnItem:
    """A message to the agent, as an item of ``turn``: a turn's prompt, a steered message."""
    return TurnItem(
        id=item_id,
        thread_id=turn.thread_id,
        turn_id=turn.id,
        ordinal=ordinal,
        kind="user_message",
        status="completed",
        title=None,
        text=text,
        data=data,
        updated_at=now,
    )


def _steer(d: _Draft, turn: Turn, cmd: c.StartTurn, now: float) -> Decision:
    """The message goes into the running turn: an item there, written to the provider now."""
    item_id = f"{turn.id}:steer:{cmd.turn_id}"
    _require(d.get(TurnItem, item_id, d.view.item) is None, "conflict", f"turn id {cmd.turn_id!r} is taken; mint a new id")
    item = _user_message(item_id, turn, 0, cmd.text, {"delivery": "steer", "steer_id": cmd.turn_id}, now)
    _upsert_item(d, item, turn)
    d.effects.append(SteerProviderTurn(turn.thread_id, turn.id, item_id, cmd.turn_id, cmd.text))
    return d.decision(turn_id=turn.id, status=turn.status, delivery="steer", item_id=item_id)


def _queued_turn(d: _Draft, turn_id: str, what: str) -> Turn:
    turn = d.turn(turn_id)
    _require(
        turn.status == "queued",
        "conflict",
        f"turn {turn.id!r} is {turn.status}; only a queued turn can be {what}"
        + ("; interrupt a running turn with turn.interrupt" if turn.status in ACTIVE_TURN_STATUSES else ""),
    )
    return turn


def _edit_turn(d: _Draft, cmd: c.EditTurn, now: float) -> Decision:
    turn = _queued_turn(d, cmd.turn_id, "edited")
    _require(turn.started_by == "user", "conflict", f"turn {turn.id!r} was started by the provider; it has no prompt to edit")
    _check_prompt(cmd.text)
    user = d.get(TurnItem, f"{turn.id}:user", d.view.item)
    _require(user is not None, "conflict", f"turn {turn.id!r} has no prompt to edit")
    if user.text != cmd.text:
        d.put(attrs.evolve(user, text=cmd.text, updated_at=now))
    return d.decision(turn_id=turn.id, status=turn.status)


def _move_turn(d: _Draft, cmd: c.MoveTurn, now: float) -> Decision:
    turn = _queued_turn(d, cmd.turn_id, "moved")
    queue = [t for t in d.open_turns(turn.thread_id) if t.status == "queued" and not t.held and t.started_by == "user"]
    _require(turn in queue, "conflict", f"turn {turn.id!r} is held by the daemon ({turn.queue_reason}); it starts first, as it is")
    order = [t for t in queue if t.id != turn.id]
    if cmd.before is None:
        order.append(turn)
    else:
        _require(cmd.before != turn.id, "invalid", "before names the turn being moved; name another queued turn")
        before = d.turn(cmd.before)
        _require(
            before in order,
            "conflict",
            f"turn {before.id!r} is not waiting in thread {turn.thread_id!r}'s queue (it is {before.status}); "
            "name a queued turn of the same thread, or omit before to move the turn last",
        )
        order.insert(order.index(before), turn)
    # The run order is the ordinal order (checkpoints and reverts count on it): the queued
    # turns swap ordinals among themselves; none of them has run.
    for moved, ordinal in zip(order, sorted(t.ordinal for t in queue), strict=True):
        if moved.ordinal != ordinal:
            d.put(attrs.evolve(moved, ordinal=ordinal))
    return d.decision(turn_id=turn.id, status=turn.status, order=[t.id for t in order])


def _cancel_turn(d: _Draft, cmd: c.CancelTurn, now: float) -> Decision:
    turn = d.turn(cmd.turn_id)
    if turn.status == "cancelled":
        return d.decision(turn_id=turn.id, status=turn.status)
    turn = _queued_turn(d, cmd.turn_id, "cancelled")
    _close_subagents(d, turn, now, "cancelled", "its parent's turn was cancelled", "cancelled_by_user", "cancelled")
    d.put(attrs.evolve(turn, status="cancelled", completed_at=now, reason="cancelled_by_user"))
    if turn.started_by == "provider":  # its agent is at work on it: stop that too
        d.effects.append(InterruptProviderTurn(turn.thread_id, turn.id))
    _start_next_queued(d, turn.thread_id)
    d.refresh_thread_status(turn.thread_id)
    return d.decision(turn_id=turn.id, status="cancelled")


def _refuse_subagent(thread: Thread, what: str) -> None:
    _require(
        thread.subagent is None,
        "conflict",
        f"thread {thread.id!r} is a subagent of thread {thread.parent_thread_id!r}; its agent runs it, so you cannot {what}",
    )


def _interrupt_turn(d: _Draft, cmd: c.InterruptTurn, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    _refuse_subagent(thread, "interrupt it alone; interrupt its parent thread (that ends its subagents too)")
    open_turns = d.open_turns(thread.id)
    active = [t for t in open_turns if t.status in ACTIVE_TURN_STATUSES]
    if active:
        turn = active[0]
        if turn.interrupt_requested_at is None:
            d.put(attrs.evolve(turn, interrupt_requested_at=now))
        d.effects.append(InterruptProviderTurn(thread.id, turn.id))
        return d.decision(turn_id=turn.id, status=turn.status)
    queued = [t for t in open_turns if t.status == "queued"]
    _require(bool(queued), "conflict", f"thread {thread.id!r} has no running or queued turn to interrupt")
    for turn in queued:
        _close_subagents(d, turn, now, "cancelled", "its parent's turn was interrupted", "interrupted_while_queued", "cancelled")
        d.put(attrs.evolve(turn, status="cancelled", completed_at=now, reason="interrupted_while_queued"))
        if turn.started_by == "provider":  # its agent is at work on it: stop that too
            d.effects.append(InterruptProviderTurn(thread.id, turn.id))
    d.refresh_thread_status(thread.id)
    return d.decision(turn_id=queued[0].id, status="cancelled")


def _respond_to_request(d: _Draft, cmd: c.RespondToRequest, now: float) -> Decision:
    request = d.get(RuntimeRequest, cmd.request_id, d.view.request)
    _require(request is not None, "not_found", f"request {cmd.request_id!r} does not exist; list them with requests.pending")
    _require(cmd.decision in DECISIONS, "invalid", f"decision {cmd.decision!r} is unknown; use one of {', '.join(DECISIONS)}")
    _require(request.status == "pending", "conflict", f"request {request.id!r} is already {request.status}")
    d.put(attrs.evolve(request, status="resolved", decision=cmd.decision, message=cmd.message, resolved_at=now))
    item = d.get(TurnItem, request.item_id, d.view.item)
    if item is not None:
        allowed = cmd.decision in ("allow", "allow_session")
        d.put(attrs.evolve(item, status="allowed" if allowed else "denied", updated_at=now))
    turn = d.turn(request.turn_id)
    still_pending = [r for r in d.view.pending_requests(turn.id) if r.id != request.id]
    if turn.status == "waiting" and not still_pending:
        d.put(attrs.evolve(turn, status="running"))
        d.refresh_thread_status(turn.thread_id)
    d.effects.append(AnswerProviderRequest(_root_thread(d, turn.thread_id), request.id, cmd.decision, cmd.message))
    return d.decision(request_id=request.id)


# --- provider commands ---------------------------------------------------------


def _open_turn(d: _Draft, turn_id: str) -> Turn:
    """The turn a provider reports on: it must be the thread's active turn."""
    turn = d.turn(turn_id)
    _require(turn.status in ACTIVE_TURN_STATUSES, "conflict", f"turn {turn_id!r} is {turn.status}, not active")
    return turn


def _mark_turn_running(d: _Draft, cmd: c.MarkTurnRunning, now: float) -> Decision:
    turn = _open_turn(d, cmd.turn_id)
    if turn.status == "starting":
        d.put(attrs.evolve(turn, status="running", queue_reason=None, started_at=now))
        d.refresh_thread_status(turn.thread_id)
    return d.decision(turn_id=turn.id)


def _hold_turn(d: _Draft, cmd: c.HoldTurn, now: float) -> Decision:
    _require(cmd.reason in HOLD_REASONS, "invalid", f"hold reason {cmd.reason!r} is unknown")
    turn = d.turn(cmd.turn_id)
    _require(turn.status == "starting", "conflict", f"turn {turn.id!r} is {turn.status}, not starting")
    d.put(attrs.evolve(turn, status="queued", queue_reason=cmd.reason))
    d.refresh_thread_status(turn.thread_id)
    return d.decision(turn_id=turn.id, status="queued")


def _admit_turn(d: _Draft, cmd: c.AdmitTurn, now: float) -> Decision:
    turn = d.turn(cmd.turn_id)
    _require(turn.held, "conflict", f"turn {turn.id!r} is {turn.status}, not held")
    d.put(attrs.evolve(turn, status="starting", queue_reason=None))
    d.refresh_thread_status(turn.thread_id)
    return d.decision(turn_id=turn.id, status="starting")


def _upsert_item(d: _Draft, item: TurnItem, turn: Turn) -> TurnItem:
    existing = d.get(TurnItem, item.id, d.view.item)
    if existing is not None:
        _require(existing.turn_id == turn.id, "conflict", f"item {item.id!r} belongs to another turn")
        ordinal = existing.ordinal
    else:
        ordinal = d.next_item_ordinal(turn.id)
    stored = attrs.evolve(item, thread_id=turn.thread_id, turn_id=turn.id, ordinal=ordinal)
    if stored != existing:
        d.put(stored)
    return stored


def _record_items(d: _Draft, cmd: c.RecordItems, now: float) -> Decision:
    turn = _open_turn(d, cmd.turn_id)
    for item in cmd.items:
        _upsert_item(d, item, turn)
    return d.decision(turn_id=turn.id)


def _open_request(d: _Draft, cmd: c.OpenRequest, now: float) -> Decision:
    turn = _open_turn(d, cmd.turn_id)
    _require(d.view.request(cmd.request_id) is None, "conflict", f"request id {cmd.request_id!r} is taken")
    _require(
        len(d.view.pending_requests(turn.id)) < MAX_PENDING_REQUESTS,
        "full",
        f"this turn already has {MAX_PENDING_REQUESTS} prompts waiting for an answer; answer those first (requests.pending)",
    )
    item = _upsert_item(d, cmd.item, turn)
    d.put(
        RuntimeRequest(
            id=cmd.request_id,
            thread_id=turn.thread_id,
            turn_id=turn.id,
            item_id=item.id,
            kind=cmd.kind,
            status="pending",
            created_at=now,
            data=cmd.data,
        )
    )
    d.put(attrs.evolve(turn, status="waiting", started_at=turn.started_at or now))
    d.refresh_thread_status(turn.thread_id)
    return d.decision(request_id=cmd.request_id)


def _finish_turn(d: _Draft, cmd: c.FinishTurn, now: float) -> Decision:
    _require(cmd.status in TERMINAL_TURN_STATUSES, "invalid", f"status {cmd.status!r} is not terminal")
    turn = d.turn(cmd.turn_id)
    if turn.terminal:  # a turn ends once; a late second report changes nothing
        return d.decision(turn_id=turn.id, status=turn.status)
    _close_turn(d, turn, now, cmd.status, cmd.error, cmd.reason, usage=cmd.usage, cost_usd=cmd.cost_usd)
    _capture_checkpoint(d, turn)  # before the next turn's start: its baseline comes after
    _start_next_queued(d, turn.thread_id)
    d.refresh_thread_status(turn.thread_id)
    return d.decision(turn_id=turn.id, status=cmd.status)


def _close_turn(
    d: _Draft,
    turn: Turn,
    now: float,
    status: Any,
    error: str | None,
    reason: str | None,
    *,
    usage: JsonDict | None = None,
    cost_usd: float | None = None,
    request_status: str = "cancelled",
) -> None:
    _close_subagents(d, turn, now, status, error, reason, request_status)
    for request in d.view.pending_requests(turn.id):
        request = d.get(RuntimeRequest, request.id, d.view.request)
        if request.status == "pending":
            d.put(attrs.evolve(request, status=request_status, resolved_at=now))
    d.put(
        attrs.evolve(
            turn,
            status=status,
            completed_at=now,
            error=error,
            reason=reason,
            usage=usage if usage is not None else turn.usage,
            cost_usd=cost_usd if cost_usd is not None else turn.cost_usd,
        )
    )


def _close_subagents(d: _Draft, turn: Turn, now: float, status: Any, error: str | None, reason: str | None, request_status: str) -> None:
    """The open turns of the subagents ``turn`` started end with it (theirs too, in turn)."""
    for child in d.view.child_threads(turn.thread_id):
        if child.subagent is None or child.subagent.get("parent_turn_id") != turn.id:
            continue
        for open_turn in d.open_turns(child.id):
            if status == "completed":  # the parent finished, the subagent never said it did
                _close_turn(d, open_turn, now, "failed", "the subagent reported no result before its parent's turn ended", "parent_turn_ended", request_status=request_status)
            else:
                why = error or f"its parent's turn ended {status}"
                _close_turn(d, open_turn, now, status, why, reason or "parent_turn_ended", request_status=request_status)
        d.refresh_thread_status(child.id)


def _root_thread(d: _Draft, thread_id: str) -> str:
    """The thread whose agent runs ``thread_id``: itself, or a subagent's top parent."""
    for _ in range(MAX_SUBAGENT_DEPTH + 1):
        thread = d.get(Thread, thread_id, d.view.thread)
        if thread is None or thread.subagent is None or thread.parent_thread_id is None:
            return thread_id
        thread_id = thread.parent_thread_id
    return thread_id


def _finish_open_turns(d: _Draft, thread_id: str, now: float, status: str, error: str, reason: str) -> None:
    for turn in d.open_turns(thread_id):
        _close_turn(d, turn, now, status, error, reason)
    d.refresh_thread_status(thread_id)


def _start_next_queued(d: _Draft, thread_id: str, *, restart_held: bool = False) -> None:
    """Start the thread's first queued turn if nothing is open ahead of it. A held turn
    stays held (admission releases it), unless ``restart_held`` (after a restart)."""
    open_turns = d.open_turns(thread_id)
    if any(t.status in ACTIVE_TURN_STATUSES or (t.held and not restart_held) for t in open_turns):
        return
    queued = [t for t in open_turns if t.status == "queued"]
    if not queued:
        return
    turn = queued[0]
    d.put(attrs.evolve(turn, status="starting", queue_reason=None))
    if turn.started_by == "provider":
        d.effects.append(StartProviderTurn(thread_id, turn.id, "", turn.ordinal, provider_started=True))
        return
    user = d.get(TurnItem, f"{turn.id}:user", d.view.item)
    d.effects.append(StartProviderTurn(thread_id, turn.id, user.text if user and user.text else "", turn.ordinal))


WAKE_TITLE = 500


def _wake_title(origin: JsonDict) -> str:
    kind = origin.get("kind")
    if kind == "task_notification":
        tasks = origin.get("tasks") or []
        summaries = [str(t.get("summary") or t.get("task_id") or "") for t in tasks if isinstance(t, dict)]
        title = "Woken by a background task: " + "; ".join(s for s in summaries if s)
    elif kind == "steered_message":
        title = "Woken to answer a message steered into an earlier turn"
    else:
        title = "Started by the agent on its own"
    return title[:WAKE_TITLE]


def _open_provider_turn(d: _Draft, cmd: c.OpenProviderTurn, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    existing = d.view.turn(cmd.turn_id)
    if existing is not None:  # the session's retry: the turn is there already
        _require(existing.thread_id == thread.id and existing.started_by == "provider", "conflict", f"turn id {cmd.turn_id!r} is taken")
        return d.decision(turn_id=existing.id, status=existing.status)
    _require(thread.archived_at is None, "conflict", f"thread {thread.id!r} is archived; its agent's work is not recorded")
    open_turns = d.open_turns(thread.id)
    _require(
        not any(t.status in ("running", "waiting") for t in open_turns),
        "conflict",
        f"thread {thread.id!r} has a turn its provider is running; the provider's own turn cannot come before its end",
    )
    # The provider is at work now: it runs first. Turns that have not reached it (queued,
    # or starting and not yet written to it) wait behind it, one ordinal later each, and so
    # do the queued turns cancelled among them: none of them has run, so the run order
    # stays the ordinal order.
    ordinal = min((t.ordinal for t in open_turns), default=d.view.turn_count(thread.id) + 1)
    later = {t.id: t for t in d.view.turns_from(thread.id, ordinal)} | {t.id: t for t in open_turns}
    for waiting in sorted(later.values(), key=lambda t: t.ordinal, reverse=True):
        moved = attrs.evolve(waiting, ordinal=waiting.ordinal + 1)
        if not waiting.terminal:
            moved = attrs.evolve(moved, status="queued", queue_reason="thread_busy")
        d.put(moved)
    turn = Turn(
        id=cmd.turn_id,
        thread_id=thread.id,
        ordinal=ordinal,
        status="queued" if cmd.throttled else "starting",
        queue_reason="wake_throttled" if cmd.throttled else None,
        requested_at=now,
        started_by="provider",
        origin=cmd.origin,
    )
    d.put(turn)
    d.put(
        TurnItem(
            id=f"{turn.id}:wake",
            thread_id=thread.id,
            turn_id=turn.id,
            ordinal=1,
            kind="wake",
            status="completed",
            title=_wake_title(cmd.origin),
            text=None,
            data=cmd.origin,
            updated_at=now,
        )
    )
    if not cmd.throttled:
        d.effects.append(StartProviderTurn(thread.id, turn.id, "", turn.ordinal, provider_started=True))
    d.refresh_thread_status(thread.id)
    return d.decision(turn_id=turn.id, status=turn.status)


def _release_provider_turn(d: _Draft, cmd: c.ReleaseProviderTurn, now: float) -> Decision:
    turn = d.turn(cmd.turn_id)
    if turn.status != "queued" or turn.queue_reason != "wake_throttled":
        return d.decision(turn_id=turn.id, status=turn.status)  # cancelled (or started) meanwhile
    d.put(attrs.evolve(turn, status="starting", queue_reason=None))
    d.effects.append(StartProviderTurn(turn.thread_id, turn.id, "", turn.ordinal, provider_started=True))
    d.refresh_thread_status(turn.thread_id)
    return d.decision(turn_id=turn.id, status="starting")


def _record_tasks(d: _Draft, cmd: c.RecordTasks, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    running = list(thread.running_tasks)
    for item in cmd.items:
        _require(item.kind == "background_task", "invalid", f"item {item.id!r} is a {item.kind}, not a background task")
        turn = d.turn(item.turn_id)
        _require(turn.thread_id == thread.id, "conflict", f"turn {turn.id!r} is not in thread {thread.id!r}")
        _upsert_item(d, item, turn)
        if item.status == "running":
            if item.id not in running:
                running.append(item.id)
        elif item.id in running:
            running.remove(item.id)
    running = running[-MAX_RUNNING_TASKS:]
    thread = d.thread(thread.id)
    if running != thread.running_tasks:
        d.put(attrs.evolve(thread, running_tasks=running))
    return d.decision(thread_id=thread.id, running_tasks=len(running))


def _requeue_steer(d: _Draft, cmd: c.RequeueSteer, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    existing = d.view.turn(cmd.turn_id)
    if existing is not None:
        return d.decision(turn_id=existing.id, status=existing.status)
    item = d.get(TurnItem, cmd.item_id, d.view.item)
    if item is not None:
        note = "the turn ended before the agent got the message; it became turn " + cmd.turn_id
        d.put(attrs.evolve(item, data={**(item.data or {}), "requeued_as": cmd.turn_id, "note": note}, updated_at=now))
    if thread.archived_at is not None:
        return d.decision(turn_id=None, status=None)
    turn = _new_user_turn(d, thread, cmd.turn_id, cmd.text, now, data={"steered_into": item.turn_id if item else None})
    return d.decision(turn_id=turn.id, status=turn.status)


def _open_subagent(d: _Draft, cmd: c.OpenSubagent, now: float) -> Decision:
    parent_turn = _open_turn(d, cmd.parent_turn_id)
    parent = d.thread(parent_turn.thread_id)
    existing = d.view.thread(cmd.thread_id)
    if existing is not None:  # a replay of the same output: it is there already
        _require(
            existing.subagent is not None and existing.subagent.get("parent_turn_id") == parent_turn.id,
            "conflict",
            f"thread id {cmd.thread_id!r} is taken",
        )
        return d.decision(thread_id=existing.id, turn_id=cmd.turn_id)
    _require(d.view.turn(cmd.turn_id) is None, "conflict", f"turn id {cmd.turn_id!r} is taken")
    depth = 1
    ancestor = parent
    while ancestor.subagent is not None and ancestor.parent_thread_id is not None and depth <= MAX_SUBAGENT_DEPTH:
        depth += 1
        ancestor = d.thread(ancestor.parent_thread_id)
    _require(depth <= MAX_SUBAGENT_DEPTH, "invalid", f"subagents nest deeper than {MAX_SUBAGENT_DEPTH}; the deeper ones are not recorded")
    what = (cmd.description or cmd.prompt).strip().replace("\n", " ") or "subagent"
    title = f"{cmd.subagent_type or 'subagent'}: {what}"
    if len(title) > SUBAGENT_TITLE:
        title = title[: SUBAGENT_TITLE - 1] + "…"
    d.put(
        Thread(
            id=cmd.thread_id,
            project_id=parent.project_id,
            title=title,
            provider=parent.provider,
            model=parent.model,
            runtime_mode=parent.runtime_mode,
            worktree_path=parent.worktree_path,
            branch=parent.branch,
            parent_thread_id=parent.id,
            status="running",
            created_at=now,
            subagent={
                "parent_turn_id": parent_turn.id,
                "tool_use_id": cmd.tool_use_id,
                "subagent_type": cmd.subagent_type,
                "description": cmd.description,
            },
        )
    )
    origin = {"kind": "subagent", "parent_thread_id": parent.id, "parent_turn_id": parent_turn.id, "tool_use_id": cmd.tool_use_id}
    turn = Turn(
        id=cmd.turn_id,
        thread_id=cmd.thread_id,
        ordinal=1,
        status="running",
        requested_at=now,
        started_at=now,
        started_by="provider",
        origin=origin,
    )
    d.put(turn)
    data = {"subagent_type": cmd.subagent_type, "description": cmd.description}
    d.put(_user_message(f"{turn.id}:user", turn, d.next_item_ordinal(turn.id), cmd.prompt[:MAX_TEXT], data, now))
    return d.decision(thread_id=cmd.thread_id, turn_id=turn.id)


def _record_session(d: _Draft, cmd: c.RecordSession, now: float) -> Decision:
    d.thread(cmd.session.thread_id)
    d.put(cmd.session)
    return d.decision(session_id=cmd.session.id)


def _recover_after_restart(d: _Draft, cmd: c.RecoverAfterRestart, now: float) -> Decision:
    live = {s.id: s for s in d.view.live_sessions()}
    kept = {live[s].thread_id for s in cmd.live_sessions if s in live}
    threads: set[str] = set()
    for turn in d.view.all_open_turns():
        threads.add(turn.thread_id)
        if _root_thread(d, turn.thread_id) in kept:
            continue  # its agent (or its subagent's parent's) still runs it: the turn carries on
        turn = d.get(Turn, turn.id, d.view.turn)
        if turn.terminal:
            continue  # a subagent's, ended with its parent's just now
        if turn.started_by == "provider" and turn.status == "queued":  # its agent is gone
            _close_turn(d, turn, now, "cancelled", "the daemon restarted before this turn could start; its agent is gone", "server_restart")
        elif turn.status in ACTIVE_TURN_STATUSES:
            _close_turn(
                d,
                turn,
                now,
                "interrupted",
                "the daemon restarted while this turn ran; start a new turn to continue",
                "server_restart",
                request_status="expired",
            )
            _capture_checkpoint(d, turn)
    for request in d.view.all_pending_requests():
        if _root_thread(d, request.thread_id) in kept:
            continue
        if d.get(RuntimeRequest, request.id, d.view.request).status == "pending":
            d.put(attrs.evolve(request, status="expired", resolved_at=now))
    # Background tasks run only in a live agent (an agent's recorded exit stopped its own):
    # those of agents not kept are gone with them.
    for thread_id in sorted({s.thread_id for s in live.values()} - kept):
        thread = d.get(Thread, thread_id, d.view.thread)
        if thread is not None and thread.running_tasks:
            _stop_tasks(d, thread, now, "the daemon restarted and the agent that ran this task is gone")
    for session in live.values():
        if session.id not in cmd.live_sessions:
            d.put(attrs.evolve(session, status="exited", exited_at=now))
    for thread_id in sorted(threads):
        _start_next_queued(d, thread_id, restart_held=True)
        d.refresh_thread_status(thread_id)
    return d.decision(threads=len(threads - kept))


def _stop_tasks(d: _Draft, thread: Thread, now: float, why: str) -> None:
    for item_id in thread.running_tasks:
        item = d.get(TurnItem, item_id, d.view.item)
        if item is not None and item.status == "running":
            d.put(attrs.evolve(item, status="stopped", data={**(item.data or {}), "status": "stopped", "note": why}, updated_at=now))
    d.put(attrs.evolve(d.thread(thread.id), running_tasks=[]))


# --- checkpoints -----------------------------------------------------------------------------


def _thread_directory(d: _Draft, thread: Thread) -> str:
    """Where the thread's turns run: its worktree, else its project's directory."""
    if thread.worktree_path:
        return thread.worktree_path
    project = d.view.project(thread.project_id)
    return project.path if project is not None else ""


def _capture_checkpoint(d: _Draft, turn: Turn) -> None:
    """A turn that ran (started, whatever its end) gets its checkpoint, in its own directory."""
    if turn.started_at is None and turn.status not in ACTIVE_TURN_STATUSES:
        return  # never ran (cancelled while queued): nothing to capture
    thread = d.thread(turn.thread_id)
    if thread.subagent is not None:
        return  # it works in its parent's directory, during the parent's turn: that one's checkpoint

    d.effects.append(CaptureCheckpoint(thread.id, turn.id, turn.ordinal, _thread_directory(d, thread)))


def _checkpoint_item(cp: Checkpoint, turn: Turn, now: float) -> TurnItem:
    if cp.status == "ok":
        files = len(cp.files)
        title = f"Checkpoint {cp.ordinal}: {files} file{'s' if files != 1 else ''} changed, +{cp.additions} -{cp.deletions}"
    elif cp.status == "unavailable":
        title = "No checkpoint: " + (cp.error or "checkpoints are unavailable here")
    else:
        title = "Checkpoint failed: " + (cp.error or "unknown error")
    data = {
        "checkpoint_id": cp.id,
        "status": cp.status,
        "ordinal": cp.ordinal,
        "ref": cp.ref,
        "base_ref": cp.base_ref,
        "worktree": cp.worktree,
        "files": cp.files,
        "additions": cp.additions,
        "deletions": cp.deletions,
        "error": cp.error,
    }
    return TurnItem(
        id=f"{turn.id}:checkpoint",
        thread_id=turn.thread_id,
        turn_id=turn.id,
        ordinal=0,
        kind="checkpoint",
        status="failed" if cp.status == "error" else "completed",
        title=title,
        text=None,
        data=data,
        updated_at=now,
    )


def _record_checkpoint(d: _Draft, cmd: c.RecordCheckpoint, now: float) -> Decision:
    cp = cmd.checkpoint
    turn = d.turn(cp.turn_id)
    _require(turn.thread_id == cp.thread_id, "conflict", f"turn {turn.id!r} is not in thread {cp.thread_id!r}")
    _require(turn.ordinal == cp.ordinal, "conflict", f"turn {turn.id!r} has ordinal {turn.ordinal}, not {cp.ordinal}")
    d.put(cp)
    _upsert_item(d, _checkpoint_item(cp, turn, now), turn)
    return d.decision(checkpoint_id=cp.id, status=cp.status)


def _require_idle(d: _Draft, thread: Thread, what: str) -> None:
    _require(
        not d.open_turns(thread.id),
        "conflict",
        f"thread {thread.id!r} has a turn running or queued; interrupt it or wait for it to end before you {what}",
    )


def _mark_reverted(d: _Draft, cmd: c.MarkReverted, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    _require_idle(d, thread, "revert its files")
    changed = 0
    for turn in d.view.thread_turns(thread.id):
        turn = d.get(Turn, turn.id, d.view.turn)
        later = turn.ordinal > cmd.ordinal
        if later and turn.reverted_at is None:
            d.put(attrs.evolve(turn, reverted_at=now))
            changed += 1
        elif not later and turn.reverted_at is not None:
            d.put(attrs.evolve(turn, reverted_at=None))
            changed += 1
    return d.decision(thread_id=thread.id, ordinal=cmd.ordinal, turns_changed=changed)


def _move_thread(d: _Draft, cmd: c.MoveThread, now: float) -> Decision:
    thread = d.thread(cmd.thread_id)
    _require(thread.archived_at is None, "conflict", f"thread {thread.id!r} is archived; start a new thread")
    _require_idle(d, thread, "move it")
    d.put(attrs.evolve(thread, worktree_path=cmd.worktree_path, branch=cmd.branch))
    d.effects.append(StopProviderSession(thread.id))  # the next turn starts its agent in the new directory
    return d.decision(thread_id=thread.id, worktree_path=cmd.worktree_path, branch=cmd.branch)


_RULES: dict[type, Callable[[_Draft, Any, float], Decision]] = {
    c.CreateProject: _create_project,
    c.CreateThread: _create_thread,
    c.RenameThread: _rename_thread,
    c.ArchiveThread: _archive_thread,
    c.UnarchiveThread: _unarchive_thread,
    c.DeleteThread: _delete_thread,
    c.StartTurn: _start_turn,
    c.EditTurn: _edit_turn,
    c.MoveTurn: _move_turn,
    c.CancelTurn: _cancel_turn,
    c.InterruptTurn: _interrupt_turn,
    c.RespondToRequest: _respond_to_request,
    c.HoldTurn: _hold_turn,
    c.AdmitTurn: _admit_turn,
    c.MarkTurnRunning: _mark_turn_running,
    c.RecordItems: _record_items,
    c.OpenRequest: _open_request,
    c.FinishTurn: _finish_turn,
    c.RecordSession: _record_session,
    c.OpenSubagent: _open_subagent,
    c.OpenProviderTurn: _open_provider_turn,
    c.ReleaseProviderTurn: _release_provider_turn,
    c.RecordTasks: _record_tasks,
    c.RequeueSteer: _requeue_steer,
    c.RecoverAfterRestart: _recover_after_restart,
    c.RecordCheckpoint: _record_checkpoint,
    c.MarkReverted: _mark_reverted,
    c.MoveThread: _move_thread,
}


def decide(view: StateView, command: c.Command, now: float) -> Decision:
    """Check `command` against `view`; return the events, effects and result."""
    return _RULES[type(command)](_Draft(view), command, now)
