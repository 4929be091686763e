"""What the daemon holds of a process it asked for: the `Spawner` interface.

Every process the daemon needs goes through one `Spawner`: the sidecar
(`t3d/spawn/sidecar.py`) or, when it is off or cannot start, the daemon's own
`DirectSpawner`. Both give back the same things: a `Child` for a long-lived
process (its pipes, its exit, signals to its process group) and a
`RunResult` for a short-lived command run to completion.
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


class Child(Protocol):
    """A long-lived child in its own process group; the daemon reads its pipes directly."""

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
    async def wait(self) -> int: ...
    async def signal(self, sig: SignalName) -> None:
        """Signal the child's whole process group; a child already gone is fine."""


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
        self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], tag: str = "", scope: str | None = None
    ) -> Child:
        """Start a long-lived child in its own process group; with ``scope``, also in that
        transient systemd scope where systemd works (`Child.scope` says if it does)."""
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
