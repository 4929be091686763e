"""`PressureSampler`: the Trio driver of memory-pressure sampling (`run_pressure_sampler`).

Theory of operation. While someone wants the level, every `interval` seconds
one reading (`readers.read_sample`, in a worker thread: no process is ever
started) goes through the hysteresis (`core.PressureTracker`); while the level
is not ``none``, the agents are sized too and the heaviest named. The payload
(`core.payload`) is pushed to every listener only when it changed.

Who wants the level: opted-in clients (`listen`), and whatever registered a
demand (admission, while it has turns in flight, so a severe host holds new
turn starts). With nobody wanting it the sampler sleeps and keeps nothing:
the next spell starts from ``none`` with a fresh reading. The value lives in
memory only; it is never written to disk.

Rules:
- Bounded: a listener holds at most one undelivered value; a newer value
  replaces it (only the latest level matters).
- A new listener gets the current value at once if the sampler is running,
  else right after the first reading of the new spell.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import trio

from t3d.pressure.core import PressureTracker, heaviest, payload
from t3d.pressure.readers import AgentProcess, agent_sizes, read_sample

log = logging.getLogger("t3d.pressure")


class PressureListener:
    """One opted-in subscriber's mailbox: the latest value not yet sent (at most one)."""

    def __init__(self) -> None:
        self._pending: bytes | None = None
        self._ready = trio.Event()

    def offer(self, encoded: bytes) -> None:
        self._pending = encoded  # replaces an older value not yet sent
        self._ready.set()

    async def receive(self) -> bytes:
        await self._ready.wait()
        self._ready = trio.Event()
        value, self._pending = self._pending, None
        assert value is not None
        return value


class PressureSampler:
    def __init__(
        self,
        root: Path,
        interval: float,
        agents: Callable[[], list[AgentProcess]],
        *,
        uid: int | None = None,
    ) -> None:
        self._root = root
        self._interval = interval
        self._agents = agents
        self._uid = os.getuid() if uid is None else uid
        self._listeners: set[PressureListener] = set()
        self._demands: list[Callable[[], bool]] = []
        self._on_sample: list[Callable[[str], None]] = []
        self._waiters = 0
        self._wake = trio.Event()
        self._fresh = trio.Event()  # set once this spell has a reading
        self._tracker = PressureTracker()
        self.value: dict[str, Any] | None = None
        self._encoded = b""
        self.samples = 0
        self.sampling = False

    # --- who wants it ---------------------------------------------------------------------

    def add_demand(self, wanted: Callable[[], bool]) -> None:
        """Keep sampling while ``wanted()`` is true (checked after every reading)."""
        self._demands.append(wanted)

    def on_sample(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(level)`` after every reading (synchronously; it must not block)."""
        self._on_sample.append(callback)

    def nudge(self) -> None:
        """A demand may have become true: start a spell if the sampler sleeps."""
        self._wake.set()

    def _wanted(self) -> bool:
        return (
            bool(self._listeners) or self._waiters > 0 or any(wanted() for wanted in self._demands)
        )

    async def listen(self) -> PressureListener:
        """Register a listener; it holds the current value when this returns."""
        listener = PressureListener()
        self._listeners.add(listener)
        try:
            await self._wait_fresh()
        except BaseException:
            self._listeners.discard(listener)
            raise
        listener.offer(self._encoded)
        return listener

    def unlisten(self, listener: PressureListener) -> None:
        self._listeners.discard(listener)

    async def fresh_level(self) -> str:
        """The current level, reading it first if the sampler sleeps."""
        self._waiters += 1
        try:
            await self._wait_fresh()
        finally:
            self._waiters -= 1
        return self._tracker.level

    async def _wait_fresh(self) -> None:
        self._wake.set()
        await self._fresh.wait()

    @property
    def level(self) -> str:
        """The level of the running spell; ``none`` while nothing samples."""
        return self._tracker.level

    # --- the loop -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            while not self._wanted():
                self._go_idle()
                await self._wake.wait()
                self._wake = trio.Event()
            self.sampling = True
            await self._sample()
            await trio.sleep(self._interval)

    def _go_idle(self) -> None:
        if self.sampling:
            log.debug("nobody wants the memory pressure level any more; sampling stops")
        self.sampling = False
        self._tracker = PressureTracker()
        self._fresh = trio.Event()
        self.value = None

    async def _sample(self) -> None:
        reading = await trio.to_thread.run_sync(read_sample, self._root, self._uid)
        before = self._tracker.level
        level = self._tracker.observe(trio.current_time(), reading.sample)
        top = []
        if level != "none":
            agents = self._agents()
            top = heaviest(
                await trio.to_thread.run_sync(agent_sizes, self._root, self._uid, agents)
            )
        value = payload(level, top, reading.unavailable)
        self.samples += 1
        if level != before:
            log.log(
                logging.WARNING if level == "severe" else logging.INFO,
                "memory pressure is now %s%s",
                level,
                "".join(
                    f"; {a['thread_id']} uses ~{a['memory_bytes'] >> 20} MiB"
                    for a in value["agents"]
                ),
            )
        if value != self.value:
            self.value = value
            self._encoded = orjson.dumps(value)
            for listener in self._listeners:
                listener.offer(self._encoded)
        self._fresh.set()
        for callback in self._on_sample:
            callback(level)

    def statistics(self) -> dict[str, Any]:
        value = self.value or {"level": "none", "agents": []}
        return {
            **value,
            "sampling": self.sampling,
            "listeners": len(self._listeners),
            "samples": self.samples,
        }


async def run_pressure_sampler(
    sampler: PressureSampler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Sample memory pressure while someone wants it (docs/architecture.md, Watching the host)."""
    await sampler.run(task_status=task_status)
