"""The Claude session driver: one long-lived CLI process per thread, on Trio.

Theory of operation: `ClaudeSession.run` consumes the thread's inbox of
domain effects (start a turn, interrupt it, answer a prompt, stop). The
process is started on the first turn (with ``--resume`` when the thread has a
resumable native session) and kept for later turns. One reader task per
process cuts stdout into lines, parses them (sans-IO core), maps them onto
domain changes (`TurnMapper`) and writes them through the session's
`WritePipeline`, in order, a bounded number in flight: while the writer is
behind, the reader stops reading and the CLI blocks on its pipe
(backpressure, no unbounded buffer).

Rules:
- Streaming text is coalesced (`ItemCoalescer`): at most one `item.updated`
  per item per `COALESCE_S`, plus the item's final state.
- A stop always completes: an interrupt the CLI does not honour within the
  interrupt timeout stops the process and the turn ends ``interrupted``.
- A process that exits or crashes mid-turn ends the turn ``failed`` with the
  stderr tail; the next turn starts a new process. Its exit is what ends the turn,
  not EOF on a pipe a grandchild may hold (`ProviderOutput`).
- A turn whose CLI sends nothing for the silence timeout (no prompt pending) fails
  (``provider_silent``) and the process is stopped.
- Across a daemon restart (`Reattach`): before a turn's prompt is written, the
  spawner is told the turn and its stdout offset (`Child.ack`, with ``meta``);
  after the turn's end has committed, its output is acked. A session that detaches
  at shutdown stops reading, lets its writes commit and leaves the process running;
  the next daemon's session replays the open turn's output from its start (item
  upserts make what was committed already a no-op), writing item states only once
  per item until the replay is through, re-sends an answer the CLI may not have
  received, and reads on live.
- Output with no turn open (a background task woke the agent) opens a turn started by
  the provider; task lines keep background task items; a steered message is written at
  once (`BackgroundWork`, background.py).
- A foreground subagent (an ``Agent`` call) is a child thread (`Subagents`,
  subagents.py): its lines (``parent_tool_use_id``) are items of the child's turn and its
  prompts are shown there; the call's result ends the child. A line naming a call that
  started no subagent is logged and dropped (a prompt is shown in the turn instead, so it
  is still answered); children still open when the turn ends end with it.
- Bad provider lines are logged rate-limited (`LogLimiter`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.errors import ProtocolError, ProviderError, SpawnerError
from t3d.providers.claude import events as ce
from t3d.providers.claude.adapter import (
    Change,
    ItemChanged,
    PermissionAsked,
    SessionSeen,
    TurnEnded,
    TurnMapper,
)
from t3d.providers.claude.background import BackgroundWork, opens_turn, subagent_of
from t3d.providers.claude.encode import (
    build_argv,
    encode_answer,
    encode_control_error,
    encode_interrupt,
    encode_permission_deny,
    encode_user_message,
)
from t3d.providers.claude.process import ClaudeProcess
from t3d.providers.claude.protocol import decode_line, parse_value, streamed_text
from t3d.providers.claude.resume import ResumeAfterRestart
from t3d.providers.claude.subagents import Child as SubagentChild
from t3d.providers.claude.subagents import Subagents, is_subagent_call
from t3d.providers.claude.tasks import TASK_EVENTS
from t3d.providers.coalesce import ItemCoalescer, Settling
from t3d.providers.lines import LineTooLong
from t3d.providers.log_limit import LogLimiter
from t3d.providers.prompts import open_request
from t3d.providers.reattach import Reattach
from t3d.providers.session_base import EXIT_RECORD_S
from t3d.providers.silence import Quiet, watch_silence
from t3d.spawn.child import Child, Spawner, stop_child

log = logging.getLogger("t3d.providers.claude")

BeforeTurn = Callable[[str, int, str], Awaitable[None]]

# A provider that takes no input for this long is treated as hung.
SEND_TIMEOUT_S = 30.0
# Turn ids a session remembers having started (to drop a stale start effect).
KNOWN_TURNS = 16


@attrs.frozen
class SessionSpec:
    """Everything needed to start this thread's provider process."""

    thread_id: str
    provider: str
    argv: tuple[str, ...]  # the binary (and interpreter), before the protocol flags
    cwd: str
    env: Mapping[str, str]
    model: str | None
    permission_mode: str | None
    resume: str | None
    interrupt_timeout: float
    # Seconds a process may sit with no turn before it is stopped (0 = never); the next
    # turn starts a new one with --resume, so an idle thread costs no process.
    idle_timeout: float = 0.0
    # Ask the spawner for a transient systemd scope per process (used where systemd works).
    scopes: bool = False
    # Awaited before each turn reaches the provider: (thread_id, turn ordinal, cwd).
    before_turn: BeforeTurn | None = None
    # Seconds a turn's provider may send nothing (no prompt pending) before it is
    # stopped and the turn fails (0 = never).
    silence_timeout: float = 0.0


