"""Real database faults for tests: another process holding SQLite's write lock, a small
filesystem that fills up.

`lock_held_by_another_process` starts a second Python process that takes ``BEGIN
IMMEDIATE`` on the database and holds it until the block ends. `small_tmpfs` mounts a
tmpfs of a few MiB (root only; the test is skipped with the reason elsewhere), and
`fill` writes a ballast file into it until the filesystem is full.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
import trio

_LOCKER = """
import sys, apsw
conn = apsw.Connection(sys.argv[1])
conn.execute("PRAGMA busy_timeout=30000")
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@asynccontextmanager
async def lock_held_by_another_process(db_path: Path) -> AsyncIterator[trio.Process]:
    """A second process holds the database's write lock (``BEGIN IMMEDIATE``) for the block."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", _LOCKER, str(db_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        with trio.fail_after(30):
            said = b""
            while b"\n" not in said:
                chunk = await process.stdout.receive_some()
                assert chunk, "the lock holder ended before it took the lock"
                said += chunk
        assert said.strip() == b"locked", said
        yield process
    finally:
        with trio.CancelScope(shield=True):
            with contextlib.suppress(trio.BrokenResourceError):
                await process.stdin.send_all(b"go\n")
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


@contextmanager
def small_tmpfs(path: Path, size_mib: int = 20) -> Iterator[Path]:
    """``path`` as a fresh tmpfs of ``size_mib`` MiB; skips the test where that is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("the full-disk test mounts a tmpfs, which needs root; run the suite as root to include it")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem has no room left; the bytes written. Blocking."""
    written = 0
    block = b"\0" * (64 * 1024)
    with open(path, "ab", buffering=0) as f:
        while True:
            try:
                written += f.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    # Room for a few bytes may remain below one block: take it too.
    with open(path, "ab", buffering=0) as f:
        for size in (4096, 512, 1):
            while True:
                try:
                    written += f.write(b"\0" * size)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return written
