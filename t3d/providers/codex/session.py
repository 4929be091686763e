"""The Codex session driver: one long-lived ``codex app-server`` process per thread, on Trio.

Theory of operation: `CodexSession.run` consumes the thread's inbox of domain
effects (start a turn, interrupt it, answer a prompt, stop), like the Claude
driver. The process is started on the first turn and kept for later turns:
``initialize``, ``initialized``, then ``thread/start`` (or ``thread/resume`` of
the thread's native session, the Codex thread id, after an idle stop or a
daemon restart), then one ``turn/start`` per turn. One reader task per process
cuts stdout into lines, parses them (sans-IO core), hands responses to the
request that waits for them, answers Codex's requests, maps the thread's
notifications onto domain changes (`TurnMapper`) and writes them through the
session's `WritePipeline`, in order and with backpressure.

Process model: the app-server multiplexes threads by thread id, so one
process could serve every thread. t3d runs one per thread anyway, because the
supervisor's guarantees are per process: a force stop kills one thread's
process group and leaves the others alone, a crash fails only that thread's
turn, memory pressure names the heaviest agent by its thread, an idle thread
costs no process, and each agent gets its own systemd scope. The cost,
measured with codex-cli 0.171.0 (Linux x64, an idle thread, 5 sessions): the
npm ``codex`` launcher is a node process (43 MiB RSS) running the native
binary (126 MiB RSS, mostly shared pages), about 170 MiB RSS and 54 MiB PSS
per session; pointing ``--codex-bin`` at the native binary
(``…/@openai/codex-linux-x64/vendor/…/bin/codex``) saves the node process:
126 MiB RSS, 40 MiB PSS. Ten threads in one process took no more memory than
one (under 1 MiB each). The replay fake (``replay-codex``) is one Python
process of about 17 MiB RSS per session.

Rules:
- Every request the session sends waits at most `CALL_TIMEOUT_S` for its
  answer; a process that dies fails every request in flight.
- Every server request is answered: approvals with the user's decision, any
  other with a JSON-RPC error, so Codex never waits on t3d.
- Streaming text is coalesced (`ItemCoalescer`), as for Claude.
- A stop always completes: an interrupt Codex does not honour within the
  interrupt timeout stops the process and the turn ends ``interrupted``.
- A turn in which Codex only retries (``error`` with ``willRetry``) for
  ``retry_timeout`` seconds is interrupted and fails with Codex's last message.
- A stdout line over the line limit cannot be read, so its turn is stopped and
  fails saying so; a malformed line is skipped.
- A process that exits mid-turn ends the turn ``failed`` with the stderr tail;
  the next turn starts a new process, which resumes the thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

import t3d
from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.model import ProviderSession, TurnItem
from t3d.errors import ProtocolError, ProviderError, SpawnerError
from t3d.providers.claude.process import ClaudeProcess as CliProcess
from t3d.providers.claude.session import SessionSpec
from t3d.providers.coalesce import ItemCoalescer
from t3d.providers.codex import events as ce
from t3d.providers.codex.adapter import (
    Change,
    ItemChanged,
    PermissionAsked,
    TurnEnded,
    TurnMapper,
)
from t3d.providers.codex.encode import (
    approval_result,
    build_argv,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
    initialize_params,
    thread_resume_params,
    thread_start_params,
    turn_interrupt_params,
    turn_start_params,
)
from t3d.providers.codex.protocol import ClientCalls, parse_line
from t3d.providers.lines import LineBuffer, LineTooLong
from t3d.spawn.child import Child, Spawner, stop_child

log = logging.getLogger("t3d.providers.codex")

# A provider that takes no input for this long is treated as hung.
SEND_TIMEOUT_S = 30.0
# How long a request to Codex (initialize, thread/start, turn/start) may go unanswered.
CALL_TIMEOUT_S = 60.0
# How long a stopping session waits for its process's exit to be recorded.
EXIT_RECORD_S = 5.0
# Codex turn ids of finished turns, whose late notifications are ignored.
DONE_TURNS = 32
CLIENT_NAME = "t3d"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class CodexRefused(ProviderError):
    """Codex answered a request with a JSON-RPC error; the message is Codex's."""

    def __init__(self, method: str, message: str) -> None:
        super().__init__(message)
        self.method = method
        self.message = message


