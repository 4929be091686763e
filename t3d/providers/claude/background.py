"""What a Claude CLI does between turns and besides them: the part of `ClaudeSession` that
handles wakes, background tasks and steered messages.

Theory of operation. Claude Code keeps working after a turn's ``result`` when the agent
started background work (a Bash command or a subagent with ``run_in_background``): the
CLI reports the work on ``task_*`` lines, and when it ends the CLI may wake the agent,
which writes a whole turn (``init`` … ``result``) with no user message before it.

- Task lines update the task's ``background_task`` item (`TaskTracker`) in the turn that
  started it, open or finished (`RecordTasks`); the thread lists the ones still running.
- Output that arrives with no turn open opens a turn started by the provider (a *wake*,
  `OpenProviderTurn`, its origin the notifications that came since the last turn). It
  starts like any turn: through admission (the reader waits, so the CLI waits on its
  pipe, until the effect comes back), then runs and ends by its ``result``. A user turn
  that arrives meanwhile waits for that result: the domain queues it behind (one that
  was about to start is put back). Output a previous daemon left unread (a replay) is
  caught up without waiting for admission.
- A provider that keeps waking itself is throttled (`WakeLimiter`): its next wake waits
  ``queued`` (``wake_throttled``, its origin saying for how long), so the thread says so.
- A steered message is written at once; 2.1.197 runs it after the running turn's
  ``result``, so the turn goes on until the steered message's own result
  (`TurnMapper.steers_pending`). A steer for a turn that ended first becomes an ordinary
  queued turn (`RequeueSteer`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.model import TurnItem
from t3d.errors import ProviderError, SpawnerError
from t3d.providers.claude import events as ce
from t3d.providers.claude.adapter import TurnMapper
from t3d.providers.claude.encode import encode_permission_deny, encode_user_message
from t3d.providers.claude.process import ClaudeProcess
from t3d.providers.claude.tasks import TaskEvent, TaskTracker
from t3d.providers.log_limit import LogLimiter
from t3d.providers.session_base import SessionBase

if TYPE_CHECKING:
    from t3d.providers.claude.session import SessionSpec

log = logging.getLogger("t3d.providers.claude")

# A provider may wake itself at most WAKE_BURST times per WAKE_WINDOW_S; a wake beyond
# that waits until the window allows it.
WAKE_BURST = 5
WAKE_WINDOW_S = 60.0
# An output file a finished background task names is read up to this many bytes (its tail).
OUTPUT_FILE_BYTES = 16 * 1024

# Lines that are part of a turn: with no turn open, they open one (a wake).
_TURN_EVENTS = (
    ce.SystemInit,
    ce.MessageStarted,
    ce.BlockStarted,
    ce.TextDelta,
    ce.ThinkingDelta,
    ce.ToolInputDelta,
    ce.BlockStopped,
    ce.MessageDelta,
    ce.MessageStopped,
    ce.AssistantMessage,
    ce.UserMessage,
    ce.TurnResult,
    ce.PermissionRequested,
)


class WakeLimiter:
    """At most ``burst`` wakes in any ``window`` seconds. Pure (times are passed in)."""

    def __init__(self, burst: int = WAKE_BURST, window: float = WAKE_WINDOW_S) -> None:
        self._burst = burst
        self._window = window
        self._times: deque[float] = deque(maxlen=burst)

    def delay(self, now: float) -> float:
        """Seconds the next wake must wait (0: it may start now)."""
        if len(self._times) < self._burst:
            return 0.0
        return max(0.0, self._times[0] + self._window - now)

    def record(self, now: float) -> None:
        self._times.append(now)


def subagent_of(event: object) -> str | None:
    """The subagent tool call a line comes from (None: the main agent's own line)."""
    if isinstance(event, ce.PermissionRequested):
        return event.agent_id
    parent = getattr(event, "parent_tool_use_id", None)
    return parent if isinstance(parent, str) and parent else None


def opens_turn(event: object) -> bool:
    """Whether a line that arrives with no turn open starts one: the agent's own turn output
    does; task lines, status lines, control replies and a subagent's lines do not."""
    if not isinstance(event, _TURN_EVENTS) or subagent_of(event) is not None:
        return False
    return not (isinstance(event, ce.UserMessage) and event.is_replay)


class BackgroundWork(SessionBase):
    """Wakes, tasks and steers: state and steps `ClaudeSession` mixes in."""

    spec: SessionSpec
    _clock: Callable[[], float]
    _proc: ClaudeProcess | None
    _turn: TurnMapper | None
    _native_seen: str | None
    _known_turns: deque[str]
    _quiet_since: float
    _warnings: LogLimiter
    _send: Callable[[bytes], Awaitable[None]]
    _meta: Callable[[ClaudeProcess], dict[str, Any]]
    _start_turn: Callable[[trio.Nursery, ev.StartProviderTurn], Awaitable[None]]

    def __init__(self) -> None:
        self._tasks = TaskTracker(self.spec.thread_id, self._clock)
        self._wakes = WakeLimiter()
        # The wake waiting for admission (its turn id), and what lets it go on.
        self._pending_wake: str | None = None
        self._wake_admitted = trio.Event()
        # Messages steered into turns that ended (interrupted) before their own result:
        # if the CLI runs one anyway, that turn's origin says so.
        self._orphan_steers = 0

    # --- wakes -------------------------------------------------------------------------

    async def _open_wake(self, proc: ClaudeProcess, line_start: int) -> None:
        """Open a turn for output that came with no turn open; return once it may run (or
        it was refused: its output is then read to its result and not recorded)."""
        replaying = proc.output.replaying
        turn_id = uuid.uuid4().hex
        origin = self._tasks.take_origin()
        if origin is None and self._orphan_steers:
            self._orphan_steers -= 1
            origin = {"kind": "steered_message"}
        origin = origin or {"kind": "unknown"}
        now = trio.current_time()
        delay = 0.0 if replaying else self._wakes.delay(now)
        if delay > 0:
            origin = {**origin, "throttled_s": round(delay, 1)}
            log.warning(
                "thread %s: %s woke itself %d times within %gs; its next turn waits %.0fs",
                self.spec.thread_id, self.spec.provider, WAKE_BURST, WAKE_WINDOW_S, delay,
            )
        mapper = TurnMapper(self.spec.thread_id, turn_id, self._clock)
        mapper.user_turn = False
        self._turn = mapper
        self._known_turns.append(turn_id)
        self._tasks.last_turn_id = turn_id
        self._quiet_since = now
        self._pending_wake, self._wake_admitted = turn_id, trio.Event()
        admitted = self._wake_admitted
        try:
            if not await self._commit_checked(c.OpenProviderTurn(self.spec.thread_id, turn_id, origin, delay > 0)):
                mapper.discard = True  # refused (the thread was archived or deleted)
                return
            with trio.CancelScope(shield=True):  # the next daemon replays the turn from here
                proc.turn_id, proc.turn_offset, proc.steers = turn_id, line_start, 0
                with contextlib.suppress(SpawnerError):
                    await proc.process.ack(line_start, self._meta(proc))
            if replaying:  # written while no daemon read it: caught up, not admitted again
                admitted.set()
            if delay > 0:
                with trio.move_on_after(delay):
                    await admitted.wait()  # or cancelled meanwhile (turn.cancel, interrupt)
                if not mapper.discard:
                    await self._commit(c.ReleaseProviderTurn(turn_id))
            await admitted.wait()
        finally:
            self._pending_wake = None
        self._wakes.record(trio.current_time())
        self._quiet_since = trio.current_time()
        if not mapper.discard:
            await self._commit(c.MarkTurnRunning(turn_id))

    def _admit_wake(self, turn_id: str) -> None:
        """Admission let the wake ``turn_id`` start (its `StartProviderTurn` came back)."""
        if self._pending_wake == turn_id:
            self._wake_admitted.set()

    def _cancel_wake(self, turn_id: str) -> bool:
        """The wake was cancelled before it could start: read its output, record none."""
        turn = self._turn
        if self._pending_wake != turn_id or turn is None:
            return False
        turn.discard = True
        self._wake_admitted.set()
        return True

    # --- tasks ---------------------------------------------------------------------------

    async def _on_task(self, event: TaskEvent) -> None:
        current = None if self._turn is None or self._turn.discard else self._turn.turn_id
        change = self._tasks.feed(event, current)
        if change.warning is not None:
            self._warnings.warning(change.warning)
        items = list(change.items)
        if isinstance(event, ce.TaskNotification) and event.output_file:
            output = await _read_tail(event.output_file)
            if output:
                item = self._tasks.output(event.task_id, output)
                items += [item] if item is not None else []
        await self._record_tasks(items)

    async def _record_tasks(self, items: list[TurnItem]) -> None:
        if items:
            latest = {item.id: item for item in items}  # one state per item, its last
            await self._commit(c.RecordTasks(self.spec.thread_id, tuple(latest.values())))

    async def _on_subagent_line(self, event: object, parent: str) -> bool:
        """A background subagent's line: its task's output. False: not one of those."""
        if not self._tasks.is_background_agent(parent):
            return False
        if isinstance(event, ce.AssistantMessage):
            for block in event.blocks:
                if isinstance(block, ce.ToolUseBlock):
                    started = self._tasks.see_tool(self._tasks.last_turn_id or "", block, parent)
                    await self._record_tasks(list(started.items) if started is not None else [])
            text = "\n".join(b.text for b in event.blocks if isinstance(b, ce.TextBlock))
            item = self._tasks.agent_text(parent, text)
            await self._record_tasks([item] if item is not None else [])
        elif isinstance(event, ce.PermissionRequested) and self._turn is None:
            # No turn is open to show it in: refused, saying why (the agent may ask again).
            self._warnings.warning(f"a background subagent asked to use {event.tool_name} while no turn was open; denied")
            with contextlib.suppress(ProviderError):
                await self._send(
                    encode_permission_deny(
                        event.request_id,
                        "t3d: no turn of this thread is open to show the request in; ask again in a turn",
                    )
                )
        elif isinstance(event, ce.PermissionRequested):
            return False  # shown in the open turn, answered there
        return True

    async def _stop_tasks(self, why: str) -> None:
        await self._record_tasks(self._tasks.stop_all(why))

    # --- steering --------------------------------------------------------------------------

    async def _steer(self, effect: ev.SteerProviderTurn) -> None:
        turn, proc = self._turn, self._proc
        if turn is None or turn.turn_id != effect.turn_id or proc is None or turn.discard:
            await self._requeue(effect)
            return
        turn.steers_pending += 1
        proc.steers += 1
        try:
            await self._send(encode_user_message(effect.text, self._native_seen or ""))
        except ProviderError:
            turn.steers_pending -= 1
            proc.steers -= 1
            await self._requeue(effect)
            return
        with trio.CancelScope(shield=True), contextlib.suppress(SpawnerError):
            await proc.process.ack(proc.turn_offset, self._meta(proc))  # the steer count

    async def _requeue(self, effect: ev.SteerProviderTurn) -> None:
        log.info("thread %s: a message steered into turn %s came after its end; it is a turn of its own", self.spec.thread_id, effect.turn_id)
        await self._commit(c.RequeueSteer(self.spec.thread_id, effect.item_id, effect.steer_id, effect.text))


async def _read_tail(path: str) -> str | None:
    """The last `OUTPUT_FILE_BYTES` of a task's output file; None if it cannot be read."""

    def read() -> str | None:
        try:
            if not os.path.isfile(path):  # never open a FIFO or a device the line names
                return None
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(max(0, size - OUTPUT_FILE_BYTES))
                return handle.read(OUTPUT_FILE_BYTES).decode("utf-8", "replace")
        except OSError:
            return None

    if not path.startswith("/"):
        return None
    return await trio.to_thread.run_sync(read)
