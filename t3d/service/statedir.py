"""The state dir: private, held by one daemon at a time, its database files private.

Rules:
- The state dir is created mode 0700. One that already exists and that group or others
  may enter is left as it is (it may be shared on purpose), with a warning naming the
  fix, ``chmod 700 DIR``.
- ``<state>/daemon.lock`` is held with ``flock(LOCK_EX)`` for the daemon's whole life,
  taken before anything reads or writes the database. The kernel drops it when the
  process ends, however it ends, so a dead daemon never leaves a lock to clean up. The
  file holds the holder's pid, for messages only. A second daemon is refused with
  `ServiceError` naming the holder (pid, URL) and how to stop it.
- A start waits up to `LOCK_WAIT_S` for a held lock: `lock_held` (what ``t3d ctl`` uses
  to tell a stale daemon.json) takes a shared lock for an instant.
- ``t3d.sqlite`` is created 0600 before SQLite opens it; SQLite gives its ``-wal`` and
  ``-shm`` files the database's mode. Existing files that group or others may read are
  tightened to 0600, with a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from t3d.errors import ConfigError, ServiceError
from t3d.service import runfile
from t3d.service.runfile import RunFile

log = logging.getLogger("t3d")

LOCK_NAME = "daemon.lock"
LOCK_WAIT_S = 1.0
_LOCK_RETRY_S = 0.05
_DIR_MODE = 0o700
_FILE_MODE = 0o600
DATABASE_SUFFIXES = ("", "-wal", "-shm")


def make_state_dir(state_dir: Path) -> str | None:
    """Create ``state_dir`` (0700) if needed; a warning when an existing one is not private."""
    try:
        state_dir.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        mode = stat.S_IMODE(state_dir.stat().st_mode)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the state directory {state_dir}: {exc.strerror}; "
            "make its parent writable or choose another with --state-dir"
        ) from exc
    if mode & 0o077:
        return (
            f"the state directory {state_dir} is open to other users (mode {mode:04o}); "
            f"it holds the API token and every session: make it private with `chmod 700 {state_dir}`"
        )
    return None


def secure_database(db_path: Path) -> list[str]:
    """Create the database file 0600 if missing; tighten existing database files. Warnings."""
    warnings = []
    with contextlib.suppress(FileExistsError):
        os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE))
    for suffix in DATABASE_SUFFIXES:
        path = Path(f"{db_path}{suffix}")
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                path.chmod(_FILE_MODE)
                warnings.append(f"{path} was open to other users (mode {mode:04o}); made it 0600")
        except FileNotFoundError:
            continue
    return warnings


def try_lock(state_dir: Path) -> int | None:
    """The state dir's lock, as an open descriptor that holds it; None while another holds it."""
    fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_held(state_dir: Path) -> bool | None:
    """Whether a daemon holds ``state_dir``'s lock; None when that cannot be told."""
    try:
        fd = os.open(state_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops the shared lock, if we got it
    return False


def holder_pid(state_dir: Path) -> int | None:
    try:
        text = (state_dir / LOCK_NAME).read_text(encoding="ascii").strip()
        return int(text) if text else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def stop_hint(state_dir: Path, pid: int | None) -> str:
    """How to stop the daemon with ``pid`` on ``state_dir``."""
    unit = runfile.systemd_unit_of(pid) if pid else None
    if unit is not None and unit.startswith("t3d"):
        return f"stop it with `systemctl --user stop {unit}`"
    return f"stop it with `t3d ctl shutdown --state-dir {state_dir}`"


def already_running(state_dir: Path) -> ServiceError:
    """The error for a start on a state dir another daemon holds."""
    try:
        run = runfile.read_runfile(state_dir)
    except runfile.RunFileError:
        run = None
    pid = holder_pid(state_dir)
    if run is not None and (pid is None or run.pid == pid):
        who = f"pid {run.pid}, serving on {run.url} since {run.started_at}"
        pid = run.pid
    elif pid is not None:
        who = f"pid {pid}, still starting"
    else:
        who = "pid unknown"
    return ServiceError(
        f"another t3d daemon runs on the state directory {state_dir} ({who}); "
        f"{stop_hint(state_dir, pid)}, or use another --state-dir"
    )


class HeldStateDir:
    """The state dir this daemon holds: its lock, and its daemon.json once published."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._published = False

    def publish(self, run: RunFile) -> None:
        """Write daemon.json (removed again when the daemon stops cleanly)."""
        runfile.write_runfile(self.path, run)
        self._published = True

    def release(self) -> None:
        if self._published:
            runfile.remove_runfile(self.path)
            self._published = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def _take_lock(state_dir: Path) -> int:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fd = try_lock(state_dir)
        except OSError as exc:
            raise ConfigError(
                f"cannot open the lock file {state_dir / LOCK_NAME}: {exc.strerror}; "
                "make the state directory writable or choose another with --state-dir"
            ) from exc
        if fd is not None:
            return fd
        if time.monotonic() >= deadline:
            raise already_running(state_dir)
        await trio.sleep(_LOCK_RETRY_S)


@asynccontextmanager
async def hold_state_dir(state_dir: Path, db_path: Path) -> AsyncIterator[HeldStateDir]:
    """Make the state dir, hold its lock and make the database files private, for the block.

    Raises ServiceError when another daemon holds it, ConfigError when it cannot be made.
    """
    warning = make_state_dir(state_dir)
    if warning:
        log.warning("%s", warning)
    held = HeldStateDir(state_dir, await _take_lock(state_dir))
    try:
        try:
            runfile.remove_runfile(state_dir)  # whoever wrote one is gone: we hold the lock
            for tightened in secure_database(db_path):
                log.warning("%s", tightened)
        except OSError as exc:
            raise ConfigError(
                f"cannot prepare the database files in {state_dir}: {exc}; "
                "make the state directory and its files writable by this user"
            ) from exc
        yield held
    finally:
        held.release()


def running_daemon(state_dir: Path) -> tuple[RunFile | None, str | None]:
    """The daemon.json of ``state_dir`` and, when the daemon it names is gone, why.

    (None, None) when there is no daemon.json, or one that t3d did not write.
    """
    try:
        run = runfile.read_runfile(state_dir)
    except runfile.RunFileError:
        return None, None
    if run is None:
        return None, None
    if not runfile.pid_alive(run.pid):
        why = f"its pid {run.pid} is gone"
    elif lock_held(state_dir) is False:
        why = f"no daemon holds {state_dir / LOCK_NAME}; pid {run.pid} is another process now"
    else:
        return run, None
    return run, (
        f"{runfile.path_in(state_dir)} is stale: the daemon it names (pid {run.pid}, "
        f"{run.url}, started {run.started_at}) did not stop cleanly ({why})"
    )
