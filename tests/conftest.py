"""Shared fixtures, and one guard for every test: no SQLite on the Trio thread.

Every apsw connection opened in the test process gets an execution tracer
that records any statement run while a Trio run is active on the calling
thread. The loop must only ever hand SQLite work to the writer thread or a
reader thread; a test that makes the loop touch SQLite fails.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import apsw
import pytest
import trio

_violations: list[str] = []


def _trace(cursor: Any, sql: str, bindings: Any) -> bool:
    if trio.lowlevel.in_trio_run():
        _violations.append(f"{sql.strip()[:80]!r} on {threading.current_thread().name}")
    return True


def _hook(conn: apsw.Connection) -> None:
    conn.exec_trace = _trace


apsw.connection_hooks.append(_hook)


@pytest.fixture(autouse=True)
def no_sqlite_on_the_loop() -> Iterator[None]:
    _violations.clear()
    yield
    assert not _violations, f"SQLite ran on the Trio thread: {_violations[:3]}"
