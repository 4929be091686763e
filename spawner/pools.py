"""Process pools: how many short-lived commands of each kind run at once.

Sizes: git ``max(8, min(32, cpus // 4))``, where cpus is the smaller of the
affinity mask and the cgroup CPU quota; forge CLIs (gh, glab, tea) 4 of their
own, so a slow forge call never holds a git slot; everything else 8.

A request that finds its pool full waits for a slot (FIFO) and its wait is
measured. Bounded: at most `MAX_WAITING` requests wait per pool (more get an
error reply at once); the last `WAIT_SAMPLES` waits are kept for percentiles.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from typing import Any

MAX_WAITING = 4096
WAIT_SAMPLES = 1024
FORGE_POOL = 4
OTHER_POOL = 8


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs allowed by the cgroup quota (v2 ``cpu.max`` or v1 cfs), None when unlimited."""
    try:
        quota, period = _read(f"{root}/cpu.max").split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(_read(f"{root}/cpu/cpu.cfs_quota_us"))
        period_us = int(_read(f"{root}/cpu/cpu.cfs_period_us"))
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def available_cpus() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus


def default_git_pool(cpus: int) -> int:
    return max(8, min(32, cpus // 4))


class PoolBusyError(Exception):
    pass


class Pool:
    """A counting slot pool with FIFO waiters and wait statistics. Thread-safe."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self._lock = threading.Lock()
        self._busy = 0
        self._waiters: deque[threading.Event] = deque()
        self._waits: deque[float] = deque(maxlen=WAIT_SAMPLES)
        self._completed = 0
        self._max_wait = 0.0

    def acquire(self) -> float:
        """Take a slot, waiting in line if needed. Returns the seconds waited."""
        start = time.monotonic()
        with self._lock:
            if self._busy < self.size and not self._waiters:
                self._busy += 1
                ticket = None
            elif len(self._waiters) >= MAX_WAITING:
                raise PoolBusyError(f"{len(self._waiters)} {self.name} commands are already waiting")
            else:
                ticket = threading.Event()
                self._waiters.append(ticket)
        if ticket is not None:
            ticket.wait()  # release() hands its slot straight to us
        waited = time.monotonic() - start
        with self._lock:
            self._waits.append(waited)
            self._max_wait = max(self._max_wait, waited)
        return waited

    def release(self) -> None:
        with self._lock:
            self._completed += 1
            if self._waiters:
                self._waiters.popleft().set()  # the slot passes on; busy stays the same
            else:
                self._busy -= 1

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            waits = sorted(self._waits)
            return {
                "size": self.size,
                "busy": self._busy,
                "queued": len(self._waiters),
                "completed": self._completed,
                "wait_ms": {
                    "p50": _percentile(waits, 0.50) * 1000,
                    "p99": _percentile(waits, 0.99) * 1000,
                    "max": self._max_wait * 1000,
                    "samples": len(waits),
                },
            }


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
