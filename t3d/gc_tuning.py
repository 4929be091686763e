"""The cyclic garbage collector in a serving process: fewer, shorter pauses, and visible.

A collection holds the GIL for as long as it runs, so it stalls the loop and
every thread at once. Measured at PRIMARY 250 with CPython's defaults: a full
collection every ~17 s, each 90-150 ms over ~150k objects, and about 200
younger collections of 3-5 ms in four minutes. They were the longest loop stalls
(loop lag max 174 ms) and much of the tail of a subscribe's first chunk
(p95 64.5 ms with the defaults, 32.0 ms tuned, in the same benchmark run).

`tune_gc` (called once by ``t3d serve``, before the loop starts):
- freezes the objects of start-up (modules, classes, functions): never scanned again;
- starts a young collection after `YOUNG_THRESHOLD` tracked allocations instead
  of 700, so the short-lived objects of a request or an event are freed by
  reference counting before a collection could promote them; fewer promotions
  mean rarer full collections. The older generations keep CPython's rules (a
  full collection once long-lived objects grew by a quarter), so memory stays
  proportional to what is live. Garbage in reference cycles waits longer, for
  minutes: code that lets go of large buffers must not leave them in a cycle
  (t3d/api/feeds.py frees a closed connection's subscription buffers itself; before it
  did, 100 never-reading clients grew RSS by ~140 MiB between full collections).
- The cost: with many long-lived objects a full collection is long. At PRIMARY
  250 with 100 never-reading clients (~25,000 subscriptions) one took 650-850 ms,
  about every 7 minutes; `/api/health` shows each generation's longest pause.

`GcPauses` times every collection (two clock reads each) for `/api/health`, the
stall record (the last pause, and when) and ``/metrics`` (its `on_pause` listeners).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

YOUNG_THRESHOLD = 10_000

# How many objects `tune_gc` froze: `gc.get_freeze_count` walks the whole frozen list
# (~100k objects, a few ms), too slow for every /api/health; it moves only with a freeze.
_frozen: int | None = None


def tune_gc() -> None:
    """Freeze what exists now and raise the young threshold (see above); once, at start-up."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = gc.get_freeze_count()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def frozen_objects() -> int:
    """Objects frozen (never scanned again): counted once, at `tune_gc`."""
    return gc.get_freeze_count() if _frozen is None else _frozen


class GcPauses:
    """Counts collections per generation and their pause times while `installed`.
    Bounded: a few numbers per generation."""

    def __init__(self) -> None:
        self._started = 0.0
        self.count = [0, 0, 0]
        self.total_s = [0.0, 0.0, 0.0]
        self.max_s = [0.0, 0.0, 0.0]
        # The last collection: its generation, its pause and when it ended (time.monotonic()).
        self.last: tuple[int, float, float] | None = None
        # Called with (generation, pause in seconds) after each collection, in the thread
        # that collected; they must be quick and must not allocate much.
        self.on_pause: list[Callable[[int, float], None]] = []

    @contextmanager
    def installed(self) -> Iterator[GcPauses]:
        """Time collections while inside (the daemon's lifetime); remove the hook after."""
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took, generation = time.perf_counter() - self._started, info["generation"]
        self.count[generation] += 1
        self.total_s[generation] += took
        self.max_s[generation] = max(self.max_s[generation], took)
        self.last = (generation, took, time.monotonic())
        for listener in self.on_pause:
            listener(generation, took)

    def statistics(self) -> dict[str, Any]:
        """For /api/health: per generation, collections, total and longest pause (ms);
        the thresholds in force and how many objects are frozen."""
        return {
            "threshold": list(gc.get_threshold()),
            "frozen_objects": frozen_objects(),
            "generations": [
                {
                    "collections": self.count[g],
                    "pause_ms_total": round(self.total_s[g] * 1000, 1),
                    "pause_ms_max": round(self.max_s[g] * 1000, 1),
                }
                for g in range(3)
            ],
        }
