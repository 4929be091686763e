"""`run_loop_monitor`: how late the loop wakes, sampled continuously.

A task sleeps `INTERVAL_S` and records how much longer than that it slept
(the loop's lag). The last `WINDOW` samples are kept (a ring buffer), enough
for p99/max over the last ~10 s. Health reports them; the admission gate
will read them too.
"""

from __future__ import annotations

from collections import deque

import attrs
import trio

INTERVAL_S = 0.05
WINDOW = 200


@attrs.frozen
class LagStatistics:
    last_ms: float
    p99_ms: float
    max_ms: float


class LoopMonitor:
    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=WINDOW)

    def statistics(self) -> LagStatistics:
        if not self.samples:
            return LagStatistics(0.0, 0.0, 0.0)
        ordered = sorted(self.samples)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return LagStatistics(round(self.samples[-1] * 1000, 3), round(p99 * 1000, 3), round(ordered[-1] * 1000, 3))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            before = trio.current_time()
            await trio.sleep(INTERVAL_S)
            self.samples.append(max(0.0, trio.current_time() - before - INTERVAL_S))
