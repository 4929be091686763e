"""Domain entities: what a thread, a turn, an item and a request are.

Entities are frozen attrs classes; every change makes a new value and an
event that carries the whole entity (docs/architecture.md, Domain), so a projection is always
"replace the row". Ids are strings; clients mint the ids of what they create.
Times are seconds since the epoch (float), supplied by the caller so the
domain stays pure and testable.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

JsonDict = dict[str, Any]

PROVIDERS = ("claude", "codex", "replay", "replay-codex")
RUNNABLE_PROVIDERS = ("claude", "codex", "replay", "replay-codex")

ThreadStatus = Literal["idle", "running", "waiting", "queued"]
TurnStatus = Literal[
    "queued", "starting", "running", "waiting", "completed", "interrupted", "failed", "cancelled"
]
TERMINAL_TURN_STATUSES = frozenset({"completed", "interrupted", "failed", "cancelled"})
ACTIVE_TURN_STATUSES = frozenset({"starting", "running", "waiting"})
# Why a turn that could start is held back as ``queued`` by the daemon's admission
# (not by its thread: ``thread_busy`` queues wait behind an open turn of their own).
HOLD_REASONS = frozenset({"loop_saturated", "max_active_turns", "memory_pressure", "wake_throttled"})
# Who started a turn: a client (``turn.start``) or the provider on its own (a background
# task's notification woke the agent: a *wake*).
TurnStarter = Literal["user", "provider"]
# How ``turn.start`` delivers its text to a thread with a running turn: queued as the next
# turn (the default), or steered into the running turn.
DELIVERIES = ("queue", "steer")
# Background task item ids a thread lists as still running (the oldest leave the list first).
MAX_RUNNING_TASKS = 64
# A subagent thread's title (its type and description or prompt) is cut to this length.
SUBAGENT_TITLE = 200
# How deep subagents nest (a subagent's own subagents...): deeper lines are dropped.
MAX_SUBAGENT_DEPTH = 8
# Runtime requests (prompts) a turn may have pending at once. At the bound the domain
# refuses the next (`DomainError` code ``full``) and the session denies it to its CLI.
MAX_PENDING_REQUESTS = 64

ItemKind = Literal[
    "user_message",
    "assistant_message",
    "reasoning",
    "tool_call",
    "command",
    "file_change",
    "approval_request",
    "user_input_request",
    "subagent",
    "checkpoint",
    "error",
    # A background Bash command, background subagent or monitor the agent started: its
    # status lives on after its turn ended (``running`` until the CLI reports its end).
    "background_task",
    # The first item of a turn the provider started: why it woke (e.g. a task's notification).
    "wake",
]
ItemStatus = Literal[
    "streaming", "running", "completed", "failed", "pending", "allowed", "denied", "stopped"
]
# Item statuses after which an item is seldom updated again.
SETTLED_ITEM_STATUSES = frozenset({"completed", "failed", "allowed", "denied", "stopped"})

RequestStatus = Literal["pending", "resolved", "expired", "cancelled"]
Decision = Literal["allow", "allow_session", "deny", "cancel"]
DECISIONS = ("allow", "allow_session", "deny", "cancel")

SessionStatus = Literal["starting", "running", "exited"]


@attrs.frozen
class Project:
    id: str
    path: str
    title: str
    created_at: float


@attrs.frozen
class Thread:
    id: str
    project_id: str
    title: str
    provider: str
    model: str | None
    runtime_mode: str
    worktree_path: str | None
    branch: str | None
    parent_thread_id: str | None
    # Derived from the thread's turns and requests by `decide`; never set by clients.
    status: ThreadStatus
    created_at: float
    archived_at: float | None = None
    # Why the thread's next turn is held (status ``queued``): its turn's hold reason.
    queue_reason: str | None = None
    # Item ids of the thread's background tasks still running (at most MAX_RUNNING_TASKS),
    # whatever turn started them: what still runs after the thread's turns ended.
    running_tasks: list[str] = attrs.Factory(list)
    # Set on a subagent's thread (a child the provider's agent started with its Agent/Task
    # tool): ``{"parent_turn_id", "tool_use_id", "subagent_type", "description"}``. Its one
    # turn runs inside the parent's turn and ends with the tool call's result; clients
    # neither start nor interrupt turns on it (they interrupt the parent).
    subagent: JsonDict | None = None


@attrs.frozen
class Turn:
    id: str
    thread_id: str
    # 1-based, dense per thread, assigned at turn.start.
    ordinal: int
    status: TurnStatus
    requested_at: float
    queue_reason: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    interrupt_requested_at: float | None = None
    usage: JsonDict | None = None
    cost_usd: float | None = None
    # For failed/interrupted/cancelled turns: what happened, in words a user can act on.
    error: str | None = None
    # Machine reason for a terminal status (e.g. ``server_restart``, ``interrupt_timeout``).
    reason: str | None = None
    # Set when the files were reverted to a checkpoint before this turn (checkpoint.revert).
    reverted_at: float | None = None
    # ``provider``: the agent started this turn on its own (a wake), ``origin`` says why.
    started_by: TurnStarter = "user"
    # Why a provider-started turn began: ``{"kind": "task_notification", "tasks": [...]}``
    # (the notifications that woke the agent), ``{"kind": "steered_message"}`` or
    # ``{"kind": "unknown"}``; ``throttled_s`` when t3d held it back (a flood of wakes).
    origin: JsonDict | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_TURN_STATUSES

    @property
    def held(self) -> bool:
        """Queued by admission: next on its thread, waiting for the daemon to let it start."""
        return self.status == "queued" and self.queue_reason in HOLD_REASONS


@attrs.frozen
class TurnItem:
    id: str
    thread_id: str
    turn_id: str
    # 1-based, dense per turn, assigned when the item is first recorded.
    ordinal: int
    kind: ItemKind
    status: ItemStatus
    title: str | None
    text: str | None
    data: JsonDict | None
    updated_at: float


@attrs.frozen
class RuntimeRequest:
    id: str
    thread_id: str
    turn_id: str
    item_id: str
    kind: str
    status: RequestStatus
    created_at: float
    decision: Decision | None = None
    message: str | None = None
    resolved_at: float | None = None
    # What the provider needs to answer it (e.g. the tool input to echo back).
    data: JsonDict | None = None


@attrs.frozen
class ProviderSession:
    id: str
    thread_id: str
    provider: str
    status: SessionStatus
    started_at: float
    native_session_id: str | None = None
    pid: int | None = None
    exited_at: float | None = None
    exit_code: int | None = None
    stderr_tail: str | None = None


# ok: captured; error: the capture failed (``error`` says why; the turn is unaffected);
# unavailable: the thread's directory is not in a git repository (no checkpoints there).
CheckpointStatus = Literal["ok", "error", "unavailable"]


@attrs.frozen
class Checkpoint:
    """The files after a turn, as a commit under a hidden ref (t3d/git/checkpoints.py)."""

    id: str  # "<thread_id>:<ordinal>"
    thread_id: str
    turn_id: str
    ordinal: int  # the turn's ordinal
    worktree: str  # the directory it was taken in: the thread's own, as the turn ran
    status: CheckpointStatus
    created_at: float
    ref: str | None = None
    commit: str | None = None
    # The ref the turn started from (its baseline), which `files` are counted against.
    base_ref: str | None = None
    # [{path, additions, deletions}] (binary files: additions/deletions None), at most 500.
    files: list[JsonDict] = attrs.Factory(list)
    additions: int = 0
    deletions: int = 0
    error: str | None = None


Entity = Project | Thread | Turn | TurnItem | RuntimeRequest | ProviderSession | Checkpoint
