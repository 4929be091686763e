"""When the database cannot take writes: a full disk or another process's lock.

SQLite's "full" and "busy" errors are mapped once, here, at the writer boundary, onto
`DatabaseFullError` and `DatabaseBusyError` (both a `DatabaseUnavailableError`), and
`probe` tells the writer when the trouble has passed. Runs on the writer thread.

Rules:
- Only troubles that pass on their own count: no room on the filesystem (SQLITE_FULL,
  or an I/O error whose errno is ENOSPC) and a write lock another process holds past
  the busy timeout (SQLITE_BUSY). A write that met one can be retried unchanged; any
  other error is the write's own and is left as it is.
- The message names the fix: the directory to free space on; for a lock, the process
  holding it when /proc/locks shows one.
- `probe` never writes: for "full" it looks at the filesystem's free space, for "busy"
  it takes the write lock and lets it go at once, without waiting.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import apsw

from t3d.errors import DatabaseBusyError, DatabaseFullError, DatabaseUnavailableError

# Free bytes on the database's filesystem for `probe` to call a full disk usable again
# (a commit appends its pages to the WAL: a few pages each, more for a large item).
PROBE_FREE_BYTES = 1 << 20
# SQLite's shared-memory write lock: byte 120 of the -shm file (WAL mode, unix VFS).
_WAL_WRITE_LOCK = 120


def unavailable(exc: BaseException, db_path: str, system_errno: int = 0) -> DatabaseUnavailableError | None:
    """``exc`` as a `DatabaseUnavailableError` (its cause set to ``exc``), or None when it
    is not a trouble that passes. ``system_errno``: the connection's errno after the error."""
    if isinstance(exc, DatabaseUnavailableError):
        return exc
    error: DatabaseUnavailableError
    if isinstance(exc, apsw.FullError) or (isinstance(exc, apsw.IOError) and system_errno == errno.ENOSPC):
        error = DatabaseFullError(
            f"the database is full: free space on {Path(db_path).parent} (SQLite could not write "
            f"{Path(db_path).name}: {exc})"
        )
    elif isinstance(exc, apsw.BusyError):
        error = DatabaseBusyError(f"the database is locked by another process: {_busy_hint(db_path)}")
    else:
        return None
    error.__cause__ = exc
    return error


def _busy_hint(db_path: str) -> str:
    holder = lock_holder(db_path)
    who = f"{holder} holds" if holder else "another program (a sqlite3 shell, a backup, a second t3d on this state dir?) holds"
    return f"{who} a write transaction on {db_path}; end that transaction"


def lock_holder(db_path: str) -> str | None:
    """``pid N (name)`` of another process holding a write lock on the database or its
    WAL index, as /proc/locks shows it; None if none is found (or not on Linux)."""
    targets = set()
    for path in (db_path, db_path + "-shm"):
        try:
            st = os.stat(path)
        except OSError:
            continue
        targets.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino, path.endswith("-shm")))
    try:
        with open("/proc/locks") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        try:
            kind, pid, where, start, end = fields[3], int(fields[4]), fields[5], int(fields[6]), fields[7]
            major, minor, inode = where.split(":")
            device, ino = (int(major, 16), int(minor, 16)), int(inode)
        except (IndexError, ValueError):
            continue
        if kind != "WRITE" or pid == os.getpid():
            continue
        for t_major, t_minor, t_ino, is_shm in targets:
            if (t_major, t_minor, t_ino) != (*device, ino):
                continue
            last = _WAL_WRITE_LOCK if end == "EOF" else int(end)
            if not is_shm or start <= _WAL_WRITE_LOCK <= last:
                return f"pid {pid} ({_name(pid)})"
    return None


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read(64).strip() or "?"
    except OSError:
        return "?"


def probe(conn: apsw.Connection, trouble: DatabaseUnavailableError, db_path: str, busy_timeout_ms: int) -> bool:
    """True when ``trouble`` looks gone: a write is worth trying again. Never writes."""
    if isinstance(trouble, DatabaseFullError):
        try:
            st = os.statvfs(Path(db_path).parent)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= PROBE_FREE_BYTES
    conn.set_busy_timeout(0)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    except apsw.BusyError:
        return False
    finally:
        conn.set_busy_timeout(busy_timeout_ms)
    return True
