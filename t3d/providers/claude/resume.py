"""Taking over a Claude CLI process a previous daemon left running (`Reattach`): the part of
`ClaudeSession` that runs once, before the session reads its inbox.

Rules:
- The open turn is the one the process was last given: replay its output from the
  turn's offset through a fresh `TurnMapper`, item states held until the replay is
  through (one write per item, in first-seen order, so no client sees an item go back
  to an older state), barriers (a prompt, the turn's end) written in place.
- Prompts: pending ones are known from the database, whatever the replay shows; an
  answer the database has but the replay shows no tool result for is sent again.
- A replay that lost the turn's start reads on from the live point, from the committed
  items, with an error item in the turn saying what was lost.
- The open turn is another one: it never reached the process; it is started as usual.
- Between turns, what the process wrote after the last ack is new (a wake, task lines) and
  is read like live output, except the end of a turn the database has finished already
  (the daemon stopped before it acked that end): skipped through its result(s).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.model import TurnItem
from t3d.errors import ProviderError
from t3d.providers.claude.adapter import TurnMapper
from t3d.providers.claude.encode import encode_answer
from t3d.providers.claude.process import ClaudeProcess
from t3d.providers.claude.tasks import TaskTracker
from t3d.providers.reattach import Reattach
from t3d.providers.session_base import SessionBase

if TYPE_CHECKING:
    from t3d.providers.claude.session import SessionSpec

log = logging.getLogger("t3d.providers.claude")

# Item states held during a replay are written this many per command.
HELD_BATCH = 64


class ResumeAfterRestart(SessionBase):
    """What `ClaudeSession` keeps for a replay, and the steps of a takeover."""

    spec: SessionSpec
    _clock: Callable[[], float]
    _proc: ClaudeProcess | None
    _turn: TurnMapper | None
    _requests: dict[str, tuple[str, dict[str, Any]]]
    _native_seen: str | None
    _known_turns: deque[str]
    _quiet_since: float
    _idle_since: float
    _read_stdout: Callable[[ClaudeProcess], Awaitable[None]]
    _send: Callable[[bytes], Awaitable[None]]
    _start_turn: Callable[[trio.Nursery, ev.StartProviderTurn], Awaitable[None]]
    _tasks: TaskTracker
    _escalate_interrupt: Callable[[TurnMapper, ClaudeProcess], Awaitable[None]]

    def __init__(self) -> None:
        # Item states held until the replay is through (latest per item, first-seen
        # order); tool calls whose results it showed.
        self._held: dict[str, TurnItem] = {}
        self._progressed: set[str] = set()

    async def _reattach(self, nursery: trio.Nursery, reattach: Reattach) -> None:
        """Take over the process a previous daemon left; replay its open turn's output."""
        child, meta = reattach.child, reattach.meta
        session_id = str(meta.get("session_id") or uuid.uuid4().hex)
        started_at = meta.get("started_at")
        proc = ClaudeProcess(child, session_id, float(started_at) if isinstance(started_at, int | float) else self._clock())
        cost = meta.get("cost_so_far")
        proc.cost_so_far = float(cost) if isinstance(cost, int | float) else 0.0
        native = meta.get("native_session_id")
        self._native_seen = native if isinstance(native, str) else None
        proc.turn_id, proc.turn_offset = meta.get("turn_id"), reattach.turn_offset
        steers = meta.get("steers")
        proc.steers = steers if isinstance(steers, int) and not isinstance(steers, bool) and steers > 0 else 0
        self._proc = proc
        self._tasks.restore(reattach.tasks)
        turn = reattach.turn
        if turn is not None and reattach.same_turn:
            self._resume_turn(reattach, proc)
        elif meta.get("turn_id") is not None:
            # The turn named finished (the database says so) but its end was not acked: its
            # output is in the replay; what follows its result(s) is new.
            proc.skip_results = 1 + proc.steers
        log.info(
            "thread %s: reattached to its %s process (pid %d), %d bytes to replay%s",
            self.spec.thread_id, self.spec.provider, child.pid, child.replay.end - child.replay.start,
            "" if turn is None else f", turn {turn.id} {turn.status}",
        )
        nursery.start_soon(proc.read_stderr)
        nursery.start_soon(self._read_stdout, proc)
        await proc.output.replayed.wait()
        await self._flush_held()
        self._idle_since = trio.current_time()
        if turn is None:
            return
        if not reattach.same_turn and turn.started_by == "provider":
            # Opened by the last daemon, which stopped before telling the spawner: its output,
            # if any, was replayed above as a turn of its own.
            error = "the daemon restarted as this turn began; its output is in the next turn"
            await self._commit(c.FinishTurn(turn.id, "cancelled", error, "server_restart"))
            return
        if not reattach.same_turn:
            text = reattach.user_text
            await self._start_turn(nursery, ev.StartProviderTurn(self.spec.thread_id, turn.id, text, turn.ordinal))
            return
        if self._turn is None or self._turn.turn_id != turn.id:
            return  # the replay ended it
        if turn.status == "starting":
            await self._commit(c.MarkTurnRunning(turn.id))
        await self._resend_answers(reattach)
        if self._turn.interrupt_requested:
            nursery.start_soon(self._escalate_interrupt, self._turn, proc)

    def _resume_turn(self, reattach: Reattach, proc: ClaudeProcess) -> None:
        turn = reattach.turn
        assert turn is not None
        mapper = TurnMapper(self.spec.thread_id, turn.id, self._clock)
        mapper.interrupt_requested = turn.interrupt_requested_at is not None
        mapper.steers_pending = proc.steers  # the replay passes their results again
        mapper.user_turn = turn.started_by == "user"
        self._turn = mapper
        self._known_turns.append(turn.id)
        self._quiet_since = trio.current_time()
        for request in reattach.requests:  # so an answer reaches the CLI whatever the replay shows
            prefix = f"{request.turn_id}:"  # the turn's, or one of its subagents' turns
            if request.status == "pending" and request.id.startswith(prefix):
                self._requests[request.id] = (request.id[len(prefix) :], dict(request.data or {}))
        if reattach.complete:
            proc.skip_until = reattach.turn_offset
            return
        # The turn's start is gone from the replay: read on from the live point.
        proc.skip_until = reattach.child.replay.end
        mapper.restore(reattach.items)
        log.warning(
            "thread %s: turn %s: %d bytes of its output from before the restart were dropped "
            "(over the spawner's replay buffer); reading on from the live point",
            self.spec.thread_id, turn.id, reattach.lost_bytes,
        )
        gap = reattach.gap_item(self.spec.provider, self._clock)
        self._held[gap.id] = gap

    async def _resend_answers(self, reattach: Reattach) -> None:
        """Answers the database has but the CLI may never have read (the daemon died first):
        sent again when the replay shows the CLI still waiting."""
        if not reattach.complete:
            return
        for request in reattach.requests:
            pending = self._requests.get(request.id)
            if request.status != "resolved" or pending is None or request.decision is None:
                continue
            if (pending[1].get("tool_use_id") or "") in self._progressed:
                self._requests.pop(request.id, None)
                continue
            log.info("thread %s: answering request %s again after the restart", self.spec.thread_id, request.id)
            self._requests.pop(request.id, None)
            with contextlib.suppress(ProviderError):
                await self._send(encode_answer(*pending, request.decision, request.message))

    async def _flush_held(self) -> None:
        turn = self._turn
        held, self._held = self._held, {}
        if turn is None or not held:
            return
        by_turn: dict[str, list[TurnItem]] = {}  # the turn's own, and its subagents' turns'
        for item in held.values():
            by_turn.setdefault(item.turn_id, []).append(item)
        for turn_id, in_turn in by_turn.items():
            for start in range(0, len(in_turn), HELD_BATCH):
                await self._commit(c.RecordItems(turn_id, tuple(in_turn[start : start + HELD_BATCH])))

