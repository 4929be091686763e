"""The turn driver of a `CodexSession`: a turn's start, interrupt and answers, and the
app-server's stdout lines turned into domain changes.

Rules:
- One turn at a time; a start effect for a turn this session started or took over
  already (an effect the previous daemon handed over) is dropped.
- Before turn/start is written, the spawner is told the turn, its stdout offset and the
  request's id (shielded with the write); after the turn's end has committed, its
  output is acked.
- Every server request is answered: approvals with the user's decision, any other with
  a JSON-RPC error, so Codex never waits on t3d. An approval outside a turn of ours is
  refused.
- A message steered into the running turn goes out as ``turn/steer`` (the turn Codex
  named as ``expectedTurnId``); with no such turn, or refused, it becomes a queued turn.
- A stop always completes: an interrupt Codex does not honour within the interrupt
  timeout stops the process and the turn ends ``interrupted``.
- A turn in which Codex only retries (``error`` with ``willRetry``) for
  ``retry_timeout`` seconds is interrupted and fails with Codex's last message.
- A stdout line over the line limit cannot be read, so its turn is stopped and fails
  saying so; a malformed line is skipped. Both are logged rate-limited (`LogLimiter`),
  and so are (at info) the server requests refused and the error answers nobody waits for.
- An agent the turn's agent spawns (``collabAgentToolCall`` ``spawnAgent``) is a child
  thread (`Collab`, collab.py): its Codex thread's events are items of the child's turn
  and its approvals are asked there (answered to Codex like any other); its Codex turn's
  end, or a collab item reporting it over, ends the child; an interrupt of the turn
  interrupts its open agents too; children still open when the turn ends end with it.
  A line of a Codex thread that is neither the session's nor an open agent's is held
  until a spawn names its thread (bounded), else dropped and logged at the turn's end;
  an approval request of one is refused at once.
- A turn in which Codex sends nothing for the silence timeout, with no approval
  pending, fails (``provider_silent``) and the process is stopped (`watch_silence`).
- Streaming text is coalesced (`ItemCoalescer`). While output from before a restart is
  replayed (`ProviderOutput.replaying`), item states are held instead, latest per item
  in first-seen order, and written before the next barrier (a prompt, the turn's end)
  or once the replay is through; the answers Codex's requests would get wait for the
  replay's end too, and go out only if the replay does not show them resolved.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable

import trio

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.model import TurnItem
from t3d.errors import ProtocolError, ProviderError, SpawnerError
from t3d.providers.coalesce import ItemCoalescer
from t3d.providers.codex import events as ce
from t3d.providers.codex.adapter import (
    Change,
    ItemChanged,
    PermissionAsked,
    TurnEnded,
    TurnMapper,
)
from t3d.providers.codex.collab import Child, Collab, by_turn, closing
from t3d.providers.codex.encode import (
    approval_result,
    encode_error,
    encode_result,
    turn_interrupt_params,
    turn_start_params,
    turn_steer_params,
)
from t3d.providers.codex.peer import CodexPeer, CodexRefused
from t3d.providers.codex.process import AppServer
from t3d.providers.codex.protocol import parse_line
from t3d.providers.lines import LineTooLong
from t3d.providers.log_limit import LogLimiter
from t3d.providers.prompts import open_request
from t3d.providers.silence import Quiet, watch_silence
from t3d.spawn.child import stop_child

log = logging.getLogger("t3d.providers.codex")

# Item states held during a replay are written this many per command.
HELD_BATCH = 64


class TurnDriver(AppServer):
    """Turns and lines of `CodexSession` (state is set up by its ``__init__``)."""

    _write: Callable[[c.Command], Awaitable[object]]
    _retry_timeout: float
    _requests: dict[str, ce.ApprovalRequested]
    _deferred: dict[ce.RequestId, bytes]
    _known_turns: deque[str]
    _retrying_since: float | None
    _items: ItemCoalescer
    _held: dict[str, TurnItem]
    _quiet_since: float
    _warnings: LogLimiter
    _notes: LogLimiter
    _collab: Collab

    # --- effects -----------------------------------------------------------------------

    async def _start_turn(self, nursery: trio.Nursery, effect: ev.StartProviderTurn) -> None:
        if effect.turn_id in self._known_turns:  # started already (an effect of the last daemon)
            return
        self._known_turns.append(effect.turn_id)
        if self._turn is not None:  # the domain runs one turn at a time; never overlap
            log.warning("%s: turn %s started while %s runs", self._tag, effect.turn_id, self._turn.turn_id)
        turn = TurnMapper(self.spec.thread_id, effect.turn_id, self._clock, self._usage_total)
        self._turn = turn
        self._retrying_since = None
        self._quiet_since = trio.current_time()
        if self.spec.before_turn is not None:  # the checkpoint baseline: before any edit
            await self.spec.before_turn(self.spec.thread_id, effect.ordinal, self.spec.cwd)
        try:
            peer = self._peer if self._peer is not None else await self._start_process(nursery)
            assert peer.thread_id is not None
            reaches = functools.partial(self._turn_reaches, peer, effect.turn_id)
            result = await peer.call("turn/start", turn_start_params(peer.thread_id, effect.text), before_send=reaches)
        except (SpawnerError, ProviderError) as exc:
            await self._end_turn(self._start_failure(exc), turn)
            return
        if self._turn is not turn:
            return  # it ended meanwhile (the process exited)
        await self._turn_named(turn, result)

    async def _turn_reaches(self, peer: CodexPeer, turn_id: str, request_id: int) -> None:
        """Just before turn/start is written: tell the spawner which turn the output from
        here is for (the next daemon trusts it) and the request's id."""
        proc = peer.proc
        proc.turn_id, proc.turn_offset = turn_id, proc.output.offset
        peer.turn_request_id = request_id
        await proc.process.ack(proc.turn_offset, self._meta(peer))

    async def _turn_named(self, turn: TurnMapper, result: object, *, replaying: bool = False) -> None:
        """Codex accepted turn/start: its answer names the turn, which is running now."""
        codex_turn = _turn_of(result)
        if codex_turn:
            turn.codex_turn_id = codex_turn
        await self._commit(c.MarkTurnRunning(turn.turn_id))
        if turn.interrupt_requested and not replaying:  # asked for before Codex named the turn
            await self._send_interrupt(turn)

    def _start_failure(self, exc: Exception) -> TurnEnded:
        provider = self.spec.provider
        if isinstance(exc, CodexRefused):
            return TurnEnded("failed", f"{provider} refused {exc.method}: {exc.message}", "provider_refused", None)
        return TurnEnded("failed", f"{provider}: {exc}", "provider_start_failed", None)

    async def _interrupt(self, nursery: trio.Nursery, effect: ev.InterruptProviderTurn) -> None:
        turn, peer = self._turn, self._peer
        if turn is None or turn.turn_id != effect.turn_id or peer is None:
            return
        turn.interrupt_requested = True
        await self._send_interrupt(turn)
        nursery.start_soon(self._escalate_interrupt, turn, peer)

    async def _send_interrupt(self, turn: TurnMapper) -> None:
        """``turn/interrupt`` once Codex has named the turn (else it goes out when it does)."""
        peer = self._peer
        if turn.codex_turn_id is None or peer is None or peer.thread_id is None:
            return  # no process: its exit ends the turn
        targets = [(peer.thread_id, turn.codex_turn_id), *self._collab.interrupting()]  # its agents too
        with trio.CancelScope(shield=True):
            request_ids = [peer.calls.start("turn/interrupt") for _ in targets]
            await self._tell_spawner(peer, peer.proc.turn_offset)  # the next daemon counts on from here
            # If the process is going away, its exit ends the turn.
            for request_id, (thread_id, codex_turn) in zip(request_ids, targets, strict=True):
                await peer.notify(request_id, "turn/interrupt", turn_interrupt_params(thread_id, codex_turn))

    async def _steer(self, effect: ev.SteerProviderTurn) -> None:
        """``turn/steer`` into the running turn; a turn that ended (or that Codex has not
        named yet, or refuses it for) gets the message as a turn of its own instead."""
        turn, peer = self._turn, self._peer
        if turn is not None and turn.turn_id == effect.turn_id and turn.codex_turn_id and peer is not None and peer.thread_id:
            params = turn_steer_params(peer.thread_id, turn.codex_turn_id, effect.text)

            async def reaches(request_id: int) -> None:  # the next daemon counts on from here
                await self._tell_spawner(peer, peer.proc.turn_offset)

            try:
                await peer.call("turn/steer", params, before_send=reaches)
                return
            except ProviderError as exc:
                log.info("%s: turn/steer refused (%s); the message is a turn of its own", self._tag, exc)
        await self._commit(c.RequeueSteer(self.spec.thread_id, effect.item_id, effect.steer_id, effect.text))

    async def _escalate_interrupt(self, turn: TurnMapper, peer: CodexPeer) -> None:
        await trio.sleep(self.spec.interrupt_timeout)
        if self._turn is turn and self._peer is peer:
            log.warning(
                "%s: interrupt not honoured in %gs; stopping the provider", self._tag, self.spec.interrupt_timeout
            )
            peer.proc.forced_stop = True
            await stop_child(peer.proc.process, grace=2.0)

    async def _answer(self, effect: ev.AnswerProviderRequest) -> None:
        request = self._requests.pop(effect.request_id, None)
        peer = self._peer
        if request is None or peer is None:
            return
        asked = self._collab.asking(effect.request_id) or self._turn
        if effect.decision == "cancel" and asked is not None:
            asked.interrupt_requested = True  # Codex interrupts the (agent's) turn on cancel
        self._quiet_since = trio.current_time()
        result = approval_result(request, effect.decision, effect.message)
        await peer.send_quietly(encode_result(request.id, result))

    async def _run_retry_watch(self, nursery: trio.Nursery) -> None:
        """Stop a turn in which Codex has done nothing but retry for `retry_timeout` seconds."""
        while True:
            await trio.sleep(min(self._retry_timeout / 4, 1.0))
            turn, since = self._turn, self._retrying_since
            if turn is None or since is None or turn.fail_with is not None:
                continue
            if trio.current_time() - since < self._retry_timeout:
                continue
            message = turn.retry_text or "Codex kept retrying"
            turn.fail_with = (
                f"{message}; Codex was still retrying after {self._retry_timeout:g} s, so t3d "
                "stopped the turn (--codex-retry-timeout)",
                "provider_retrying",
            )
            log.warning("%s: %s", self._tag, turn.fail_with[0])
            await self._send_interrupt(turn)
            if self._peer is not None:
                nursery.start_soon(self._escalate_interrupt, turn, self._peer)

    async def _run_silence_watch(self) -> None:
        """Stop the process of a turn that has had no output for `silence_timeout` seconds
        while no approval waits for the user (`watch_silence`)."""
        await watch_silence(self.spec.provider, self.spec.silence_timeout, log, self._tag, self._quiet)

    def _quiet(self) -> Quiet | None:
        proc, turn = self._proc, self._turn
        if proc is None or turn is None or self._requests:
            return None
        return Quiet(proc, turn.turn_id, self._quiet_since)

    # --- lines → domain ------------------------------------------------------------------

    async def _on_line(self, peer: CodexPeer, line: bytes | LineTooLong) -> None:
        output = peer.proc.output
        skipped = output.offset <= peer.proc.skip_until  # settled by the previous daemon, or lost
        if isinstance(line, LineTooLong):
            if peer is self._peer and not skipped:
                await self._line_too_long(line, replaying=output.replaying)
            else:
                self._warnings.warning(str(line))
            return
        try:
            event = parse_line(line)
        except ProtocolError as exc:
            self._warnings.warning(f"ignored a provider line: {exc}")
            return
        if isinstance(event, ce.Response | ce.ErrorResponse):
            if not peer.on_response(event) and peer is self._peer:
                await self._unclaimed_response(peer, event)
            return
        if peer is not self._peer:
            return  # a process let go (idle, on its way out): nothing of it reaches a turn
        replaying = output.replaying
        if not replaying and self._held:
            await self._flush_held()
        if isinstance(event, ce.RequestResolved):
            self._deferred.pop(event.request_id, None)
            for request_id, request in list(self._requests.items()):
                if request.id == event.request_id:
                    del self._requests[request_id]  # Codex withdrew it: no answer goes out
        elif isinstance(event, ce.OtherServerRequest):
            self._notes.warning(f"refused Codex's {event.method} request")
            await self._auto_answer(peer, event.id, encode_error(event.id, f"t3d does not support {event.method!r}"), replaying)
        elif not skipped and self._turn is not None and (child := self._collab.child_of(event)) is not None:
            await self._feed(self._turn, event, replaying=replaying, child=child)
        elif isinstance(event, ce.ApprovalRequested) and not self._ours(event) and not (skipped and self._collab.child_of(event)):
            # Nobody can be asked (no turn of ours runs): refuse rather than let Codex wait.
            self._stray(event, "approval request is declined")
            await self._auto_answer(peer, event.id, encode_result(event.id, approval_result(event, "deny")), replaying)
        elif skipped or isinstance(event, ce.WarningNotice | ce.Unknown | ce.OtherNotification | ce.ThreadStarted):
            if isinstance(event, ce.WarningNotice) and not skipped:
                log.debug("%s: Codex warns: %s", self._tag, event.message)
        elif self._turn is not None and self._ours(event):
            await self._feed(self._turn, event, replaying=replaying)
        elif self._turn is None or getattr(event, "thread_id", "") in ("", peer.thread_id):
            self._stray(event)  # another turn's, or no turn's
        elif not self._collab.hold(event, len(line)):  # an agent's before its spawn names it, maybe
            self._stray(event)

    async def _auto_answer(self, peer: CodexPeer, request_id: ce.RequestId, line: bytes, replaying: bool) -> None:
        """Answer a request no user is asked; in a replay, once it is through (the previous
        daemon may have answered already: the replay then shows it resolved)."""
        if replaying:
            self._deferred[request_id] = line
        else:
            await peer.send_quietly(line)

    async def _unclaimed_response(self, peer: CodexPeer, event: ce.Response | ce.ErrorResponse) -> None:
        """An answer no call of this daemon waits for: the previous daemon's turn/start of the
        turn this session took over (in the replay, or live) names the turn or refuses it."""
        turn = self._turn
        if event.id is None or event.id != peer.turn_request_id or turn is None or turn.turn_id != peer.proc.turn_id:
            return
        peer.turn_request_id = None
        if isinstance(event, ce.ErrorResponse):
            await self._flush_held()
            await self._end_turn(self._start_failure(CodexRefused("turn/start", event.message)), turn)
        elif turn.codex_turn_id is None or turn.codex_turn_id == _turn_of(event.result):
            await self._turn_named(turn, event.result, replaying=peer.proc.output.replaying)

    def _ours(self, event: object) -> bool:
        """The event belongs to this session's thread and its current turn."""
        turn, peer = self._turn, self._peer
        if turn is None:
            return False
        thread_id = getattr(event, "thread_id", "")
        if thread_id and peer is not None and peer.thread_id is not None and thread_id != peer.thread_id:
            return False
        turn_id = getattr(event, "turn_id", "")
        if not turn_id:
            return True
        if turn_id in self._done_turns:
            return False
        if turn.codex_turn_id is None:
            turn.codex_turn_id = turn_id  # turn/started (or an item) before turn/start's answer
            return True
        return turn_id == turn.codex_turn_id

    async def _feed(self, turn: TurnMapper, event: object, *, replaying: bool, child: Child | None = None) -> None:
        """Map ``event`` of the turn's agent (or of the agent ``child``): the children a spawn
        opens first (the call's item links to them), then its changes, then the ends of
        the agents a collab item reports over."""
        mapper = turn if child is None else child.mapper
        await self._spawn(mapper, event, replaying)
        for change in mapper.feed(event):
            if child is not None and isinstance(change, TurnEnded):  # the agent's turn, not ours
                await self._end_child(child, self._collab.finish(child, change))
            else:
                await self._apply(mapper, change, replaying=replaying)
            if self._turn is not turn:
                return
        for over, finish in self._collab.reported(event):
            await self._end_child(over, finish)
        if child is not None:
            return
        if turn.retrying and self._retrying_since is None:
            self._retrying_since = trio.current_time()
        elif not turn.retrying:
            self._retrying_since = None

    def _stray(self, event: object, fate: str = "line is dropped") -> None:
        """A line of a Codex thread that is not the session's nor an open agent's: dropped."""
        thread_id = getattr(event, "thread_id", "")
        peer = self._peer
        if not thread_id or peer is None or thread_id == peer.thread_id or self._collab.ended(thread_id):
            return
        turn = "no turn" if self._turn is None else f"turn {self._turn.turn_id}"
        self._warnings.warning(f"Codex thread {thread_id!r} is no open agent of {turn}: its {fate} ({type(event).__name__})")

    async def _spawn(self, mapper: TurnMapper, event: object, replaying: bool) -> None:
        children, why = self._collab.spawned(mapper, event)
        for reason in why:
            self._warnings.warning(reason)
        for child in children:
            await self._flush_held()
            if not await self._commit_checked(child.command):  # refused (the parent's turn is over, say)
                self._collab.refused(child)
                self._warnings.warning(f"agent {child.codex_thread_id} was not opened as a thread; its lines are dropped")
        for child in children:  # its lines that came before the spawn named it
            for early in self._collab.held_for(child):
                turn = self._turn
                if turn is not None and self._collab.child_of(early) is child:  # (not a later turn's)
                    await self._feed(turn, early, replaying=replaying, child=child)

    async def _end_child(self, child: Child, finish: c.FinishTurn) -> None:
        """The agent ``child`` is over: its items (and its own open agents') end, then its turn."""
        gone = self._collab.close(child)
        if not gone:
            return  # over already (an ancestor's end closed it)
        await self._flush_held()
        for each in gone:
            await self._close_items(each.mapper)
        await self._commit(finish)

    async def _line_too_long(self, line: LineTooLong, *, replaying: bool) -> None:
        self._warnings.warning(str(line))
        turn = self._turn
        if turn is None or turn.fail_with is not None:
            return
        # The line may have been the turn's end or an answer: the turn cannot be followed.
        turn.fail_with = (
            f"{self.spec.provider} wrote a stdout line of {line.length} bytes, over t3d's limit of "
            f"{line.limit} bytes; t3d could not read it and stopped the turn",
            "provider_line_too_long",
        )
        if not replaying:  # else once the replay is through
            await self._stop_turn(turn)

    async def _stop_turn(self, turn: TurnMapper) -> None:
        """Interrupt a turn the daemon gave up on; stop the process if Codex has not named it."""
        await self._send_interrupt(turn)
        if self._proc is not None and turn.codex_turn_id is None:
            await stop_child(self._proc.process, grace=2.0)  # nothing to interrupt yet

    async def _apply(self, turn: TurnMapper, change: Change, *, replaying: bool = False) -> None:
        if isinstance(change, ItemChanged):
            await self._item_changed(turn.turn_id, change.item, final=change.final, replaying=replaying)
        elif isinstance(change, PermissionAsked):
            await self._flush_held()
            # Scoped by turn like item ids: Codex's request ids count from 0 per process.
            request_id = f"{turn.turn_id}:{change.request_id}"
            self._requests[request_id] = change.request
            command = c.OpenRequest(turn.turn_id, request_id, "permission", change.item, change.data)
            denied = await open_request(self._commit, command, self._warnings)
            if denied is not None:  # over the turn's bound: not opened, Codex told at once
                self._requests.pop(request_id, None)
                line = encode_result(change.request.id, approval_result(change.request, "deny", denied))
                if self._peer is not None:
                    await self._auto_answer(self._peer, change.request.id, line, replaying)
        elif isinstance(change, TurnEnded):
            await self._flush_held()
            await self._end_turn(change, turn, acked=True)

    async def _end_turn(self, ended: TurnEnded, turn: TurnMapper, *, acked: bool = False) -> None:
        """End the turn once; with ``acked`` (Codex's own end of it), tell the spawner its
        output is settled once the end has committed."""
        if self._turn is not turn:
            return  # it ended already: one terminal record per turn
        self._turn = None
        self._idle_since = trio.current_time()  # idle from now, not from the previous turn's end
        self._retrying_since = None
        if turn.codex_turn_id is not None:
            self._done_turns.append(turn.codex_turn_id)
        if turn.usage_total is not None:
            self._usage_total = turn.usage_total
        for child in self._collab.open_children():  # the domain ends their turns with this one
            if child.over is None and ended.status == "completed":
                self._warnings.warning(f"agent {child.codex_thread_id} had not finished when turn {turn.turn_id} ended; its thread {child.thread_id} ends with the turn")
            await self._close_items(child.mapper)
            if child.over is not None:  # Codex said it completed; its own end never came
                await self._commit(child.over)
        for thread_id, count in self._collab.reset().items():
            self._warnings.warning(f"Codex thread {thread_id!r} is no agent of turn {turn.turn_id}: {count} line(s) of it were dropped")
        await self._close_items(turn)
        await self._commit(c.FinishTurn(turn.turn_id, ended.status, ended.error, ended.reason, ended.usage, None))
        self._requests.clear()
        self._items.reset()
        self._warnings.flush()
        self._notes.flush()
        peer = self._peer
        if acked and peer is not None:
            await self._tell_spawner(peer, peer.proc.output.offset)

    async def _close_items(self, mapper: TurnMapper) -> None:
        items = closing(mapper, self._clock())
        self._items.forget(item.id for item in items)
        if items:
            await self._commit(c.RecordItems(mapper.turn_id, items))

    # --- commits ---------------------------------------------------------------------------

    async def _flush_held(self) -> None:
        """Write the item states a replay held back (`HELD_BATCH` per command)."""
        turn = self._turn
        held, self._held = self._held, {}
        if turn is None or not held:
            return
        for turn_id, items in by_turn(held.values()).items():  # the turn's own, and its agents'
            for start in range(0, len(items), HELD_BATCH):
                await self._commit(c.RecordItems(turn_id, tuple(items[start : start + HELD_BATCH])))



def _turn_of(result: object) -> str | None:
    turn = result.get("turn") if isinstance(result, dict) else None
    turn_id = turn.get("id") if isinstance(turn, dict) else None
    return turn_id if isinstance(turn_id, str) else None

