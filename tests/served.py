"""`t3d serve` as a real subprocess, for tests: start it, talk to it, look at what it left.

`serve` runs ``python -m t3d serve --port 0`` (or another launcher) and parses the
port from its ``t3d serving on http://127.0.0.1:PORT`` line on stderr. SQLite is
read directly (apsw, in a worker thread) where the API cannot show what is pinned.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import attrs
import orjson
import trio
import trio_websocket
from harness import RpcClient

from t3d.daemon import DaemonInfo

SERVING = re.compile(rb"t3d serving on http://127\.0\.0\.1:(\d+)")
def base_env(**extra: str) -> dict[str, str]:
    """The test's environment without T3D_ settings; agents a killed daemon leaves behind
    wait only 15 s for another (tests that restart on purpose pass a longer window)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("T3D_")}
    env["T3D_REPLAY_INTERRUPT_TIMEOUT"] = "60"
    env["T3D_AGENT_REATTACH_WINDOW"] = "15"
    return {**env, **extra}


@attrs.define
class Served:
    """A `t3d serve` subprocess; quacks like harness.Daemon for `new_thread`, `run_turn`, `http`."""

    process: trio.Process
    state_dir: Path
    stderr: bytearray = attrs.Factory(bytearray)
    port: int = 0

    @property
    def info(self) -> DaemonInfo:
        return DaemonInfo(
            f"http://127.0.0.1:{self.port}", self.port, str(self.state_dir / "auth" / "token")
        )

    @property
    def token(self) -> str:
        return (self.state_dir / "auth" / "token").read_text().strip()

    @property
    def db_path(self) -> Path:
        return self.state_dir / "t3d.sqlite"

    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


async def _collect_stderr(served: Served, ready: trio.Event) -> None:
    assert served.process.stderr is not None
    async for chunk in served.process.stderr:
        served.stderr += chunk
        if not served.port and (m := SERVING.search(served.stderr)):
            served.port = int(m.group(1))
            ready.set()
    ready.set()  # the process ended without serving


@asynccontextmanager
async def serve(
    state_dir: Path | None,
    *flags: str,
    env: dict[str, str] | None = None,
    launcher: Sequence[str] = ("-m", "t3d"),
    stdin: int = subprocess.DEVNULL,
) -> AsyncIterator[Served]:
    """Start `t3d serve` (port 0, replay speed 0) and wait until it serves; SIGKILL it at exit
    if it still runs. ``launcher`` is what follows the interpreter (a wrapper script, say);
    ``stdin`` a descriptor for its stdin (a terminal, say)."""
    argv = [sys.executable, *launcher, "serve", "--port", "0", "--replay-speed", "0", *flags]
    if state_dir is not None:
        argv += ["--state-dir", str(state_dir)]
    process = await trio.lowlevel.open_process(
        argv,
        stdin=stdin,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env or base_env(),
    )
    served = Served(process, state_dir or Path("/nonexistent"))
    async with trio.open_nursery() as nursery:
        try:
            ready = trio.Event()
            nursery.start_soon(_collect_stderr, served, ready)
            await ready.wait()
            assert served.port, f"t3d serve did not start:\n{served.stderr_text()}"
            yield served
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.wait()
            # A spawner the daemon started shares its stderr and may outlive a kill -9.
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_ws(served: Served) -> AsyncIterator[RpcClient]:
    """A WebSocket client on a socket the test owns: the daemon may die under it."""
    async with (
        await trio.open_tcp_stream("127.0.0.1", served.port) as stream,
        trio.open_nursery() as nursery,
    ):
        ws = await trio_websocket.wrap_client_stream(
            nursery,
            stream,
            "127.0.0.1",
            "/ws",
            extra_headers=[(b"Authorization", f"Bearer {served.token}".encode())],
        )
        yield RpcClient(ws)
        await ws.aclose()


def read_db(path: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one read on its own connection (call it in a worker thread)."""
    conn = apsw.Connection(str(path))
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


async def query(path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return await trio.to_thread.run_sync(read_db, path, sql, args)


async def provider_pids(served: Served) -> list[int]:
    rows = await query(served.db_path, "SELECT body FROM sessions")
    return [orjson.loads(body)["pid"] for (body,) in rows]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Wait until every pid has exited (they are not our children: watch their pidfds);
    return those still running after ``seconds``."""
    with trio.move_on_after(seconds):
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                os.close(fd)
    return [pid for pid in pids if alive(pid)]


def kill_leftovers(pids: list[int], state_dir: Path | None = None) -> None:
    """SIGKILL fake providers a dead daemon left behind, and the spawner of ``state_dir``
    (only ours: checked by command line)."""
    spawner = str(state_dir / "spawner.sock").encode() if state_dir else None
    candidates = [*pids, *(int(p) for p in os.listdir("/proc") if p.isdigit())] if spawner else pids
    for pid in candidates:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            fake = b"fake_claude" in cmdline or b"fake_codex" in cmdline
            if (pid in pids and fake) or (spawner and spawner in cmdline):
                os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


