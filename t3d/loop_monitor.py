"""`LoopMonitor.run`: how late the loop wakes, sampled continuously.

A task sleeps `INTERVAL_S` (10 ms) and records how much longer than that it
slept: the loop's lag. While nothing else has run since its last sample (an
idle daemon) it sleeps `IDLE_INTERVAL_S` instead, so idling costs ten wakeups
a second, not a hundred; the first task step of new work brings it back to
10 ms on its next sample (a stall still shows: the monitor oversleeps it).
Samples are kept for `WINDOW_S` seconds (a ring buffer of at most `WINDOW`
timestamped samples). Health reports p50/p99/max over the window; the
admission gate reads p99 over the last second.

A Trio instrument times every task step and keeps the slowest few since the
last report (bounded: `SLOW_STEPS`). A stall (lag at or over the threshold,
``--loop-stall-threshold``, default `STALL_WARNING_S`) logs one warning: the
stall's length, the task steps that held the loop and, from `describe_stall`
(set by the daemon), what the rest of the daemon looked like right after it:
RSS, GC state and the writer queue. In JSON logs each is a field of its own.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import trio

log = logging.getLogger("t3d.loop")

INTERVAL_S = 0.01
IDLE_INTERVAL_S = 0.1
WINDOW_S = 10.0
WINDOW = int(WINDOW_S / INTERVAL_S)
STALL_WARNING_S = 1.0
SLOW_STEPS = 5
# /api/health's window percentiles are recomputed at most this often (the latest lag is live).
STATISTICS_REUSE_S = 0.1


@attrs.frozen
class LagStatistics:
    last_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


class StepTimer(trio.abc.Instrument):
    """Times task steps; keeps the `SLOW_STEPS` slowest (duration, task name) seen.

    One hook per step, not two: a step is timed from the end of the step before it (or
    from the end of the scheduler's I/O wait, when it came first), so what the scheduler
    does between two steps counts in the second. Trio calls each hook through a loop in
    Python, and at STRESS load a second hook per step cost ~2 % of the daemon's time."""

    def __init__(self) -> None:
        self._mark = time.perf_counter()
        self.slowest: list[tuple[float, str]] = []  # a min-heap of the slowest steps
        self.owner: trio.lowlevel.Task | None = None  # the monitor's own task
        self.others_ran = False  # a task other than the monitor stepped since the last take()

    def after_io_wait(self, timeout: float) -> None:
        self._mark = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        now = time.perf_counter()
        took, self._mark = now - self._mark, now
        if task is not self.owner:
            self.others_ran = True
        slowest = self.slowest
        if len(slowest) < SLOW_STEPS:
            heapq.heappush(slowest, (took, task.name))
        elif took > slowest[0][0]:
            heapq.heapreplace(slowest, (took, task.name))

    def take(self) -> list[tuple[float, str]]:
        slowest, self.slowest = sorted(self.slowest, reverse=True), []
        self.others_ran = False
        return slowest


class LoopMonitor:
    def __init__(self, *, stall_threshold_s: float = STALL_WARNING_S) -> None:
        # The samples, as two rings side by side (when, and lag in s): a window's lags are
        # found by bisecting the times and sorted in C, with no Python per sample (the
        # admission gate reads the last second's p99 after every sample).
        self._when: deque[float] = deque(maxlen=WINDOW)
        self._lag: deque[float] = deque(maxlen=WINDOW)
        self._statistics: tuple[float, float, float, float] | None = None  # (when, p50, p99, max)
        self._steps = StepTimer()
        self._listeners: list[Callable[[float], None]] = []
        self.stall_threshold_s = stall_threshold_s
        self.stalls = 0
        # What a stall record says of the rest of the daemon: (text, structured fields).
        self.describe_stall: Callable[[], tuple[str, dict[str, Any]]] | None = None

    def on_sample(self, listener: Callable[[float], None]) -> None:
        """Call ``listener(now)`` after every sample (on the loop; it must not block)."""
        self._listeners.append(listener)

    @property
    def samples(self) -> list[tuple[float, float]]:
        """The kept samples, oldest first: (when, lag in s)."""
        return list(zip(self._when, self._lag, strict=True))

    @property
    def latest_lag_s(self) -> float:
        """The last sample's lag (0.0 before the first)."""
        return self._lag[-1] if self._lag else 0.0

    def record(self, now: float, lag: float) -> None:
        self._when.append(now)
        self._lag.append(lag)
        for listener in self._listeners:
            listener(now)

    def _since(self, now: float, seconds: float) -> list[float]:
        """The lags sampled in the last ``seconds``, sorted (samples come in time order)."""
        first = bisect.bisect_left(self._when, now - seconds)
        # From the newest end: islice from `first` would step over the older samples.
        return sorted(itertools.islice(reversed(self._lag), len(self._lag) - first))

    def statistics(self) -> LagStatistics:
        """The latest lag, and p50/p99/max over the last `WINDOW_S` (those three computed at
        most every `STATISTICS_REUSE_S`: sorting the window for every health probe cost more
        than the probe's answer)."""
        if not self._lag:
            return LagStatistics(0.0, 0.0, 0.0, 0.0)
        now = trio.current_time()
        last = round(self._lag[-1] * 1000, 3)
        cached = self._statistics
        if cached is None or now - cached[0] >= STATISTICS_REUSE_S or now < cached[0]:
            ordered = self._since(now, WINDOW_S) or [0.0]
            cached = self._statistics = (
                now,
                round(_percentile(ordered, 0.50) * 1000, 3),
                round(_percentile(ordered, 0.99) * 1000, 3),
                round(ordered[-1] * 1000, 3),
            )
        return LagStatistics(last, cached[1], cached[2], max(cached[3], last))

    def recent_p99_ms(self, seconds: float = 1.0) -> float:
        """p99 lag over the last ``seconds`` (what the admission gate watches)."""
        return _percentile(self._since(trio.current_time(), seconds), 0.99) * 1000

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._steps.owner = trio.lowlevel.current_task()
        trio.lowlevel.add_instrument(self._steps)
        try:
            task_status.started()
            interval = INTERVAL_S
            while True:
                before = trio.current_time()
                await trio.sleep(interval)
                now = trio.current_time()
                lag = max(0.0, now - before - interval)
                self.record(now, lag)
                interval = INTERVAL_S if self._steps.others_ran else IDLE_INTERVAL_S
                slowest = self._steps.take()
                if lag >= self.stall_threshold_s:
                    self._stalled(lag, slowest)
        finally:
            trio.lowlevel.remove_instrument(self._steps)

    def _stalled(self, lag: float, slowest: list[tuple[float, str]]) -> None:
        """One record per stall: its length, the slowest task steps, and the daemon's state."""
        self.stalls += 1
        steps = [{"task": name, "ms": round(took * 1000, 1)} for took, name in slowest]
        text, fields = "", dict[str, Any]()
        if self.describe_stall is not None:
            try:
                text, fields = self.describe_stall()
            except Exception as exc:  # the record goes out without it
                text = f"; (the daemon's state could not be read: {exc!r})"
        listed = ", ".join(f"{step['task']} {step['ms']:.0f} ms" for step in steps) or "none recorded"
        log.warning(
            "the event loop stalled for %.2f s; slowest task steps: %s%s",
            lag, listed, text,
            extra={"event": "loop_stall", "stall_s": round(lag, 3), "slowest_steps": steps, **fields},
        )  # fmt: skip
