"""`open_spawner`: the daemon's way to start processes, through the sidecar.

At boot the daemon connects to the spawner socket in its state dir (a spawner
started by systemd socket activation, or one a previous daemon left running);
if nothing answers, it starts `python -m spawner` once, as its only child.
Agents a previous daemon on this state dir left running are the daemon's to
`adopt` and `attach` (restart recovery, `t3d/restart.py`); agents of other
state dirs are never touched. Every agent is spawned with ``meta`` naming this
state dir and with the reattach window as its orphan grace, so it outlives a
daemon that goes away without stopping it (`aclose(stop=False)`) for that long.
A spawner the daemon started outlives it too, and exits by itself once it has
had neither a daemon nor children for `IDLE_EXIT_S`.

If the spawner dies, waiting requests fail with `SpawnerError` (read-only
`run` requests are retried once), running agents are stopped (nothing relays
their output any more; `t3d/spawn/client.py`) and their turns end, and the
spawner is restarted with backoff.

`T3D_PROCESS_SPAWNER`: ``auto`` falls back to `DirectSpawner` with a warning
when the sidecar cannot start; ``required`` refuses to start without it;
``off`` always spawns directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

import spawner as spawner_package
from spawner.protocol import b64, unb64
from t3d.config import Settings
from t3d.errors import SpawnerError
from t3d.spawn.child import (
    DEFAULT_OUTPUT_CAP,
    Orphan,
    Pool,
    Replay,
    RunResult,
    Spawner,
    SpawnerStatistics,
)
from t3d.spawn.client import SidecarChild, SidecarConnection, SidecarLostError
from t3d.spawn.direct import DirectSpawner

log = logging.getLogger("t3d.spawn")

START_TIMEOUT_S = 5.0
# How long a request waits for a restarting spawner before it fails.
RECONNECT_WAIT_S = 10.0
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
# A spawner the daemon started exits by itself this long after the daemon is gone
# and its children are stopped (so a crashed daemon leaves nothing behind).
IDLE_EXIT_S = 30.0
ORPHAN_STOP_GRACE_S = 3.0
MAX_SOCKET_PATH = 107


class SidecarSpawner:
    def __init__(self, settings: Settings, nursery: trio.Nursery) -> None:
        self._settings = settings
        self._nursery = nursery
        self._path = str(settings.spawner_socket)
        self._conn: SidecarConnection | None = None
        self._connected = trio.Event()
        self._process: trio.Process | None = None  # set when this daemon started the spawner
        self.restarts = 0
        self.pid: int | None = None
        self._closing = False

    # -- starting and keeping the sidecar ---------------------------------------------------

    async def start(self, *, first: bool = True) -> None:
        """Connect to the spawner, starting it if nothing answers; after a lost spawner
        (not ``first``), stop what it still runs for this state dir. Raises SpawnerError."""
        if len(self._path.encode()) > MAX_SOCKET_PATH:
            raise SpawnerError(f"the spawner socket path {self._path} is over {MAX_SOCKET_PATH} bytes; use a shorter --state-dir")
        try:
            conn = await SidecarConnection.connect(self._path, self._nursery)
        except SpawnerError:
            conn = await self._launch()
        else:
            log.info("using the spawner already listening on %s", self._path)
        try:
            self.pid = (await conn.request({"op": "ping"}))["pid"]
            if not first:
                await self._stop_orphans(conn)
        except SpawnerError:
            conn.close()
            raise
        self._conn = conn
        self._connected.set()

    async def _launch(self) -> SidecarConnection:
        if self._process is not None and self._process.returncode is None:
            with trio.move_on_after(1.0):
                await self._process.wait()  # a spawner we started that stopped answering: reap it
        argv = [
            sys.executable, "-S", "-m", "spawner", "--socket", self._path, "--idle-exit", str(IDLE_EXIT_S),
            "--orphan-grace", str(self._settings.agent_reattach_window),
        ]
        if self._settings.spawner_git_pool is not None:
            argv += ["--git-pool", str(self._settings.spawner_git_pool)]
        if self._settings.spawner_forge_pool is not None:
            argv += ["--forge-pool", str(self._settings.spawner_forge_pool)]
        # What the spawner needs to start (its package on the path, fewer malloc arenas) but
        # its children must not inherit: it unsets the names listed in T3D_SPAWNER_UNSET.
        added = {"PYTHONPATH": str(Path(spawner_package.__file__).parent.parent), "MALLOC_ARENA_MAX": "2"}
        added = {name: value for name, value in added.items() if name not in os.environ}
        unset = [*added, *(() if "T3D_LOG_FORMAT" in os.environ else ("T3D_LOG_FORMAT",))]
        env = {**os.environ, **added, "T3D_LOG_FORMAT": self._settings.log_format, "T3D_SPAWNER_UNSET": ",".join(unset)}
        try:
            # The daemon's one process start: its own session, so a Ctrl-C to the terminal
            # reaches the daemon (which then stops it) and not the spawner directly.
            self._process = await trio.lowlevel.open_process(argv, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            raise SpawnerError(f"could not start the spawner: {exc.strerror or exc}") from exc
        with trio.move_on_after(START_TIMEOUT_S):
            while self._process.returncode is None:
                with contextlib.suppress(SpawnerError):
                    conn = await SidecarConnection.connect(self._path, self._nursery)
                    log.info("started the spawner (pid %d) on %s", self._process.pid, self._path)
                    return conn
                await trio.sleep(0.02)
                self._process.poll()
        if self._process.returncode is not None:
            raise SpawnerError(f"the spawner exited with status {self._process.returncode} at start (its log is above)")
        raise SpawnerError(f"the spawner did not listen on {self._path} within {START_TIMEOUT_S:g} s")

    def _match(self) -> dict[str, Any]:
        return {"state_dir": str(self._settings.state_dir)}

    async def _stop_orphans(self, conn: SidecarConnection) -> None:
        """After a reconnect: this state dir's children that connection left are stopped
        (their turns ended when the connection broke)."""
        adopted = (await conn.request({"op": "adopt", "match": self._match()}))["children"]
        for child in adopted:
            log.warning(
                "stopping %s (pid %d, %s), left by a broken spawner connection",
                child["argv0"], child["pid"], child["tag"] or "no tag",
            )
        await self._stop(conn, [c["child"] for c in adopted if c.get("returncode") is None])

    async def _stop(self, conn: SidecarConnection, child_ids: list[int]) -> None:
        waiters = {child_id: conn.exit_waiter(child_id) for child_id in child_ids}
        for child_id in child_ids:
            await conn.request({"op": "signal", "child": child_id, "signal": "TERM"})
        with trio.move_on_after(ORPHAN_STOP_GRACE_S):
            for event in waiters.values():
                await event.wait()
        for child_id, event in waiters.items():
            if not event.is_set():
                await conn.request({"op": "signal", "child": child_id, "signal": "KILL"})

    async def adopt(self) -> list[Orphan]:
        conn = await self._connection()
        adopted = (await conn.request({"op": "adopt", "match": self._match()}))["children"]
        return [
            Orphan(
                child_id=c["child"],
                pid=c["pid"],
                tag=c.get("tag") or "",
                meta=c.get("meta") or {},
                returncode=c.get("returncode"),
                replay=Replay(int(c["start"]), int(c["end"]), bool(c["complete"])),
            )
            for c in adopted
        ]

    async def attach(self, orphan: Orphan) -> SidecarChild:
        conn = await self._connection()
        return await conn.attach(orphan.child_id)

    async def stop_orphan(self, orphan: Orphan) -> None:
        if orphan.returncode is not None:
            return
        with contextlib.suppress(SpawnerError):
            await self._stop(await self._connection(), [orphan.child_id])

    async def supervise(self) -> None:
        """Restart the spawner with backoff whenever its connection ends."""
        while True:
            assert self._conn is not None
            await self._conn.closed.wait()
            if self._closing:
                return
            log.warning("lost the spawner (%s); restarting it", self._conn.close_reason)
            for attempt in range(1_000_000):
                await trio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
                try:
                    await self.start(first=False)
                    break
                except SpawnerError as exc:
                    log.error("could not restart the spawner: %s", exc)
            self.restarts += 1

    async def aclose(self, *, stop: bool = True) -> None:
        """Close the connection; with ``stop``, also stop the spawner if this daemon started
        it (else it keeps the agents for the next daemon, and exits once idle). Bounded."""
        self._closing = True
        with trio.CancelScope(shield=True):
            process = self._process
            if not stop and process is not None:
                stop = not await self._has_children()  # nothing to keep: do not leave it behind
            if self._conn is not None:
                self._conn.close()
            if process is None:
                return
            if not stop:
                log.info("leaving the spawner (pid %d) running with its agents", process.pid)
                return
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(5.0):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
            await process.wait()

    async def _has_children(self) -> bool:
        conn = self._conn
        if conn is None or conn.closed.is_set():
            return False
        with trio.move_on_after(2.0):
            with contextlib.suppress(SpawnerError):
                return bool((await conn.request({"op": "stats"}))["children"])
        return True  # no answer in time: keep it, it may hold agents

    async def _connection(self) -> SidecarConnection:
        with trio.move_on_after(RECONNECT_WAIT_S):
            while self._conn is None or self._conn.closed.is_set():
                if self._connected.is_set():  # set for a connection that has since ended
                    self._connected = trio.Event()
                await self._connected.wait()
            return self._conn
        raise SpawnerError(f"the spawner is not running and did not come back within {RECONNECT_WAIT_S:g} s; see the log")

    # -- the Spawner interface ------------------------------------------------------------

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        tag: str = "",
        scope: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> SidecarChild:
        conn = await self._connection()
        message: dict[str, Any] = {
            "argv": list(argv), "cwd": cwd, "env": dict(env), "tag": tag,
            "meta": {**(meta or {}), **self._match()}, "orphan_grace": self._settings.agent_reattach_window,
        }
        if scope is not None:
            message["scope"] = scope
        return await conn.spawn(message)

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
        message: dict[str, Any] = {
            "op": "run", "argv": list(argv), "cwd": cwd, "env": None if env is None else dict(env),
            "stdin_b64": b64(stdin), "timeout": kill_after, "output_cap": output_cap, "pool": pool,
        }
        for attempt in (1, 2):
            conn = await self._connection()
            try:
                reply = await conn.request(message)
                break
            except SidecarLostError as exc:
                if not read_only or attempt == 2:
                    raise SpawnerError(f"the spawner died while running {argv[0]!r}; it is being restarted, try again") from exc
                log.info("the spawner died under read-only %r; retrying it once", argv[0])
        return RunResult(
            returncode=reply["returncode"],
            signal=reply["signal"],
            stdout=unb64(reply["stdout_b64"], "stdout"),
            stderr=unb64(reply["stderr_b64"], "stderr"),
            truncated=reply["truncated"],
            timed_out=reply["timed_out"],
            duration=reply["duration"],
            wait=reply["wait"],
        )

    def statistics(self) -> SpawnerStatistics:
        connected = self._conn is not None and not self._conn.closed.is_set()
        return SpawnerStatistics(mode="sidecar", pid=self.pid, connected=connected, restarts=self.restarts)

    async def describe(self) -> dict[str, Any]:
        conn = await self._connection()
        detail: dict[str, Any] = await conn.request({"op": "stats"})
        detail.pop("id", None)
        detail.pop("ok", None)
        return {**attrs.asdict(self.statistics()), **detail}


@contextlib.asynccontextmanager
async def open_spawner(settings: Settings, stop_at_exit: Callable[[], bool] = lambda: True) -> AsyncIterator[Spawner]:
    """The daemon's spawner. At exit, ``stop_at_exit()`` says whether a spawner this daemon
    started is stopped (with every agent) or left running for the next daemon."""
    direct = DirectSpawner(git_pool=settings.spawner_git_pool, forge_pool=settings.spawner_forge_pool)
    if settings.process_spawner == "off":
        log.info("T3D_PROCESS_SPAWNER=off: the daemon starts processes itself")
        yield direct
        return
    failure: SpawnerError | None = None
    async with trio.open_nursery() as nursery:
        # The connection's reader and the children's exit watchers run shielded, so the
        # daemon's shutdown cannot take them away while sessions are still stopping
        # their agents; `aclose` (the last step) cancels them.
        shielded = await nursery.start(_run_shielded_nursery)
        sidecar = SidecarSpawner(settings, shielded.nursery)
        try:
            try:
                await sidecar.start()
            except SpawnerError as exc:
                failure = exc
            if failure is None:
                nursery.start_soon(sidecar.supervise)
                yield sidecar
            elif settings.process_spawner == "auto":
                log.warning("the spawner sidecar is unavailable (%s); the daemon starts processes itself", failure)
                yield direct
        finally:
            await sidecar.aclose(stop=stop_at_exit())
            shielded.scope.cancel()
            nursery.cancel_scope.cancel()
    if failure is not None and settings.process_spawner == "required":
        raise SpawnerError(f"T3D_PROCESS_SPAWNER=required but {failure}")


@attrs.frozen
class _Shielded:
    scope: trio.CancelScope
    nursery: trio.Nursery


async def _run_shielded_nursery(*, task_status: trio.TaskStatus[_Shielded]) -> None:
    with trio.CancelScope(shield=True) as scope:
        async with trio.open_nursery() as nursery:
            task_status.started(_Shielded(scope, nursery))
            await trio.sleep_forever()
