"""What the daemon holds of a process it asked for: the `Spawner` interface.

Every process the daemon needs goes through one `Spawner`: the sidecar
(`t3d/spawn/sidecar.py`) or, when it is off or cannot start, the daemon's own
`DirectSpawner`. Both give back the same things: a `Child` for a long-lived
process (its pipes, its exit, signals to its process group) and a
`RunResult` for a short-lived command run to completion.

Only the sidecar's children outlive their daemon (`Child.detachable`): the spawner
keeps their stdio and relays their stdout from the start of the turn the daemon has
not acked (`Child.ack`), so the next daemon can `Spawner.adopt` and `Spawner.attach`
them and read on. A directly spawned child ends with its daemon.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs
import trio

log = logging.getLogger("t3d.spawn")

Pool = Literal["git", "forge", "other"]
SignalName = Literal["TERM", "KILL", "INT", "HUP"]
# The exit status of a child whose spawner died before reporting it (the child was
# reparented, so nobody can read its real status any more).
EXIT_UNKNOWN = 255
DEFAULT_OUTPUT_CAP = 1024 * 1024


@attrs.frozen
class Replay:
    """Where a child's stdout stream starts for this daemon, in bytes since the child's
    first: ``start`` is the offset of the first byte it reads, ``end`` how far the child
    had written when it was handed over (``start == end``: nothing to replay), and
    ``complete`` is False when output the previous daemon had not acked was dropped."""

    start: int = 0
    end: int = 0
    complete: bool = True


@attrs.frozen
class Orphan:
    """A child a previous daemon left running (or that exited since), as `adopt` found it."""

    child_id: int
    pid: int
    tag: str
    meta: dict[str, Any]
    returncode: int | None
    replay: Replay


class Child(Protocol):
    """A long-lived child in its own process group."""

    @property
    def pid(self) -> int: ...
    @property
    def stdin(self) -> trio.abc.SendStream: ...
    @property
    def stdout(self) -> trio.abc.ReceiveStream: ...
    @property
    def stderr(self) -> trio.abc.ReceiveStream: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def scope(self) -> str | None:
        """The systemd scope unit (without ``.scope``) the child runs in, if any."""
    @property
    def replay(self) -> Replay: ...
    @property
    def meta(self) -> dict[str, Any]:
        """What the daemon that started the child said it is (`spawn`'s and `ack`'s meta)."""
    @property
    def detachable(self) -> bool:
        """True when the child can outlive this daemon (a spawner's child)."""
    @property
    def spawner_lost(self) -> bool:
        """True once the spawner that relayed its output died (it is then stopped)."""
    async def wait(self) -> int: ...
    async def signal(self, sig: SignalName) -> None:
        """Signal the child's whole process group; a child already gone is fine."""
    async def ack(self, offset: int, meta: dict[str, Any] | None = None) -> None:
        """Its stdout before ``offset`` is committed and need not be replayed; ``meta``
        (if given) replaces what the next daemon will be told. A no-op where nothing
        outlives the daemon. Raises SpawnerError."""
    async def close_stdin(self) -> None:
        """End the child's input (its own way to stop), wherever stdin is held."""
    def detach(self) -> None:
        """Let go of the child without stopping it: close this daemon's descriptors."""


@attrs.frozen
class RunResult:
    returncode: int
    signal: str | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    duration: float
    wait: float  # seconds spent waiting for a slot in the pool


@attrs.frozen
class SpawnerStatistics:
    mode: Literal["sidecar", "direct"]
    pid: int | None  # the sidecar's pid
    connected: bool
    restarts: int


class Spawner(Protocol):
    async def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        tag: str = "",
        scope: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Child:
        """Start a long-lived child in its own process group; with ``scope``, also in that
        transient systemd scope where systemd works (`Child.scope` says if it does).
        ``meta`` tells a later daemon what the child is (`Orphan.meta`)."""
        ...

    async def adopt(self) -> list[Orphan]:
        """Take over the children a previous daemon on this state dir left (none where
        nothing outlives a daemon). Others' children are never touched."""
        ...

    async def attach(self, orphan: Orphan) -> Child:
        """Pipes to an adopted child: its stdout from `Replay.start`. Raises SpawnerError."""
        ...

    async def stop_orphan(self, orphan: Orphan) -> None:
        """Stop an adopted child this daemon will not attach to (TERM, then KILL). Bounded."""
        ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        kill_after: float = 60.0,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        pool: Pool = "other",
        read_only: bool = False,
    ) -> RunResult:
        """Run a short-lived command to completion; its process group is KILLed after
        ``kill_after`` seconds (the result says ``timed_out``). ``read_only`` commands are retried
        once if the spawner dies under them; others fail with `SpawnerError`."""
        ...

    def statistics(self) -> SpawnerStatistics: ...

    async def describe(self) -> dict[str, Any]:
        """Statistics plus pools, queue lengths, waits and children (asks the sidecar)."""
        ...


async def stop_child(child: Child, *, grace: float = 5.0) -> int:
    """TERM the group, wait ``grace`` seconds, then KILL. Shielded and bounded."""
    with trio.CancelScope(shield=True):
        if child.returncode is None:
            await child.signal("TERM")
            with trio.move_on_after(grace):
                await child.wait()
            if child.returncode is None:
                await child.signal("KILL")
        with trio.move_on_after(5.0):
            return await child.wait()
    log.error("pid %d did not exit after SIGKILL; giving up on it", child.pid)
    return EXIT_UNKNOWN
