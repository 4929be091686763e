"""Starting processes: the one small interface every process start goes through.

Today the daemon starts provider processes itself (`DirectSpawner`); the
spawner-sidecar work replaces this class, not its callers. Children get their
own session (process group), so a signal to the group reaches the whole
agent tree, and close-on-exec hygiene is Python's default (only the three
pipes are inherited).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

import trio

from t3d.errors import SpawnerError


class Spawner(Protocol):
    async def spawn(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str]) -> trio.Process: ...


class DirectSpawner:
    async def spawn(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str]) -> trio.Process:
        try:
            return await trio.lowlevel.open_process(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
        except OSError as exc:
            raise SpawnerError(f"could not start {argv[0]!r}: {exc.strerror or exc}") from exc


def signal_group(process: trio.Process, sig: int) -> None:
    """Signal the child's whole process group; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


async def stop_process(process: trio.Process, *, grace: float = 5.0) -> int:
    """TERM the group, wait ``grace`` seconds, then KILL. Shielded and bounded."""
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            signal_group(process, signal.SIGTERM)
            with trio.move_on_after(grace):
                await process.wait()
            if process.returncode is None:
                signal_group(process, signal.SIGKILL)
        code = await process.wait()
    return code
