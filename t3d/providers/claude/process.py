"""One running Claude CLI process, as the session driver sees it.

`ClaudeProcess` wraps the OS process with what the session keeps about it: the
id of its `ProviderSession` record, when it started, the tail of its stderr,
the cost it has reported so far and how it came to end.

Rules:
- Bounded: only the last `STDERR_TAIL` bytes of stderr are kept.
- `wait_exit` waits for stderr's EOF at most `STDERR_DRAIN_S` after the exit.
- `stop` always completes: shielded, and bounded by TERM then KILL.
- A process the session lets go of at shutdown (``detaching``) keeps running; its
  exit, if it comes, is the next daemon's to record.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import trio

from t3d.providers.claude.adapter import TurnEnded, TurnMapper
from t3d.providers.lines import LineTooLong
from t3d.providers.output import ProviderOutput
from t3d.providers.silence import SILENT_REASON, silence_error
from t3d.spawn.child import Child, stop_child

STDERR_TAIL = 8 * 1024


class Limits(Protocol):
    """The settings an exit report names (a `SessionSpec`)."""

    @property
    def provider(self) -> str: ...
    @property
    def interrupt_timeout(self) -> float: ...
    @property
    def silence_timeout(self) -> float: ...

# After the process exits, how long its stderr may still take to reach EOF (a child
# of the CLI can hold the pipe open) before the exit is reported without the rest.
STDERR_DRAIN_S = 1.0


class ClaudeProcess:
    def __init__(self, process: Child, session_id: str, started_at: float) -> None:
        self.process = process
        self.output = ProviderOutput(process)
        self.session_id = session_id
        self.started_at = started_at
        self._stderr_tail: deque[bytes] = deque()
        self._stderr_bytes = 0
        self.cost_so_far = 0.0
        # Stopped because it did not honour an interrupt in time.
        self.forced_stop = False
        # Killed on the user's order (thread.force_stop): its turn ends cancelled.
        self.force_stopped = False
        # Let go by the session on purpose (idle): its exit ends no turn.
        self.detached = False
        # Stopped because its turn got no output for the silence timeout.
        self.silenced = False
        # Stopped because it wrote a stdout line over the limit during a turn (that line
        # may have been the turn's end or a prompt, so the turn cannot be followed).
        self.line_too_long: LineTooLong | None = None
        # Left running for the next daemon (this one is stopping): its exit is not ours.
        self.detaching = False
        # The turn last handed to the process and the stdout offset its output starts at
        # (told to the spawner, for the next daemon: `Reattach`).
        self.turn_id: object = None
        self.turn_offset = 0
        # Messages steered into that turn (each adds a result to wait for), and the offset
        # where the next line starts (where a wake's output begins).
        self.steers = 0
        self.line_start = process.replay.start
        # Replayed lines ending at or before this offset are skipped (output from before
        # the open turn, or all of it between turns: `Reattach`).
        self.skip_until = -1
        # Replayed lines are skipped through this many more results (the end of a turn that
        # finished before the last daemon acked it).
        self.skip_results = 0
        # Where the first line left unrecorded while the session stopped begins (a wake): a
        # detach acks no further, so the next daemon replays it.
        self.dropped_at: int | None = None
        self._stderr_closed = trio.Event()
        # Set once the session has handled (recorded) this process's exit, or given up on it.
        self.exit_handled = trio.Event()

    def _keep_stderr(self, chunk: bytes | bytearray) -> None:
        self._stderr_tail.append(bytes(chunk))
        self._stderr_bytes += len(chunk)
        while self._stderr_bytes - len(self._stderr_tail[0]) >= STDERR_TAIL:
            self._stderr_bytes -= len(self._stderr_tail.popleft())

    def stderr_text(self) -> str:
        return b"".join(self._stderr_tail)[-STDERR_TAIL:].decode("utf-8", "replace").strip()

    async def read_stderr(self) -> None:
        """Keep the tail of stderr until its EOF. Start in a nursery with the process."""
        try:
            async for chunk in self.process.stderr:
                self._keep_stderr(chunk)
        except trio.ClosedResourceError:
            pass
        finally:
            self._stderr_closed.set()

    async def wait_exit(self) -> int:
        """Wait for the exit, then (briefly) for the last words on stderr that explain it."""
        code = await self.process.wait()
        with trio.move_on_after(STDERR_DRAIN_S):
            await self._stderr_closed.wait()
        return code

    def exit_outcome(self, spec: Limits, code: int, stderr: str, turn: TurnMapper) -> TurnEnded:
        """How the running turn ends when this process exits before the turn's `result`."""
        provider = spec.provider
        if self.force_stopped:
            return TurnEnded("cancelled", f"force-stopped by the user: {provider}'s process group was killed", "force_stop", None, None)
        if self.forced_stop:
            error = f"{provider} did not stop within {spec.interrupt_timeout:g} s of the interrupt; its process was stopped"
            return TurnEnded("interrupted", error, "interrupt_timeout", None, None)
        if self.line_too_long is not None:
            line = self.line_too_long
            error = (
                f"{provider} wrote a stdout line of {line.length} bytes, over t3d's limit of "
                f"{line.limit} bytes; t3d could not read it and stopped the turn"
            )
            return TurnEnded("failed", error, "provider_line_too_long", None, None)
        if turn.interrupt_requested:
            return TurnEnded("interrupted", "interrupted by the user", "interrupt", None, None)
        if self.silenced:
            return TurnEnded("failed", silence_error(provider, spec.silence_timeout), SILENT_REASON, None, None)
        if self.process.spawner_lost:
            error = f"the spawner died, so {provider}'s process was stopped; start a new turn to continue"
            return TurnEnded("failed", error, "spawner_lost", None, None)
        detail = stderr.splitlines()[-1] if stderr else (turn.last_error or "no output on stderr")
        error = f"{provider} exited with status {code} before the turn finished: {detail}"
        return TurnEnded("failed", error, "provider_exited", None, None)

    async def stop(self) -> None:
        """Close stdin (the CLI's own way to end), then TERM and KILL if it lingers. Bounded."""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(2.0):
                await self.process.close_stdin()
            with trio.move_on_after(2.0):
                await self.process.wait()
            await stop_child(self.process, grace=3.0)
