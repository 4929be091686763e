"""The Codex session driver: one long-lived ``codex app-server`` process per thread, on Trio.

Theory of operation: `CodexSession.run` consumes the thread's inbox of domain
effects (start a turn, interrupt it, answer a prompt, stop), like the Claude
driver. The process is started on the first turn and kept for later turns:
``initialize``, ``initialized``, then ``thread/start`` (or ``thread/resume`` of
the thread's native session, the Codex thread id, after an idle stop or when no
agent outlived a daemon restart), then one ``turn/start`` per turn. One reader task
per process cuts stdout into lines, parses them (sans-IO core), hands responses to
the request that waits for them, answers Codex's requests, maps the thread's
notifications onto domain changes (`TurnMapper`) and writes them through the
session's `WritePipeline`, in order and with backpressure.

The parts, one job each: `peer` (JSON-RPC over one process: ids, calls in flight,
bounded writes), `process` (the process's start and handshake, reading, exit, what
the spawner is told, letting it go), `turns` (a turn's start, interrupt and answers;
lines to domain changes), `resume` (taking over a process after a daemon restart).

Across a daemon restart: a session that detaches at shutdown stops reading, lets its
writes commit and leaves the process running; the next daemon's session takes it
over (`Reattach`) without a new handshake and without sending the open turn's
turn/start again, replays that turn's output, and reads on live. A process is left
running only once its handshake is through (before, it is stopped).

Process model: the app-server multiplexes threads by thread id, so one
process could serve every thread. t3d runs one per thread anyway, because the
supervisor's guarantees are per process: a force stop kills one thread's
process group and leaves the others alone, a crash fails only that thread's
turn, memory pressure names the heaviest agent by its thread, an idle thread
costs no process, each agent gets its own systemd scope, and an agent is taken
over after a restart on its own. The cost,
measured with codex-cli 0.171.0 (Linux x64, an idle thread, 5 sessions): the
npm ``codex`` launcher is a node process (43 MiB RSS) running the native
binary (126 MiB RSS, mostly shared pages), about 170 MiB RSS and 54 MiB PSS
per session; pointing ``--codex-bin`` at the native binary
(``…/@openai/codex-linux-x64/vendor/…/bin/codex``) saves the node process:
126 MiB RSS, 40 MiB PSS. Ten threads in one process took no more memory than
one (under 1 MiB each). The replay fake (``replay-codex``) is one Python
process of about 17 MiB RSS per session.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable

import trio

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.model import TurnItem
from t3d.providers.claude.session import SessionSpec
from t3d.providers.coalesce import ItemCoalescer, Settling
from t3d.providers.codex import events as ce
from t3d.providers.codex.adapter import TurnMapper
from t3d.providers.codex.collab import Collab
from t3d.providers.codex.peer import CodexPeer
from t3d.providers.codex.resume import ResumeAfterRestart
from t3d.providers.log_limit import LogLimiter
from t3d.providers.reattach import Reattach
from t3d.providers.session_base import EXIT_RECORD_S
from t3d.spawn.child import Child, Spawner, stop_child

log = logging.getLogger("t3d.providers.codex")

# Codex turn ids of finished turns, whose late notifications are ignored.
DONE_TURNS = 32
# Turn ids a session remembers having started (to drop a stale start effect).
KNOWN_TURNS = 16


class CodexSession(ResumeAfterRestart):
    def __init__(
        self,
        spec: SessionSpec,
        write: Callable[[c.Command], Awaitable[object]],
        spawner: Spawner,
        clock: Callable[[], float],
        *,
        retry_timeout: float = 60.0,
        writes: Settling | None = None,
    ) -> None:
        self.spec = spec
        # Every write of this session, in order (a `WritePipeline`).
        self._write = write
        self._spawner = spawner
        self._clock = clock
        self._retry_timeout = retry_timeout
        # The running process's JSON-RPC peer (one per process: a process on its way out
        # answers only its own calls).
        self._peer: CodexPeer | None = None
        self._resume = spec.resume  # the Codex thread to resume when a process starts
        self._turn: TurnMapper | None = None
        # Open prompts: domain request id -> Codex's request (what answering needs).
        self._requests: dict[str, ce.ApprovalRequested] = {}
        # Answers to Codex's requests that wait for the end of a replay (by Codex's id).
        self._deferred: dict[ce.RequestId, bytes] = {}
        self._usage_total: ce.Usage | None = None  # Codex's thread total, this process
        self._done_turns: deque[str] = deque(maxlen=DONE_TURNS)
        # Turns this session has started or taken over (a stale start effect is dropped).
        self._known_turns: deque[str] = deque(maxlen=KNOWN_TURNS)
        self._items = ItemCoalescer(self._record_items, writes)
        # Item states a replay holds back until it is through (latest per item, in order).
        self._held: dict[str, TurnItem] = {}
        self._collab = Collab(clock)  # the running turn's spawned agents (child threads)
        self._idle_since = math.inf
        self._retrying_since: float | None = None
        # Since when the running turn has waited for Codex (silence timeout).
        self._quiet_since = math.inf
        # Bad lines from the app-server (warnings) and what it asked in vain (info), logged
        # rate-limited.
        self._warnings = LogLimiter(log, self._tag)
        self._notes = LogLimiter(log, self._tag, level=logging.INFO)
        self._detaching = False
        self._inbox_scope = trio.CancelScope()
        # Asked when the session is cancelled (the daemon is stopping): leave the process
        # running for the next daemon (if it can outlive this one) instead of stopping it.
        self.detach_on_cancel: Callable[[], bool] = lambda: False

    async def run(self, inbox: trio.MemoryReceiveChannel[ev.Effect], reattach: Reattach | None = None) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._items.run)
            if self.spec.idle_timeout > 0:
                nursery.start_soon(self._run_idle_stopper)
            if self._retry_timeout > 0:
                nursery.start_soon(self._run_retry_watch, nursery)
            if self.spec.silence_timeout > 0:
                nursery.start_soon(self._run_silence_watch)
            try:
                with self._inbox_scope:
                    await self._serve_inbox(nursery, inbox, reattach)
            except trio.Cancelled:
                if self._can_leave() and self.detach_on_cancel():
                    self._detaching = True
                raise
            finally:
                peer = self._peer
                if peer is not None and self._detaching:
                    await self._let_go(peer)
                elif peer is not None:
                    await peer.proc.stop()
                    with trio.CancelScope(shield=True), trio.move_on_after(EXIT_RECORD_S):
                        await peer.proc.exit_handled.wait()  # its reader records the exit first
                await self._settle_idle_stop()
                self._warnings.flush()
                self._notes.flush()
                nursery.cancel_scope.cancel()

    def _can_leave(self) -> bool:
        """The process can outlive this daemon (a spawner's child) and be taken over (its
        handshake is through)."""
        peer = self._peer
        return peer is not None and peer.ready and peer.proc.process.detachable

    def detach(self) -> None:
        """Stop at once, leaving the process running for the next daemon (if it can be:
        `_can_leave`; else it is stopped). What was read is committed; the open turn is the
        next daemon's to replay."""
        self._detaching = self._can_leave()
        self._inbox_scope.cancel()

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
