"""`run_heap_trimmer`: every `TRIM_INTERVAL_S`, the C heap's free pages go back to the OS.

Theory of operation. Python's small objects live in pymalloc's own mmap'd arenas; every
larger block (a provider line, an encoded frame, a dict's table, a list's array) comes
from glibc's heap, and glibc gives freed memory back to the OS only from a heap's top. A
block still in use above free ones pins them: at PRIMARY 250 the heap's free chunks grew
from 18 to 23 MiB in ten minutes while what was in use stayed at ~15 MiB, and RSS grew
with them (docs/benchmarks.md, round 6). `malloc_tuning.trim_heap` (``malloc_trim(0)``)
returns every whole free page, wherever it is.

Rules:
- The trim runs in a worker thread (ctypes lets go of the GIL): the loop keeps running,
  and waits only if it allocates from an arena while the trim holds that arena's lock.
- Visible: `HeapTrims.statistics` (``/api/health``'s ``heap_trim``) counts the trims,
  the MiB of RSS they gave back in all, and the longest.
- Off glibc it stops after the first try: there is nothing to trim.
"""

from __future__ import annotations

import os
import time
from typing import Any

import attrs
import trio

from t3d.malloc_tuning import trim_heap

TRIM_INTERVAL_S = 30.0


def _resident_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@attrs.define
class HeapTrims:
    available: bool = True
    trims: int = 0
    released_bytes: int = 0
    longest_s: float = 0.0

    def statistics(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "interval_s": TRIM_INTERVAL_S,
            "trims": self.trims,
            "released_mib": round(self.released_bytes / 2**20, 1),
            "longest_ms": round(self.longest_s * 1000, 2),
        }

    def trim(self) -> None:
        """One trim, timed, with the RSS it gave back (run it in a worker thread)."""
        try:
            before = _resident_bytes()
        except OSError:  # no /proc: not Linux, so not glibc either
            self.available = False
            return
        started = time.perf_counter()
        if trim_heap() is None:
            self.available = False
            return
        self.longest_s = max(self.longest_s, time.perf_counter() - started)
        self.trims += 1
        self.released_bytes += max(0, before - _resident_bytes())


async def run_heap_trimmer(
    trims: HeapTrims, *, interval_s: float = TRIM_INTERVAL_S, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    task_status.started()
    while trims.available:
        await trio.sleep(interval_s)
        await trio.to_thread.run_sync(trims.trim)
