"""Spawning from the daemon itself: `T3D_PROCESS_SPAWNER=off`, or `auto` when the
sidecar cannot start. Same interface and pool sizes as the sidecar; it exists
for comparison in the benchmark and as a fallback, not as the normal path.
Its children cannot outlive the daemon: they end with it (stdin closes), so a
restart ends their turns (`server_restart`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from spawner.pools import FORGE_POOL, OTHER_POOL, available_cpus, default_git_pool
from t3d.errors import SpawnerError
from t3d.spawn.child import (
    DEFAULT_OUTPUT_CAP,
    Orphan,
    Pool,
    Replay,
    RunResult,
    SignalName,
    SpawnerStatistics,
)


class DirectChild:
    def __init__(self, process: trio.Process) -> None:
        assert process.stdin and process.stdout and process.stderr
        self._process = process
        self.stdin, self.stdout, self.stderr = process.stdin, process.stdout, process.stderr
        self.scope: str | None = None  # the daemon never creates scopes itself
        self.replay = Replay()
        self.meta: dict[str, Any] = {}
        self.detachable = False
        self.spawner_lost = False

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        return await self._process.wait()

    async def signal(self, sig: SignalName) -> None:
        if self._process.returncode is None:  # not yet reaped: the group id is still ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, getattr(signal, "SIG" + sig))

    async def ack(self, offset: int, meta: dict[str, Any] | None = None) -> None:
        return  # nothing outlives this daemon, so nothing is kept for the next

    async def close_stdin(self) -> None:
        await self.stdin.aclose()

    def detach(self) -> None:
        return  # not detachable: the daemon's exit ends the child (its stdin closes)


class DirectSpawner:
    def __init__(self, *, git_pool: int | None = None, forge_pool: int | None = None) -> None:
        self._pools: dict[str, trio.CapacityLimiter] = {
            "git": trio.CapacityLimiter(git_pool or default_git_pool(available_cpus())),
            "forge": trio.CapacityLimiter(forge_pool or FORGE_POOL),
            "other": trio.CapacityLimiter(OTHER_POOL),
        }

    async def _open(self, argv: Sequence[str], cwd: str, env: Mapping[str, str] | None, stdin: int) -> trio.Process:
        try:
            return await trio.lowlevel.open_process(
                list(argv),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=None if env is None else dict(env),
                start_new_session=True,
            )
        except OSError as exc:
            raise SpawnerError(f"could not start {argv[0]!r}: {exc.strerror or exc}") from exc

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        tag: str = "",
        scope: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> DirectChild:
        return DirectChild(await self._open(argv, cwd, env, subprocess.PIPE))

    async def adopt(self) -> list[Orphan]:
        return []

    async def attach(self, orphan: Orphan) -> DirectChild:
        raise SpawnerError("the daemon starts processes itself (T3D_PROCESS_SPAWNER=off): it cannot attach to others")

    async def stop_orphan(self, orphan: Orphan) -> None:
        return

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
        queued = time.monotonic()
        async with self._pools[pool]:
            started = time.monotonic()
            process = await self._open(argv, cwd, env, subprocess.PIPE if stdin else subprocess.DEVNULL)
            outputs = [bytearray(), bytearray()]
            truncated = False

            async def collect(stream: trio.abc.ReceiveStream, kept: bytearray) -> None:
                nonlocal truncated
                async for chunk in stream:
                    room = output_cap - len(kept)
                    truncated = truncated or room < len(chunk)
                    kept += chunk[: max(room, 0)]

            async def feed() -> None:
                assert process.stdin is not None
                with contextlib.suppress(trio.BrokenResourceError):
                    await process.stdin.send_all(stdin)
                await process.stdin.aclose()

            with trio.move_on_after(kill_after) as deadline:
                async with trio.open_nursery() as nursery:
                    if stdin:
                        nursery.start_soon(feed)
                    assert process.stdout and process.stderr
                    nursery.start_soon(collect, process.stdout, outputs[0])
                    nursery.start_soon(collect, process.stderr, outputs[1])
                await process.wait()
            if deadline.cancelled_caught:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                code = await process.wait()
                for stream in (process.stdin, process.stdout, process.stderr):
                    if stream is not None:
                        await stream.aclose()
        return RunResult(
            returncode=code,
            signal=signal.Signals(-code).name if code < 0 else None,
            stdout=bytes(outputs[0]),
            stderr=bytes(outputs[1]),
            truncated=truncated,
            timed_out=deadline.cancelled_caught,
            duration=time.monotonic() - started,
            wait=started - queued,
        )

    def statistics(self) -> SpawnerStatistics:
        return SpawnerStatistics(mode="direct", pid=None, connected=False, restarts=0)

    async def describe(self) -> dict[str, Any]:
        pools = {
            name: {"size": int(limiter.total_tokens), "busy": limiter.borrowed_tokens, "queued": limiter.statistics().tasks_waiting}
            for name, limiter in self._pools.items()
        }
        return {**attrs.asdict(self.statistics()), "pools": pools}