class ClaudeSession(ResumeAfterRestart, BackgroundWork):
    def __init__(
        self,
        spec: SessionSpec,
        write: Callable[[c.Command], Awaitable[object]],
        spawner: Spawner,
        clock: Callable[[], float],
        *,
        writes: Settling | None = None,
    ) -> None:
        self.spec = spec
        self._clock = clock
        ResumeAfterRestart.__init__(self)
        BackgroundWork.__init__(self)
        # Every write of this session, in order (a `WritePipeline`: updates are not waited
        # for one by one; a turn's end or a request waits for the updates before it).
        self._write = write
        self._spawner = spawner
        self._clock = clock
        self._proc: ClaudeProcess | None = None
        self._turn: TurnMapper | None = None
        # Open prompts: domain request id -> (the CLI's request id, what answering needs).
        self._requests: dict[str, tuple[str, dict[str, Any]]] = {}
        self._resume = spec.resume
        self._native_seen: str | None = None
        self._items = ItemCoalescer(self._record_items, writes)
        self._subagents = Subagents(clock)
        self._control_ids = 0
        self._idle_since = math.inf
        self._warnings = LogLimiter(log, f"thread {spec.thread_id}")
        # Turns this session has started or taken over (a stale start effect is dropped).
        self._known_turns: deque[str] = deque(maxlen=KNOWN_TURNS)
        # Since when the running turn has waited for the provider (silence timeout).
        self._quiet_since = math.inf
        self._detaching = False
        # The session is ending (stopped, detached, cancelled): output that would open a turn
        # is not recorded now (a detached agent's is the next daemon's to replay).
        self._stopping = False
        self._inbox_scope = trio.CancelScope()
        # Asked when the session is cancelled (the daemon is stopping): leave the process
        # running for the next daemon (if it can outlive this one) instead of stopping it.
        self.detach_on_cancel: Callable[[], bool] = lambda: False

    # --- the inbox ---------------------------------------------------------------------

    async def run(self, inbox: trio.MemoryReceiveChannel[ev.Effect], reattach: Reattach | None = None) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._items.run)
            if self.spec.idle_timeout > 0:
                nursery.start_soon(self._run_idle_stopper)
            if self.spec.silence_timeout > 0:
                nursery.start_soon(self._run_silence_watch)
            try:
                with self._inbox_scope:
                    await self._serve_inbox(nursery, inbox, reattach)
            except trio.Cancelled:
                if self._proc is not None and self._proc.process.detachable and self.detach_on_cancel():
                    self._detaching = True
                raise
            finally:
                self._stopping = True  # no wake opens from here on (`_on_line`)
                proc = self._proc
                if proc is not None and self._detaching:
                    await self._let_go(proc)
                elif proc is not None:
                    await proc.stop()
                    with trio.CancelScope(shield=True), trio.move_on_after(EXIT_RECORD_S):
                        await proc.exit_handled.wait()  # its reader records the exit first
                await self._settle_idle_stop()
                self._warnings.flush()
                nursery.cancel_scope.cancel()

    def detach(self) -> None:
        """Stop at once, leaving the process running for the next daemon (if it can
        outlive this one: `Child.detachable`; else it is stopped). What was read is
        committed; the open turn is the next daemon's to replay."""
        proc = self._proc
        self._detaching = proc is not None and proc.process.detachable
        self._inbox_scope.cancel()

    async def _let_go(self, proc: ClaudeProcess) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(EXIT_RECORD_S):
            proc.detaching = True
            await proc.output.stop()
            await proc.exit_handled.wait()
            if self._turn is None:  # between turns everything read is settled: no replay
                settled = proc.output.offset if proc.dropped_at is None else proc.dropped_at
                with contextlib.suppress(SpawnerError):
                    await proc.process.ack(settled, self._meta(proc))
        proc.process.detach()
        log.info("thread %s: left its %s process (pid %d) running", self.spec.thread_id, self.spec.provider, proc.process.pid)

    async def admit(self, effect: ev.StartProviderTurn) -> bool:
        """A turn the provider started may run (admission let it): no prompt is written.
        Called by the supervisor directly, not through the inbox, so a reader waiting for it
        never waits behind the inbox. False: this session never opened that turn."""
        if effect.turn_id not in self._known_turns:
            return False
        self._admit_wake(effect.turn_id)
        return True

    async def _start_turn(self, nursery: trio.Nursery, effect: ev.StartProviderTurn) -> None:
        if effect.provider_started:  # a wake's admission (normally through `admit`)
            self._admit_wake(effect.turn_id)
            return
        if effect.turn_id in self._known_turns:  # started already (an effect of the last daemon)
            return
        if self._turn is not None:
            # The provider started a turn of its own before this one reached it: the domain
            # put this one back in the queue, and starts it again after that turn's end.
            log.info("thread %s: turn %s waits for the provider's own turn %s", self.spec.thread_id, effect.turn_id, self._turn.turn_id)
            return
        self._known_turns.append(effect.turn_id)
        self._tasks.clear_wake()
        self._tasks.last_turn_id = effect.turn_id
        self._turn = TurnMapper(self.spec.thread_id, effect.turn_id, self._clock)
        self._quiet_since = trio.current_time()
        if self.spec.before_turn is not None:  # the checkpoint baseline: before any edit
            await self.spec.before_turn(self.spec.thread_id, effect.ordinal, self.spec.cwd)
        try:
            if self._proc is None:
                self._proc = await self._start_process(nursery)
            proc = self._proc
            # Shielded: a detach must not come between telling the spawner which turn the
            # output is for and writing the prompt (the next daemon trusts the first).
            with trio.CancelScope(shield=True):
                offset = proc.output.offset
                proc.turn_id, proc.turn_offset, proc.steers = effect.turn_id, offset, 0
                await proc.process.ack(offset, self._meta(proc))
                await self._send(encode_user_message(effect.text, self._native_seen or ""))
        except (SpawnerError, ProviderError) as exc:
            await self._end_turn(
                TurnEnded(
                    "failed", f"{self.spec.provider}: {exc}", "provider_start_failed", None, None
                )
            )
            return
        await self._commit(c.MarkTurnRunning(effect.turn_id))

    async def _interrupt(self, nursery: trio.Nursery, effect: ev.InterruptProviderTurn) -> None:
        turn = self._turn
        if turn is None or turn.turn_id != effect.turn_id or self._proc is None:
            return
        self._cancel_wake(effect.turn_id)  # cancelled while it waited to start
        turn.interrupt_requested = True
        self._control_ids += 1
        # If the process is going away, its exit ends the turn.
        with contextlib.suppress(ProviderError):
            await self._send(encode_interrupt(f"t3d_interrupt_{self._control_ids}"))
        nursery.start_soon(self._escalate_interrupt, turn, self._proc)

    async def _escalate_interrupt(self, turn: TurnMapper, proc: ClaudeProcess) -> None:
        await trio.sleep(self.spec.interrupt_timeout)
        if self._turn is turn and self._proc is proc:
            log.warning(
                "thread %s: interrupt not honoured in %gs; stopping the provider",
                self.spec.thread_id,
                self.spec.interrupt_timeout,
            )
            proc.forced_stop = True
            await stop_child(proc.process, grace=2.0)

    async def _answer(self, effect: ev.AnswerProviderRequest) -> None:
        request = self._requests.pop(effect.request_id, None)
        if request is None or self._proc is None:
            return
        self._quiet_since = trio.current_time()
        with contextlib.suppress(ProviderError):
            await self._send(encode_answer(*request, effect.decision, effect.message))

    async def force_stop(self, grace: float) -> int | None:
        """Kill the provider's process group (TERM, ``grace`` seconds, KILL) and wait until
        its exit is recorded; the running turn ends ``cancelled`` (``force_stop``). Returns
        the exit status, or None when no process runs. Bounded."""
        proc = self._proc
        if proc is None:
            return None
        proc.force_stopped = True
        if self._pending_wake is not None:  # its reader waits for admission: let it read the end
            self._wake_admitted.set()
        code = await stop_child(proc.process, grace=grace)
        with trio.CancelScope(shield=True), trio.move_on_after(EXIT_RECORD_S):
            await proc.exit_handled.wait()
        return code

    @property
    def process(self) -> Child | None:
        """The running provider process, if any."""
        return None if self._proc is None else self._proc.process

    # --- the process -------------------------------------------------------------------

    def _argv(self) -> list[str]:
        binary, *prefix_args = self.spec.argv
        argv = build_argv(
            binary,
            model=self.spec.model,
            permission_mode=self.spec.permission_mode,
            resume=self._resume,
        )
        return [argv[0], *prefix_args, *argv[1:]]

    def _meta(self, proc: ClaudeProcess) -> dict[str, Any]:
        """What the next daemon needs to know of this process (`Reattach`)."""
        return {
            "thread_id": self.spec.thread_id,
            "provider": self.spec.provider,
            "session_id": proc.session_id,
            "started_at": proc.started_at,
            "turn_id": proc.turn_id,
            "turn_offset": proc.turn_offset,
            "native_session_id": self._native_seen,
            "cost_so_far": proc.cost_so_far,
            "steers": proc.steers,
        }

    async def _start_process(self, nursery: trio.Nursery) -> ClaudeProcess:
        session_id = uuid.uuid4().hex
        scope = _scope_unit(self.spec.thread_id, session_id) if self.spec.scopes else None
        started_at = self._clock()
        meta = {"thread_id": self.spec.thread_id, "provider": self.spec.provider, "session_id": session_id, "started_at": started_at}
        process = await self._spawner.spawn(
            self._argv(),
            cwd=self.spec.cwd,
            env=self.spec.env,
            tag=f"thread {self.spec.thread_id}",
            scope=scope,
            meta=meta,
        )
        proc = ClaudeProcess(process, session_id, started_at)
        await self._record_session(proc, status="running")
        nursery.start_soon(proc.read_stderr)
        nursery.start_soon(self._read_stdout, proc)
        return proc

    async def _send(self, line: bytes) -> None:
        assert self._proc is not None
        try:
            with trio.fail_after(SEND_TIMEOUT_S):
                await self._proc.process.stdin.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ProviderError(
                f"{self.spec.provider} is not accepting input (its process has exited)"
            ) from exc
        except trio.TooSlowError as exc:
            raise ProviderError(
                f"{self.spec.provider} has not read its input for {SEND_TIMEOUT_S:g} s; "
                "it looks hung: archive the thread or start a new turn to restart it"
            ) from exc

    async def _run_idle_stopper(self) -> None:
        """Stop a process that has had no turn for `idle_timeout` seconds."""
        while True:
            await trio.sleep(min(self.spec.idle_timeout / 4, 30.0))
            proc = self._proc
            idle_for = trio.current_time() - self._idle_since
            if proc is None or self._turn is not None or idle_for < self.spec.idle_timeout:
                continue
            if self._tasks.running():  # its background work would die with it
                continue
            log.info(
                "thread %s: stopping its idle %s process", self.spec.thread_id, self.spec.provider
            )
            self._proc = None  # the next turn starts a new process (with --resume)
            await self._stop_idle(proc)

    async def _run_silence_watch(self) -> None:
        """Stop the process of a turn that has had no output for `silence_timeout` seconds
        while no prompt waits for the user (`watch_silence`)."""
        await watch_silence(self.spec.provider, self.spec.silence_timeout, log, f"thread {self.spec.thread_id}", self._quiet)

    def _quiet(self) -> Quiet | None:
        proc, turn = self._proc, self._turn
        if proc is None or turn is None or self._requests or self._pending_wake:
            return None
        return Quiet(proc, turn.turn_id, self._quiet_since)

    async def _read_stdout(self, proc: ClaudeProcess) -> None:
        try:
            await proc.output.run(functools.partial(self._on_line, proc))
            if not proc.detaching:
                await self._on_exit(proc, await proc.wait_exit())
        finally:
            proc.exit_handled.set()

    async def _on_exit(self, proc: ClaudeProcess, code: int) -> None:
        if self._proc is proc:
            self._proc = None
        stderr = proc.stderr_text()
        turn = None if proc.detached else self._turn
        ended = None if turn is None else proc.exit_outcome(self.spec, code, stderr, turn)
        if ended is not None:
            self._adopt_native(ended)  # before the exit record, which stores it
            await self._flush_held()
        await self._record_session(
            proc, status="exited", exit_code=code, stderr_tail=stderr or None
        )
        if ended is not None:
            await self._end_turn(ended)
        await self._stop_tasks(f"{self.spec.provider}'s process exited (status {code}), and its background tasks with it")

    # --- lines → domain ------------------------------------------------------------------

    async def _on_line(self, proc: ClaudeProcess, line: bytes | LineTooLong) -> None:
        line_start, proc.line_start = proc.line_start, proc.output.offset
        if proc.output.offset <= proc.skip_until:
            return  # replayed output from before the turn (or all of it, between turns)
        if isinstance(line, LineTooLong):
            self._warnings.warning(str(line))
            if self._turn is not None and proc.line_too_long is None:
                # The line may have been the turn's end or a prompt: the turn cannot be
                # followed, so it fails (at the exit) instead of running on forever.
                proc.line_too_long = line
                await stop_child(proc.process, grace=2.0)
            return
        try:
            value = decode_line(line)
            turn = self._turn
            # The hot path (most lines are the main agent's text deltas): no event object,
            # straight to the item. Whatever the slow path below would do otherwise with a
            # delta (results to skip, a discarded turn, held replay items, a subagent's
            # line: `streamed_text` is None for those) takes the slow path.
            if (
                turn is not None
                and not turn.discard
                and not self._held
                and not proc.skip_results
                and not proc.output.replaying
                and (delta := streamed_text(value)) is not None
            ):
                await self._items.stream(turn.stream_delta(*delta))
                return
            event = parse_value(value, line)
        except ProtocolError as exc:
            self._warnings.warning(f"ignored a provider line: {exc}")
            return
        if proc.skip_results:  # the end of a turn recorded already (`Reattach`)
            if isinstance(event, ce.TurnResult):
                proc.skip_results -= 1
            return
        if isinstance(
            event, ce.ControlRequested
        ):  # a request we do not serve: answer so it never hangs
            await self._send_quietly(
                encode_control_error(event.request_id, f"t3d does not support {event.subtype!r}")
            )
            return
        if isinstance(event, TASK_EVENTS):
            if isinstance(event, ce.TaskStarted):
                self._subagents.see_task(event)
            self._tasks.defer_agents = bool(self._subagents.open_children())
            await self._on_task(event)
            return
        parent = subagent_of(event)
        if parent is not None and await self._on_subagent_line(event, parent):
            return
        if self._turn is None:
            if not opens_turn(event):
                return
            if self._stopping:
                if proc.dropped_at is None:  # not acked at detach: the next daemon replays it
                    proc.dropped_at = line_start
                    log.info("thread %s: %s wrote a turn of its own while the session stops; not recorded now", self.spec.thread_id, self.spec.provider)
                return
            await self._open_wake(proc, line_start)
            if self._turn is None:
                return
        turn = self._turn
        mapper = turn
        if parent is not None:
            child = self._subagent_of(event, parent)
            if child is not None:
                mapper = child.mapper
            elif not isinstance(event, ce.PermissionRequested):  # a prompt is still shown (and answered)
                if not turn.discard:
                    self._warnings.warning(f"a {type(event).__name__} line names tool call {parent!r}, which started no subagent of turn {turn.turn_id}; dropped")
                return
        if isinstance(event, ce.AssistantMessage):
            for block in event.blocks:
                if isinstance(block, ce.ToolUseBlock):
                    started = self._tasks.see_tool(turn.turn_id, block, parent)
                    if started is not None and not turn.discard:
                        await self._record_tasks(list(started.items))
            if not turn.discard:
                await self._open_subagents(mapper, event)
        replaying = proc.output.replaying
        if replaying and isinstance(event, ce.UserMessage):
            self._progressed.update(result.tool_use_id for result in event.tool_results)
        elif not replaying and self._held:
            await self._flush_held()
        for change in mapper.feed(event):
            if turn.discard and not isinstance(change, TurnEnded):
                continue  # a turn cancelled before it started: read to its end, not recorded
            if mapper is not turn and isinstance(change, TurnEnded | SessionSeen):
                continue  # a subagent's line never ends the turn
            await self._apply(change, mapper, replaying=replaying)
        if isinstance(event, ce.UserMessage) and event.tool_results and not turn.discard:
            await self._end_subagents(mapper, event)

    # --- subagents ---------------------------------------------------------------------------

    def _subagent_of(self, event: object, parent: str) -> SubagentChild | None:
        if isinstance(event, ce.PermissionRequested):
            return self._subagents.asking(event)
        child = self._subagents.child(parent)
        if child is not None and isinstance(event, ce.AssistantMessage):
            self._subagents.see_tools(child, event)
        return child

    async def _open_subagents(self, mapper: TurnMapper, event: ce.AssistantMessage) -> None:
        """Open a child thread for each subagent call on the line, before the call's item
        (which links to the child) is recorded."""
        for block in event.blocks:
            if not isinstance(block, ce.ToolUseBlock) or not is_subagent_call(block):
                continue
            command, why = self._subagents.start(mapper, block)
            if why is not None:
                self._warnings.warning(why)
            if command is None:
                continue
            await self._flush_held()
            if not await self._commit_checked(command):
                self._subagents.refused(block.tool_use_id)
                self._warnings.warning(f"subagent call {block.tool_use_id} was not opened as a thread; its lines are dropped")

    async def _end_subagents(self, mapper: TurnMapper, event: ce.UserMessage) -> None:
        """The results of subagent calls end their children (failed if the result is an error)."""
        for result in event.tool_results:
            done = self._subagents.finish(mapper, result)
            if done is None:
                continue
            child, finish = done
            await self._flush_held()
            await self._close_items(child.mapper)
            await self._commit(finish)

    async def _close_items(self, mapper: TurnMapper) -> None:
        """Items of ``mapper``'s turn still streaming or running end with it (a prompt stays
        as its request leaves it)."""
        closing = tuple(
            attrs.evolve(
                i,
                status="completed" if i.status == "streaming" else "failed",
                updated_at=self._clock(),
            )
            for i in mapper.open_items()
            if i.kind != "approval_request"
        )
        self._items.forget(item.id for item in closing)
        if closing:
            await self._commit(c.RecordItems(mapper.turn_id, closing))

    async def _send_quietly(self, line: bytes) -> None:
        with contextlib.suppress(ProviderError):
            await self._send(line)

    async def _apply(self, change: Change, mapper: TurnMapper | None = None, *, replaying: bool = False) -> None:
        turn = mapper or self._turn  # the turn the change is in: the open one, or a subagent's
        assert turn is not None
        if isinstance(change, ItemChanged):
            await self._item_changed(turn.turn_id, change.item, final=change.final, replaying=replaying)
        elif isinstance(change, PermissionAsked):
            await self._flush_held()
            # Scoped by turn like item ids: the CLI's ids are unique per process only in
            # practice, and a replayed (or looping) recording repeats them.
            request_id = f"{turn.turn_id}:{change.request_id}"
            self._requests[request_id] = (change.request_id, change.data)
            denied = await open_request(
                self._commit, c.OpenRequest(turn.turn_id, request_id, "permission", change.item, change.data), self._warnings
            )
            if denied is not None:  # over the turn's bound: not opened, the CLI told at once
                self._requests.pop(request_id, None)
                await self._send_quietly(encode_permission_deny(change.request_id, denied))
        elif isinstance(change, SessionSeen):
            self._native_seen = change.native_session_id
        elif isinstance(change, TurnEnded):
            await self._flush_held()
            await self._end_turn(change, acked=True)

    def _adopt_native(self, ended: TurnEnded) -> bool:
        """Resume the CLI's session from now on if this turn got an answer; True if that is news."""
        if ended.status not in ("completed", "interrupted") or not self._native_seen:
            return False  # only a session that answered is worth resuming
        if self._native_seen == self._resume:
            return False
        self._resume = self._native_seen
        return True

    async def _end_turn(self, ended: TurnEnded, *, acked: bool = False) -> None:
        """End the turn; with ``acked`` (the CLI's own end of it), tell the spawner its
        output is settled once the end has committed."""
        turn = self._turn
        if turn is None:
            return
        if turn.steers_pending and ended.status != "completed":
            self._orphan_steers += turn.steers_pending  # the CLI may still run them
        if turn.discard:  # cancelled before it started: its end is recorded already
            self._turn_over(turn)
            await self._ack_end(turn, acked)
            return
        proc = self._proc
        cost = None
        if ended.total_cost_usd is not None and proc is not None:  # the CLI reports a running total
            cost = max(0.0, ended.total_cost_usd - proc.cost_so_far)
            proc.cost_so_far = ended.total_cost_usd
        if self._adopt_native(ended) and proc is not None:
            # Stored now, not at exit: a daemon stopped mid-session never records an exit.
            await self._record_session(proc, status="running")
        for child in self._subagents.open_children():  # the domain ends their turns with this one
            if ended.status == "completed":
                self._warnings.warning(f"subagent call {child.tool_use_id} had no result when turn {turn.turn_id} ended; its thread {child.thread_id} ends with the turn")
            await self._close_items(child.mapper)
        await self._close_items(turn)
        # Over before its end commits: the next turn may start as soon as it has (the
        # commit starts it), and must find the session free.
        self._turn_over(turn)
        await self._commit(
            c.FinishTurn(turn.turn_id, ended.status, ended.error, ended.reason, ended.usage, cost)
        )
        await self._ack_end(turn, acked)

    def _turn_over(self, turn: TurnMapper) -> None:
        if self._turn is turn:
            self._turn = None
        self._idle_since = trio.current_time()
        self._requests.clear()
        self._tasks.forget_settled_calls()
        self._subagents.reset()
        self._progressed.clear()
        self._items.reset()
        self._warnings.flush()

    async def _ack_end(self, turn: TurnMapper, acked: bool) -> None:
        """The CLI ended the turn and its end has committed: its output is settled, unless
        the next turn took the process over meanwhile (its own ack settles it)."""
        proc = self._proc
        if not acked or proc is None or proc.turn_id != turn.turn_id:
            return
        # Between turns now: what follows in the output is no turn's (a wake, if any).
        proc.turn_id, proc.turn_offset, proc.steers = None, proc.output.offset, 0
        with contextlib.suppress(SpawnerError):
            await proc.process.ack(proc.output.offset, self._meta(proc))

    # --- commits ---------------------------------------------------------------------------



def _scope_unit(thread_id: str, session_id: str) -> str:
    """A systemd unit name for one provider process: names its thread, unique per process."""
    safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_-") else "_" for ch in thread_id)
    return f"t3d-agent-{safe[:64]}-{session_id[:8]}"
