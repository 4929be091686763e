"""`Admission`: the one owner that decides when a turn starts (driver of `core.py`).

Turn starts (`StartProviderTurn` effects) pass through `dispatch`: admitted
ones go to their session at once; held ones are recorded as ``queued`` with
their reason (`HoldTurn`) and wait in line. The gate moves on every loop-lag
sample (`on_lag_sample`, called by the monitor: no timer of its own); `run`
wakes when a held turn may start (a turn ended, or the gate reopened) and
starts it (`AdmitTurn`, then the held effect). Committed turn updates tell it
when a turn is running or has ended. Other effects pass straight through:
everything already running continues.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from t3d.admission.core import SATURATED_STARTS, AdmissionQueue, SaturationGate
from t3d.domain import commands as c
from t3d.domain.events import Effect, StartProviderTurn
from t3d.domain.model import TERMINAL_TURN_STATUSES, Turn, TurnItem
from t3d.errors import DomainError
from t3d.loop_monitor import LoopMonitor
from t3d.pressure.sampler import PressureSampler
from t3d.store.commit import Committed
from t3d.store.store import Store

log = logging.getLogger("t3d.admission")


class Admission:
    def __init__(
        self,
        store: Store,
        monitor: LoopMonitor,
        dispatch: Callable[[Effect], Awaitable[None]],
        *,
        mark_ms: float,
        max_active: int,
        pressure: PressureSampler | None = None,
    ) -> None:
        self._store = store
        self._pressure = pressure
        self._monitor = monitor
        self._dispatch = dispatch
        self.gate = SaturationGate(mark_ms)
        self.queue = AdmissionQueue(max_active)
        self._held_effects: dict[str, StartProviderTurn] = {}
        self._lock = trio.Lock()  # an offer and its HoldTurn commit never interleave with admits
        self._wake = trio.Event()
        monitor.on_sample(self.on_lag_sample)
        if pressure is not None:  # T3D_PRESSURE_ADMISSION=on
            pressure.on_sample(self.on_pressure_sample)
            # Keep reading while turns wait for memory; otherwise one reading per turn start
            # (`dispatch`) when nobody listens, so the sampler sleeps between them.
            pressure.add_demand(lambda: "memory_pressure" in self.queue.held.values())

    @property
    def enabled(self) -> bool:
        return self.gate.mark_ms > 0 or self.queue.max_active > 0 or self._pressure is not None

    def on_commit(self, committed: Committed) -> None:
        for event in committed.events:
            turn = event.entity
            if isinstance(turn, TurnItem):  # a held turn's prompt edited (turn.edit): start with it
                held = self._held_effects.get(turn.turn_id)
                if held is not None and turn.id == f"{turn.turn_id}:user" and turn.text is not None:
                    self._held_effects[turn.turn_id] = attrs.evolve(held, text=turn.text)
                continue
            if not isinstance(turn, Turn) or (turn.origin or {}).get("kind") == "subagent":
                continue  # a subagent's turn runs inside its parent's: it takes no slot of its own
            if turn.status in ("running", "waiting"):
                self.queue.running(turn.id)
            elif turn.status in TERMINAL_TURN_STATUSES:
                self.queue.ended(turn.id)
                self._held_effects.pop(turn.id, None)
            else:
                continue
            if self.queue.held:  # a start slot or an active slot may have freed up
                self._wake.set()

    async def dispatch(self, effect: Effect) -> None:
        if not isinstance(effect, StartProviderTurn) or not self.enabled:
            await self._dispatch(effect)
            return
        if self._pressure is not None:
            await self._pressure.fresh_level()  # a reading now if the sampler sleeps
        async with self._lock:
            reason = self.queue.offer(effect.turn_id, self.gate.saturated)
            if reason is not None:
                self._held_effects[effect.turn_id] = effect
                try:
                    await self._store.record(c.HoldTurn(effect.turn_id, reason))
                except DomainError:  # it ended (interrupted) before it could be held
                    self.queue.ended(effect.turn_id)
                    self._held_effects.pop(effect.turn_id, None)
                return
        await self._dispatch(effect)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.enabled:
            return
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            async with self._lock:
                for turn_id in self.queue.admit_next(self.gate.saturated):
                    effect = self._held_effects.pop(turn_id, None)
                    try:
                        await self._store.record(c.AdmitTurn(turn_id))
                    except DomainError:  # cancelled while held
                        self.queue.ended(turn_id)
                        continue
                    if effect is not None:
                        await self._dispatch(effect)

    def on_lag_sample(self, now: float) -> None:
        if self.gate.mark_ms <= 0:
            return
        p99 = self._monitor.recent_p99_ms()
        if not self.gate.observe(now, p99):
            return
        if self.gate.saturated:
            log.warning(
                "the event loop is saturated (lag p99 %.0f ms >= %.0f ms for 2 s): new turns start at most %d at a time",
                p99, self.gate.mark_ms, SATURATED_STARTS,
            )
        else:
            log.info("the event loop has recovered (lag p99 %.0f ms); turns start freely again", p99)
            self._wake.set()

    def on_pressure_sample(self, level: str) -> None:
        severe = level == "severe"
        if severe != self.queue.memory_severe:
            if severe:
                log.warning("memory pressure is severe: new turns are held until it clears")
            else:
                log.info("memory pressure is no longer severe: held turns start one per reading")
        self.queue.pressure_reading(severe)
        if self.queue.held:
            self._wake.set()

    def statistics(self) -> dict[str, Any]:
        state = "off" if self.gate.mark_ms <= 0 else "saturated" if self.gate.saturated else "open"
        return {
            "state": state,
            "mark_ms": self.gate.mark_ms,
            "max_active_turns": self.queue.max_active,
            "held_turns": len(self.queue.held),
            "memory_pressure": "off" if self._pressure is None else "severe" if self.queue.memory_severe else "clear",
            "starting_turns": len(self.queue.starting),
            "active_turns": len(self.queue.active),
            "saturated_s": round(self.gate.closed_seconds(trio.current_time()), 3),
        }
