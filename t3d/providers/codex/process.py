"""The life of a `CodexSession`'s ``codex app-server`` process: start and handshake,
reading its stdout, its exit, what the spawner is told about it, and letting it go.

Rules:
- A process starts with ``initialize``, ``initialized`` and ``thread/start``, or
  ``thread/resume`` of the thread's Codex thread (a thread Codex cannot resume goes on
  in a new one, and the turn says so). A process that fails its handshake is stopped.
- The spawner's ``meta`` for the process (`AppServer._meta`) is what a daemon taking it
  over after a restart needs: the Codex thread (``native_session_id``, only once the
  handshake is done, so a process with it needs no new handshake), the next JSON-RPC
  id, the open turn with its stdout offset and turn/start id, Codex's token total and
  its last finished turns. It is sent after the handshake, before each turn/start
  and turn/interrupt, and with each ack of a finished turn's output.
- Its exit, not EOF on a pipe a grandchild may hold, ends the stream (`ProviderOutput`).
  A process that exits mid-turn ends the turn ``failed`` with the stderr tail (or
  ``cancelled``, ``interrupted``, ``provider_silent``, ``spawner_lost`` as the case may be); the next turn
  starts a new process, which resumes the thread.
- A process the session lets go of at shutdown (`AppServer._let_go`) keeps running for
  the next daemon; its exit is not this session's to record.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

import t3d
from t3d.domain import commands as c
from t3d.errors import ProviderError, SpawnerError
from t3d.providers.claude.process import ClaudeProcess as CliProcess
from t3d.providers.claude.session import SessionSpec
from t3d.providers.codex import events as ce
from t3d.providers.codex.adapter import TurnEnded, TurnMapper
from t3d.providers.codex.encode import (
    build_argv,
    encode_notification,
    initialize_params,
    thread_resume_params,
    thread_start_params,
)
from t3d.providers.codex.peer import CodexPeer, CodexRefused
from t3d.providers.lines import LineTooLong
from t3d.providers.log_limit import LogLimiter
from t3d.providers.session_base import EXIT_RECORD_S, SessionBase
from t3d.providers.silence import SILENT_REASON, silence_error
from t3d.spawn.child import Spawner

log = logging.getLogger("t3d.providers.codex")

CLIENT_NAME = "t3d"
# Codex turn ids of finished turns the spawner is told of (their late notifications are
# ignored after a takeover too).
META_DONE_TURNS = 4

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _stderr_detail(stderr: str) -> str | None:
    lines = [line.strip() for line in _ANSI.sub("", stderr).splitlines() if line.strip()]
    return lines[-1] if lines else None


def scope_unit(thread_id: str, session_id: str) -> str:
    """A systemd unit name for one provider process: names its thread, unique per process."""
    safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_-") else "_" for ch in thread_id)
    return f"t3d-agent-{safe[:64]}-{session_id[:8]}"


class AppServer(SessionBase):
    """The process side of `CodexSession` (state is set up by its ``__init__``)."""

    spec: SessionSpec
    _spawner: Spawner
    _clock: Callable[[], float]
    _peer: CodexPeer | None
    _resume: str | None
    _turn: TurnMapper | None
    _usage_total: ce.Usage | None
    _done_turns: deque[str]
    _idle_since: float
    _on_line: Callable[[CodexPeer, bytes | LineTooLong], Awaitable[None]]
    _end_turn: Callable[[TurnEnded, TurnMapper], Awaitable[None]]
    _flush_held: Callable[[], Awaitable[None]]
    _notes: LogLimiter

    @property
    def _proc(self) -> CliProcess | None:
        return None if self._peer is None else self._peer.proc

    @property
    def _tag(self) -> str:
        return f"thread {self.spec.thread_id}"

    def _argv(self) -> list[str]:
        binary, *prefix_args = self.spec.argv
        argv = build_argv(binary)
        return [argv[0], *prefix_args, *argv[1:]]

    def _meta(self, peer: CodexPeer) -> dict[str, Any]:
        """What the next daemon needs to know of this process (`Reattach`)."""
        proc = peer.proc
        return {
            "thread_id": self.spec.thread_id,
            "provider": self.spec.provider,
            "session_id": proc.session_id,
            "started_at": proc.started_at,
            "turn_id": proc.turn_id,
            "turn_offset": proc.turn_offset,
            "native_session_id": peer.thread_id if peer.ready else None,
            "next_request_id": peer.calls.next_id,
            "turn_request_id": peer.turn_request_id,
            "usage_total": None if self._usage_total is None else list(attrs.astuple(self._usage_total)),
            "done_turns": list(self._done_turns)[-META_DONE_TURNS:],
        }

    async def _tell_spawner(self, peer: CodexPeer, offset: int) -> None:
        """Ack ``offset`` with the current meta; a spawner that is gone is fine (its agents
        stop, and the exit reports it)."""
        with contextlib.suppress(SpawnerError):
            await peer.proc.process.ack(offset, self._meta(peer))

    async def _start_process(self, nursery: trio.Nursery) -> CodexPeer:
        session_id = uuid.uuid4().hex
        scope = scope_unit(self.spec.thread_id, session_id) if self.spec.scopes else None
        started_at = self._clock()
        meta = {"thread_id": self.spec.thread_id, "provider": self.spec.provider, "session_id": session_id, "started_at": started_at}
        process = await self._spawner.spawn(
            self._argv(), cwd=self.spec.cwd, env=self.spec.env, tag=self._tag, scope=scope, meta=meta
        )
        proc = CliProcess(process, session_id, started_at)
        peer = CodexPeer(proc, self.spec.provider, self._notes)
        self._peer = peer
        self._usage_total = None
        if self._turn is not None:
            self._turn.usage_total = None
        await self._record_session(proc, status="running")
        nursery.start_soon(proc.read_stderr)
        nursery.start_soon(self._read_stdout, peer)
        try:
            await peer.call("initialize", initialize_params(CLIENT_NAME, t3d.__version__))
            await peer.send(encode_notification("initialized"))
            peer.thread_id = await self._open_thread(peer)
        except ProviderError:
            if self._peer is peer:  # a process that cannot take turns is of no use
                proc.detached = True
                self._peer = None
                await proc.stop()
            raise
        self._resume = peer.thread_id
        await self._record_session(proc, status="running")  # now with the native thread id
        with trio.CancelScope(shield=True):  # from now on the process can outlive this daemon
            peer.ready = True
            await self._tell_spawner(peer, proc.output.offset)
        return peer

    async def _open_thread(self, peer: CodexPeer) -> str:
        """Resume the thread's Codex thread, or start one; returns its id."""
        spec = self.spec
        if self._resume:
            params = thread_resume_params(self._resume, spec.cwd, spec.permission_mode, spec.model)
            try:
                return self._thread_of(await peer.call("thread/resume", params))
            except CodexRefused as exc:
                await self._note_lost_thread(self._resume, exc.message)
        params = thread_start_params(spec.cwd, spec.permission_mode, spec.model)
        return self._thread_of(await peer.call("thread/start", params))

    def _thread_of(self, result: Any) -> str:
        thread = result.get("thread") if isinstance(result, dict) else None
        thread_id = thread.get("id") if isinstance(thread, dict) else None
        if not isinstance(thread_id, str) or not thread_id:
            raise ProviderError(
                f"{self.spec.provider} started a thread without an id: {str(result)[:200]}"
            )
        return thread_id

    async def _note_lost_thread(self, thread_id: str, message: str) -> None:
        log.warning("%s: could not resume Codex thread %s: %s", self._tag, thread_id, message)
        turn = self._turn
        if turn is None:
            return
        item = turn.notice(
            "resume",
            f"Codex could not resume its thread {thread_id} ({message}); this turn starts a new "
            "Codex thread, without the earlier turns' context",
        )
        await self._commit(c.RecordItems(turn.turn_id, (item,)))

    async def _read_stdout(self, peer: CodexPeer) -> None:
        proc = peer.proc
        try:
            await proc.output.run(functools.partial(self._on_line, peer))
            if not proc.detaching:
                await self._on_exit(peer, await proc.wait_exit())
        finally:
            proc.exit_handled.set()

    async def _on_exit(self, peer: CodexPeer, code: int) -> None:
        proc = peer.proc
        if self._peer is peer:
            self._peer = None
        stderr = proc.stderr_text()
        turn = None if proc.detached else self._turn
        if turn is not None:
            await self._flush_held()  # what a replay held back comes before the end
        await self._record_session(proc, status="exited", exit_code=code, stderr_tail=stderr or None)
        if turn is not None:
            await self._end_turn(self._exit_outcome(proc, code, stderr, turn), turn)
        peer.close(code)

    def _exit_outcome(self, proc: CliProcess, code: int, stderr: str, turn: TurnMapper) -> TurnEnded:
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
        if proc.silenced:
            return TurnEnded("failed", silence_error(provider, self.spec.silence_timeout), SILENT_REASON, turn.usage())
        if proc.process.spawner_lost:
            error = f"the spawner died, so {provider}'s process was stopped; start a new turn to continue"
            return TurnEnded("failed", error, "spawner_lost", turn.usage())
        detail = _stderr_detail(stderr) or turn.last_error or "no output on stderr"
        error = f"{provider} exited with status {code} before the turn finished: {detail}"
        return TurnEnded("failed", error, "provider_exited", turn.usage())

    async def _let_go(self, peer: CodexPeer) -> None:
        """Leave the process running for the next daemon: stop reading, let what was read
        commit; between turns everything read is settled, so nothing is replayed."""
        proc = peer.proc
        with trio.CancelScope(shield=True), trio.move_on_after(EXIT_RECORD_S):
            proc.detaching = True
            await proc.output.stop()
            await proc.exit_handled.wait()
            if self._turn is None:
                await self._tell_spawner(peer, proc.output.offset)
        proc.process.detach()
        log.info("%s: left its %s process (pid %d) running", self._tag, self.spec.provider, proc.process.pid)

    async def _run_idle_stopper(self) -> None:
        """Stop a process that has had no turn for `idle_timeout` seconds."""
        while True:
            await trio.sleep(min(self.spec.idle_timeout / 4, 30.0))
            proc = self._proc
            idle_for = trio.current_time() - self._idle_since
            if proc is None or self._turn is not None or idle_for < self.spec.idle_timeout:
                continue
            log.info("%s: stopping its idle %s process", self._tag, self.spec.provider)
            self._peer = None  # the next turn starts a new process (with thread/resume)
            await self._stop_idle(proc)
