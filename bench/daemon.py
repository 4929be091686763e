"""Starting and stopping the daemon under test, and the state it starts from.

``prepare_state`` makes a fresh state dir (or one holding a copy of ``--db``), a project
directory that is a git repository, and a ``git`` shim first on the daemon's PATH that
counts every git process started by the daemon or its spawner. ``open_daemon`` runs
``t3d serve`` as a subprocess with that state dir, only the given ``T3D_*`` settings (the
caller's own are dropped, so a run is reproducible) and its output in a log file; it is
ready when ``GET /api/health`` answers. `restart_process` starts it again on the same state
dir and port (its log appended). On exit it stops the daemon and every agent
(``server.shutdown {stop_agents: true}``, as `t3d ctl shutdown --stop-agents`), then like a
service manager would (SIGTERM, a grace period, SIGKILL), shielded and bounded.

Before a daemon starts, `compile_bytecode` writes the ``.pyc`` files of ``t3d`` and
``spawner`` (into their ``__pycache__``, ignored by git), so every start and restart is
timed as an installed daemon's (pip compiles a wheel's modules at install); under
``PYTHONDONTWRITEBYTECODE`` every start would otherwise compile every module again
(about a third of the start's CPU).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import h11
import trio

from bench.client import HttpClient, HttpError, http_get_once
from bench.fixture import REPO

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 30.0
SHUTDOWN_ASK_S = 5.0
REAL_GIT = shutil.which("git")


def compile_bytecode() -> None:
    """Byte-compile the daemon's and the spawner's modules (those up to date are skipped)."""
    import compileall

    for package in ("t3d", "spawner"):
        compileall.compile_dir(REPO / package, quiet=1)


class DaemonFailed(Exception):
    """The daemon did not start, or died during the run."""


@attrs.frozen
class StateDir:
    root: Path
    project: Path
    git_log: Path | None

    @property
    def spawner_socket(self) -> str:
        return str(self.root / "spawner.sock")

    @property
    def token_path(self) -> Path:
        return self.root / "auth" / "token"


def prepare_state(root: Path, db: Path | None) -> StateDir:
    root.mkdir(parents=True)
    if db is not None:
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(db) + suffix)
            if source.exists():
                shutil.copyfile(source, root / f"t3d.sqlite{suffix}")
    project = root / "project"
    project.mkdir()
    (project / "notes.txt").write_text("hello\n")
    git_log: Path | None = None
    if REAL_GIT is not None:
        env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
               "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}  # fmt: skip
        for argv in (["init", "-q"], ["add", "notes.txt"], ["commit", "-q", "-m", "bench project"]):
            subprocess.run([REAL_GIT, *argv], cwd=project, env=env, check=True, capture_output=True)
        shim_dir = root / "bench-bin"
        shim_dir.mkdir()
        git_log = root / "git-calls.log"
        shim = shim_dir / "git"
        shim.write_text(f'#!/bin/sh\nprintf "g\\n" >> "{git_log}"\nexec "{REAL_GIT}" "$@"\n')
        shim.chmod(0o755)
    return StateDir(root, project, git_log)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_env(state: StateDir, settings: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("T3D_")}
    if state.git_log is not None:
        env["PATH"] = f"{state.root / 'bench-bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(settings)
    return env


@attrs.define
class RunningDaemon:
    process: trio.Process  # the current one: a restart replaces it
    port: int
    token: str
    state: StateDir
    log: Path
    exit_code: int | None = None
    stop_s: float | None = None
    argv: list[str] = attrs.field(factory=list)
    env: dict[str, str] = attrs.field(factory=dict)


def pin_prefix(cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


@asynccontextmanager
async def open_daemon(
    state: StateDir,
    fixture: Path,
    settings: Mapping[str, str],
    log: Path,
    *,
    cpus: str | None = None,
    codex_fixture: Path | None = None,
) -> AsyncIterator[RunningDaemon]:
    port = free_port()
    argv = [*pin_prefix(cpus), sys.executable, "-m", "t3d", "serve", "--state-dir", str(state.root),
            "--port", str(port), "--replay-fixture", str(fixture), "--replay-speed", "1",
            "--log-level", "warning"]  # fmt: skip
    if codex_fixture is not None:  # the replay-codex provider's (bench --provider codex|mix)
        argv += ["--replay-codex-fixture", str(codex_fixture)]
    env = daemon_env(state, settings)
    await trio.to_thread.run_sync(compile_bytecode)
    with log.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=state.root
        )
    daemon = RunningDaemon(process, port, "", state, log, argv=argv, env=env)
    try:
        await _wait_ready(daemon)
        daemon.token = state.token_path.read_text().strip()
        yield daemon
    finally:
        with trio.CancelScope(shield=True):
            await stop_daemon(daemon)


async def restart_process(daemon: RunningDaemon) -> None:
    """Start `t3d serve` again as before (the old process has ended); wait until it serves."""
    with daemon.log.open("ab") as log_file:
        daemon.process = await trio.lowlevel.open_process(
            daemon.argv, stdout=log_file, stderr=subprocess.STDOUT, env=daemon.env, cwd=daemon.state.root
        )
    await _wait_ready(daemon)


async def _wait_ready(daemon: RunningDaemon) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if daemon.process.returncode is not None:
            raise DaemonFailed(
                f"t3d serve exited with status {daemon.process.returncode} at start; see {daemon.log}:\n{tail(daemon.log)}"
            )
        try:
            status, _ = await http_get_once(daemon.port, "/api/health")
            if status == 200 and daemon.state.token_path.exists():
                return
        except OSError:
            pass
        await trio.sleep(0.05)
    raise DaemonFailed(
        f"t3d serve did not answer /api/health within {READY_TIMEOUT_S:g} s; see {daemon.log}"
    )


async def stop_daemon(daemon: RunningDaemon) -> None:
    """``server.shutdown {stop_agents: true}`` (else SIGTERM), wait ``STOP_GRACE_S``, then
    SIGKILL; records the exit code and stop time."""
    process = daemon.process
    started = time.monotonic()
    if process.returncode is None:
        if not await _ask_shutdown(daemon):
            process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_GRACE_S):
            await process.wait()
        if process.returncode is None:
            process.kill()
    daemon.exit_code = await process.wait()
    daemon.stop_s = time.monotonic() - started


async def _ask_shutdown(daemon: RunningDaemon) -> bool:
    """Ask the daemon to stop with its agents; False when it did not agree."""
    if not daemon.token:
        return False
    frame = {"jsonrpc": "2.0", "id": 1, "method": "server.shutdown", "params": {"stop_agents": True}}
    client = HttpClient(daemon.port, daemon.token)
    try:
        with trio.move_on_after(SHUTDOWN_ASK_S):
            reply = await client.request("POST", "/api/dispatch", frame)
            return isinstance(reply, dict) and "result" in reply
        return False
    except (HttpError, OSError, trio.BrokenResourceError, h11.ProtocolError):
        return False
    finally:
        await client.aclose()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