@attrs.define
class _Call:
    """A request waiting for its response."""

    method: str
    done: trio.Event = attrs.Factory(trio.Event)
    result: Any = None
    error: ProviderError | None = None


@attrs.define
class _Peer:
    """The requests in flight to one app-server process: its ids, and who waits for which."""

    calls: ClientCalls = attrs.Factory(ClientCalls)
    waiting: dict[ce.RequestId, _Call] = attrs.Factory(dict)


def _stderr_detail(stderr: str) -> str | None:
    lines = [line.strip() for line in _ANSI.sub("", stderr).splitlines() if line.strip()]
    return lines[-1] if lines else None


class CodexSession:
    def __init__(
        self,
        spec: SessionSpec,
        write: Callable[[c.Command], Awaitable[None]],
        spawner: Spawner,
        clock: Callable[[], float],
        *,
        retry_timeout: float = 60.0,
    ) -> None:
        self.spec = spec
        self._write = write
        self._spawner = spawner
        self._clock = clock
        self._retry_timeout = retry_timeout
        self._proc: CliProcess | None = None
        # Per process (an idle process on its way out must not answer the next one's calls).
        self._peers: dict[CliProcess, _Peer] = {}
        self._thread_id: str | None = None  # the Codex thread of the running process
        self._resume = spec.resume  # the Codex thread to resume when a process starts
        self._turn: TurnMapper | None = None
        # Open prompts: domain request id -> Codex's request (what answering needs).
        self._requests: dict[str, ce.ApprovalRequested] = {}
        self._usage_total: ce.Usage | None = None  # Codex's thread total, this process
        self._done_turns: deque[str] = deque(maxlen=DONE_TURNS)
        self._items = ItemCoalescer(self._record_items)
        self._idle_since = math.inf
        self._retrying_since: float | None = None

    # --- the inbox ---------------------------------------------------------------------

    async def run(self, inbox: trio.MemoryReceiveChannel[ev.Effect]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._items.run)
            if self.spec.idle_timeout > 0:
                nursery.start_soon(self._run_idle_stopper)
            if self._retry_timeout > 0:
                nursery.start_soon(self._run_retry_watch, nursery)
            try:
                async for effect in inbox:
                    if isinstance(effect, ev.StartProviderTurn):
                        await self._start_turn(nursery, effect)
                    elif isinstance(effect, ev.InterruptProviderTurn):
                        await self._interrupt(nursery, effect)
                    elif isinstance(effect, ev.AnswerProviderRequest):
                        await self._answer(effect)
                    elif isinstance(effect, ev.StopProviderSession):
                        break
            finally:
                proc = self._proc
                if proc is not None:
                    await proc.stop()
                    with trio.CancelScope(shield=True), trio.move_on_after(EXIT_RECORD_S):
                        await proc.exit_handled.wait()
                nursery.cancel_scope.cancel()

    async def _start_turn(self, nursery: trio.Nursery, effect: ev.StartProviderTurn) -> None:
        if self._turn is not None:  # the domain runs one turn at a time; never overlap
            log.warning(
                "thread %s: turn %s started while %s runs",
                self.spec.thread_id,
                effect.turn_id,
                self._turn.turn_id,
            )
        turn = TurnMapper(self.spec.thread_id, effect.turn_id, self._clock, self._usage_total)
        self._turn = turn
        self._retrying_since = None
        if self.spec.before_turn is not None:  # the checkpoint baseline: before any edit
            await self.spec.before_turn(self.spec.thread_id, effect.ordinal, self.spec.cwd)
        try:
            if self._proc is None:
                await self._start_process(nursery)
            assert self._thread_id is not None
            result = await self._call("turn/start", turn_start_params(self._thread_id, effect.text))
        except (SpawnerError, ProviderError) as exc:
            await self._end_turn(self._start_failure(exc), turn)
            return
        turn_info = result.get("turn") if isinstance(result, dict) else None
        codex_turn = turn_info.get("id") if isinstance(turn_info, dict) else None
        if isinstance(codex_turn, str) and codex_turn:
            turn.codex_turn_id = codex_turn
        if self._turn is not turn:
            return  # it ended meanwhile (the process exited)
        await self._commit(c.MarkTurnRunning(effect.turn_id))
        if turn.interrupt_requested:  # asked for before Codex named the turn
            await self._send_interrupt(turn)

    def _start_failure(self, exc: Exception) -> TurnEnded:
        provider = self.spec.provider
        if isinstance(exc, CodexRefused):
            return TurnEnded(
                "failed",
                f"{provider} refused {exc.method}: {exc.message}",
                "provider_refused",
                None,
            )
        return TurnEnded("failed", f"{provider}: {exc}", "provider_start_failed", None)

    async def _interrupt(self, nursery: trio.Nursery, effect: ev.InterruptProviderTurn) -> None:
        turn = self._turn
        if turn is None or turn.turn_id != effect.turn_id or self._proc is None:
            return
        turn.interrupt_requested = True
        await self._send_interrupt(turn)
        nursery.start_soon(self._escalate_interrupt, turn, self._proc)

    async def _send_interrupt(self, turn: TurnMapper) -> None:
        """``turn/interrupt`` once Codex has named the turn (else it goes out when it does)."""
        if turn.codex_turn_id is None or self._thread_id is None:
            return
        params = turn_interrupt_params(self._thread_id, turn.codex_turn_id)
        peer = self._peers.get(self._proc) if self._proc is not None else None
        if peer is None:
            return  # no process: its exit ends the turn
        # If the process is going away, its exit ends the turn.
        with contextlib.suppress(ProviderError):
            await self._send(
                encode_request(peer.calls.start("turn/interrupt"), "turn/interrupt", params)
            )

    async def _escalate_interrupt(self, turn: TurnMapper, proc: CliProcess) -> None:
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
        if effect.decision == "cancel" and self._turn is not None:
            self._turn.interrupt_requested = True  # Codex interrupts the turn on cancel
        result = approval_result(request, effect.decision, effect.message)
        await self._send_quietly(encode_result(request.id, result))

    async def force_stop(self, grace: float) -> int | None:
        """Kill the provider's process group (TERM, ``grace`` seconds, KILL) and wait until
        its exit is recorded; the running turn ends ``cancelled`` (``force_stop``). Returns
        the exit status, or None when no process runs. Bounded."""
        proc = self._proc
        if proc is None:
            return None
        proc.force_stopped = True
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
        argv = build_argv(binary)
        return [argv[0], *prefix_args, *argv[1:]]

    async def _start_process(self, nursery: trio.Nursery) -> None:
        session_id = uuid.uuid4().hex
        scope = _scope_unit(self.spec.thread_id, session_id) if self.spec.scopes else None
        process = await self._spawner.spawn(
            self._argv(),
            cwd=self.spec.cwd,
            env=self.spec.env,
            tag=f"thread {self.spec.thread_id}",
            scope=scope,
        )
        proc = CliProcess(process, session_id, self._clock())
        self._proc = proc
        self._peers[proc] = _Peer()
        self._usage_total = None
        if self._turn is not None:
            self._turn.usage_total = None
        self._thread_id = None
        await self._record_session(proc, status="running")
        nursery.start_soon(proc.read_stderr)
        nursery.start_soon(self._read_stdout, proc)
        try:
            await self._call("initialize", initialize_params(CLIENT_NAME, t3d.__version__))
            await self._send(encode_notification("initialized"))
            self._thread_id = await self._open_thread()
        except ProviderError:
            if self._proc is proc:  # a process that cannot take turns is of no use
                proc.detached = True
                self._proc = None
                await proc.stop()
            raise
        self._resume = self._thread_id
        await self._record_session(proc, status="running")  # now with the native thread id

    async def _open_thread(self) -> str:
        """Resume the thread's Codex thread, or start one; returns its id."""
        spec = self.spec
        if self._resume:
            params = thread_resume_params(self._resume, spec.cwd, spec.permission_mode, spec.model)
            try:
                return self._thread_of(await self._call("thread/resume", params))
            except CodexRefused as exc:
                await self._note_lost_thread(self._resume, exc.message)
        params = thread_start_params(spec.cwd, spec.permission_mode, spec.model)
        return self._thread_of(await self._call("thread/start", params))

    def _thread_of(self, result: Any) -> str:
        thread = result.get("thread") if isinstance(result, dict) else None
        thread_id = thread.get("id") if isinstance(thread, dict) else None
        if not isinstance(thread_id, str) or not thread_id:
            raise ProviderError(
                f"{self.spec.provider} started a thread without an id: {str(result)[:200]}"
            )
        return thread_id

    async def _note_lost_thread(self, thread_id: str, message: str) -> None:
        log.warning(
            "thread %s: could not resume Codex thread %s: %s",
            self.spec.thread_id,
            thread_id,
            message,
        )
        turn = self._turn
        if turn is None:
            return
        item = turn.notice(
            "resume",
            f"Codex could not resume its thread {thread_id} ({message}); this turn starts a new "
            "Codex thread, without the earlier turns' context",
        )
        await self._commit(c.RecordItems(turn.turn_id, (item,)))

    async def _call(self, method: str, params: ce.JsonObject) -> Any:
        """Send a request and wait (bounded) for its response; raises `CodexRefused` for an
        error response and `ProviderError` when the process goes or never answers."""
        peer = self._peers.get(self._proc) if self._proc is not None else None
        if peer is None:
            raise ProviderError(f"{self.spec.provider} is not running")
        request_id = peer.calls.start(method)
        call = _Call(method)
        peer.waiting[request_id] = call
        try:
            await self._send(encode_request(request_id, method, params))
            with trio.fail_after(CALL_TIMEOUT_S):
                await call.done.wait()
        except trio.TooSlowError:
            raise ProviderError(
                f"{self.spec.provider} did not answer {method} within {CALL_TIMEOUT_S:g} s; "
                "start a new turn to restart it"
            ) from None
        finally:
            peer.waiting.pop(request_id, None)
            peer.calls.settle(request_id)
        if call.error is not None:
            raise call.error
        return call.result

    async def _send(self, line: bytes) -> None:
        proc = self._proc
        if proc is None:
            raise ProviderError(f"{self.spec.provider} is not running")
        try:
            with trio.fail_after(SEND_TIMEOUT_S):
                await proc.process.stdin.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ProviderError(
                f"{self.spec.provider} is not accepting input (its process has exited)"
            ) from exc
        except trio.TooSlowError as exc:
            raise ProviderError(
                f"{self.spec.provider} has not read its input for {SEND_TIMEOUT_S:g} s; "
                "it looks hung: archive the thread or start a new turn to restart it"
            ) from exc

    async def _send_quietly(self, line: bytes) -> None:
        with contextlib.suppress(ProviderError):
            await self._send(line)

    async def _run_idle_stopper(self) -> None:
        """Stop a process that has had no turn for `idle_timeout` seconds."""
        while True:
            await trio.sleep(min(self.spec.idle_timeout / 4, 30.0))
            proc = self._proc
            idle_for = trio.current_time() - self._idle_since
            if proc is None or self._turn is not None or idle_for < self.spec.idle_timeout:
                continue
            log.info(
                "thread %s: stopping its idle %s process", self.spec.thread_id, self.spec.provider
            )
            proc.detached = True
            self._proc = None  # the next turn starts a new process (with thread/resume)
            await proc.stop()

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
            log.warning("thread %s: %s", self.spec.thread_id, turn.fail_with[0])
            await self._send_interrupt(turn)
            if self._proc is not None:
                nursery.start_soon(self._escalate_interrupt, turn, self._proc)

    async def _read_stdout(self, proc: CliProcess) -> None:
        lines = LineBuffer()
        try:
            try:
                async for chunk in proc.process.stdout:
                    for line in lines.feed(chunk):
                        await self._on_line(line, proc)
                final = lines.eof()
                if final is not None:
                    await self._on_line(final, proc)
            except trio.ClosedResourceError:
                pass
            await self._on_exit(proc, await proc.wait_exit())
        finally:
            proc.exit_handled.set()

    async def _on_exit(self, proc: CliProcess, code: int) -> None:
        if self._proc is proc:
            self._proc = None
        stderr = proc.stderr_text()
        turn = None if proc.detached else self._turn
        await self._record_session(
            proc, status="exited", exit_code=code, stderr_tail=stderr or None
        )
        if turn is not None:
            await self._end_turn(self._exit_outcome(proc, code, stderr, turn), turn)
        gone = ProviderError(f"{self.spec.provider} exited with status {code}")
        peer = self._peers.pop(proc, None)
        for call in [] if peer is None else peer.waiting.values():
            call.error = gone
            call.done.set()

    def _exit_outcome(
        self, proc: CliProcess, code: int, stderr: str, turn: TurnMapper
    ) -> TurnEnded:
        """How the running turn ends when its process exits before ``turn/completed``."""
        provider = self.spec.provider
        if proc.force_stopped:
            error = f"force-stopped by the user: {provider}'s process group was killed"
            return TurnEnded("cancelled", error, "force_stop", turn.usage())
        if turn.fail_with is not None:
            return TurnEnded("failed", turn.fail_with[0], turn.fail_with[1], turn.usage())
        if proc.forced_stop:
            error = f"{provider} did not stop within {self.spec.interrupt_timeout:g} s of the interrupt; its process was stopped"
            return TurnEnded("interrupted", error, "interrupt_timeout", turn.usage())
        if turn.interrupt_requested:
            return TurnEnded("interrupted", "interrupted by the user", "interrupt", turn.usage())
        detail = _stderr_detail(stderr) or turn.last_error or "no output on stderr"
        error = f"{provider} exited with status {code} before the turn finished: {detail}"
        return TurnEnded("failed", error, "provider_exited", turn.usage())

    async def _record_session(
        self,
        proc: CliProcess,
        *,
        status: str,
        exit_code: int | None = None,
        stderr_tail: str | None = None,
    ) -> None:
        now = self._clock()
        session = ProviderSession(
            id=proc.session_id,
            thread_id=self.spec.thread_id,
            provider=self.spec.provider,
            status=status,  # type: ignore[arg-type]
            started_at=proc.started_at,
            native_session_id=self._resume,
            pid=proc.process.pid,
            exited_at=now if status == "exited" else None,
            exit_code=exit_code,
            stderr_tail=stderr_tail,
        )
        await self._commit(c.RecordSession(session))

    # --- lines → domain ------------------------------------------------------------------

    async def _on_line(self, line: bytes | LineTooLong, proc: CliProcess) -> None:
        if isinstance(line, LineTooLong):
            if proc is self._proc:
                await self._line_too_long(line)
            else:
                log.warning("thread %s: %s", self.spec.thread_id, line)
            return
        try:
            event = parse_line(line)
        except ProtocolError as exc:
            log.warning("thread %s: ignored a provider line: %s", self.spec.thread_id, exc)
            return
        if isinstance(event, ce.Response | ce.ErrorResponse):
            self._on_response(proc, event)
        elif proc is not self._proc:
            return  # a process let go (idle, on its way out): nothing of it reaches a turn
        elif isinstance(event, ce.OtherServerRequest):
            log.info("thread %s: refused Codex's %s request", self.spec.thread_id, event.method)
            await self._send_quietly(
                encode_error(event.id, f"t3d does not support {event.method!r}")
            )
        elif isinstance(event, ce.RequestResolved):
            for request_id, request in list(self._requests.items()):
                if request.id == event.request_id:
                    del self._requests[request_id]  # Codex withdrew it: no answer goes out
        elif isinstance(event, ce.ApprovalRequested) and not self._ours(event):
            # Nobody can be asked (no turn of ours runs): refuse rather than let Codex wait.
            await self._send_quietly(encode_result(event.id, approval_result(event, "deny")))
        elif isinstance(
            event, ce.WarningNotice | ce.Unknown | ce.OtherNotification | ce.ThreadStarted
        ):
            if isinstance(event, ce.WarningNotice):
                log.debug("thread %s: Codex warns: %s", self.spec.thread_id, event.message)
        elif self._turn is not None and self._ours(event):
            await self._feed(self._turn, event)

    def _ours(self, event: object) -> bool:
        """The event belongs to this session's thread and its current turn."""
        turn = self._turn
        if turn is None:
            return False
        thread_id = getattr(event, "thread_id", "")
        if thread_id and self._thread_id is not None and thread_id != self._thread_id:
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

    async def _feed(self, turn: TurnMapper, event: object) -> None:
        for change in turn.feed(event):
            await self._apply(turn, change)
            if self._turn is not turn:
                return
        if turn.retrying and self._retrying_since is None:
            self._retrying_since = trio.current_time()
        elif not turn.retrying:
            self._retrying_since = None

    def _on_response(self, proc: CliProcess, event: ce.Response | ce.ErrorResponse) -> None:
        peer = self._peers.get(proc)
        if peer is None:
            return
        method = peer.calls.settle(event.id)
        call = peer.waiting.get(event.id) if event.id is not None else None
        if isinstance(event, ce.ErrorResponse):
            if call is not None:
                call.error = CodexRefused(call.method, event.message)
            else:
                log.info(
                    "thread %s: Codex refused %s: %s",
                    self.spec.thread_id,
                    method or "a request",
                    event.message,
                )
        elif call is not None:
            call.result = event.result
        if call is not None:
            call.done.set()

    async def _line_too_long(self, line: LineTooLong) -> None:
        log.warning("thread %s: %s", self.spec.thread_id, line)
        turn = self._turn
        if turn is None or turn.fail_with is not None:
            return
        # The line may have been the turn's end or an answer: the turn cannot be followed.
        turn.fail_with = (
            f"{self.spec.provider} wrote a stdout line of {line.length} bytes, over t3d's limit of "
            f"{line.limit} bytes; t3d could not read it and stopped the turn",
            "provider_line_too_long",
        )
        await self._send_interrupt(turn)
        if self._proc is not None and turn.codex_turn_id is None:
            await stop_child(self._proc.process, grace=2.0)  # nothing to interrupt yet

    async def _apply(self, turn: TurnMapper, change: Change) -> None:
        if isinstance(change, ItemChanged):
            if change.final:
                self._items.forget((change.item.id,))
                await self._commit(c.RecordItems(turn.turn_id, (change.item,)))
            else:
                await self._items.stream(turn.turn_id, change.item)
        elif isinstance(change, PermissionAsked):
            # Scoped by turn like item ids: Codex's request ids count from 0 per process.
            request_id = f"{turn.turn_id}:{change.request_id}"
            self._requests[request_id] = change.request
            await self._commit(
                c.OpenRequest(turn.turn_id, request_id, "permission", change.item, change.data)
            )
        elif isinstance(change, TurnEnded):
            await self._end_turn(change, turn)

    async def _end_turn(self, ended: TurnEnded, turn: TurnMapper) -> None:
        if self._turn is not turn:
            return  # it ended already: one terminal record per turn
        self._turn = None
        self._retrying_since = None
        if turn.codex_turn_id is not None:
            self._done_turns.append(turn.codex_turn_id)
        if turn.usage_total is not None:
            self._usage_total = turn.usage_total
        closing = tuple(
            attrs.evolve(
                i,
                status="completed" if i.status == "streaming" else "failed",
                updated_at=self._clock(),
            )
            for i in turn.open_items()
            if i.kind != "approval_request"
        )
        self._items.forget(item.id for item in closing)
        if closing:
            await self._commit(c.RecordItems(turn.turn_id, closing))
        await self._commit(
            c.FinishTurn(turn.turn_id, ended.status, ended.error, ended.reason, ended.usage, None)
        )
        self._idle_since = trio.current_time()
        self._requests.clear()
        self._items.reset()

    # --- commits ---------------------------------------------------------------------------

    async def _commit(self, command: c.Command) -> None:
        """Write after every pending streaming update (`ItemCoalescer.commit`)."""
        await self._items.commit(functools.partial(self._write, command))

    async def _record_items(self, turn_id: str, items: tuple[TurnItem, ...]) -> None:
        await self._write(c.RecordItems(turn_id, items))


def _scope_unit(thread_id: str, session_id: str) -> str:
    """A systemd unit name for one provider process: names its thread, unique per process."""
    safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_-") else "_" for ch in thread_id)
    return f"t3d-agent-{safe[:64]}-{session_id[:8]}"
