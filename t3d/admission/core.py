"""Admission arithmetic: when may a turn start? Pure: no trio, no apsw, no clock of its own.

Theory of operation. Two limits decide whether a turn that is ready to start
(its thread is free) may start now or is held back, FIFO:

- The saturation gate (`SaturationGate`): the loop is saturated when its lag
  p99 stays at or above the mark for `SATURATE_AFTER_S`; it opens again as
  soon as p99 falls below `REOPEN_FRACTION` of the mark (hysteresis: between
  the two thresholds nothing changes, so it cannot flap around the mark).
  While saturated, turns in their start phase (admitted, provider not yet
  running) are held to `SATURATED_STARTS`, half of `EFFECT_WORKERS`.
  Everything already running continues.
- The cap (`max_active`, 0 = none): turns admitted and not yet ended.
- Memory pressure (`pressure_reading`, when memory admission is on): while
  the level is severe no turn starts; once it clears, turns held for it start
  one per reading, so each can show its cost before the next one starts.

`AdmissionQueue` is the one owner of those counts, so two starts can never
pass the check together. Held turns wait in FIFO order; a turn offered while
others wait queues behind them even if a slot is free. Bounded: a thread has
at most one turn ready to start, so the line holds at most one turn per thread.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

SATURATE_AFTER_S = 2.0
REOPEN_FRACTION = 0.75
# t3d hands effects to sessions without waiting, so it has no worker pool of its own;
# the gate holds turn starts to half of what the seed's server ran with.
EFFECT_WORKERS = 8
SATURATED_STARTS = EFFECT_WORKERS // 2


@attrs.define
class SaturationGate:
    mark_ms: float  # 0 = the gate is off
    saturated: bool = False
    _above_since: float | None = None
    _closed_since: float = 0.0
    closed_total_s: float = 0.0
    transitions: int = 0

    def observe(self, now: float, p99_ms: float) -> bool:
        """Feed one lag reading; True if the gate changed state."""
        if self.mark_ms <= 0:
            return False
        if not self.saturated:
            if p99_ms < self.mark_ms:
                self._above_since = None
                return False
            if self._above_since is None:
                self._above_since = now
            if now - self._above_since < SATURATE_AFTER_S:
                return False
            self.saturated, self._closed_since = True, now
        else:
            if p99_ms >= REOPEN_FRACTION * self.mark_ms:
                return False
            self.saturated, self._above_since = False, None
            self.closed_total_s += now - self._closed_since
        self.transitions += 1
        return True

    def closed_seconds(self, now: float) -> float:
        """Total time saturated so far, including the current spell."""
        return self.closed_total_s + (now - self._closed_since if self.saturated else 0.0)


@attrs.define
class AdmissionQueue:
    max_active: int = 0  # 0 = no cap
    saturated_starts: int = SATURATED_STARTS
    starting: set[str] = attrs.Factory(set)  # admitted, provider not yet running
    active: set[str] = attrs.Factory(set)  # admitted, not yet ended (includes starting)
    held: OrderedDict[str, str] = attrs.Factory(OrderedDict)  # turn id -> hold reason, FIFO
    memory_severe: bool = False  # the last memory-pressure reading was severe
    pressure_tokens: int = 0  # turns held for memory pressure that may start before the next reading

    def blocked(self, saturated: bool) -> str | None:
        """Why a start would be held now, or None."""
        if self.memory_severe:
            return "memory_pressure"
        if self.max_active and len(self.active) >= self.max_active:
            return "max_active_turns"
        if saturated and len(self.starting) >= self.saturated_starts:
            return "loop_saturated"
        return None

    def offer(self, turn_id: str, saturated: bool) -> str | None:
        """A turn is ready to start: admit it (None) or hold it (the reason)."""
        reason = self.blocked(saturated)
        if reason is None and self.held:
            reason = next(iter(self.held.values()))  # others wait first: same reason as theirs
        if reason is not None:
            self.held[turn_id] = reason
            return reason
        self._admit(turn_id)
        return None

    def admit_next(self, saturated: bool) -> list[str]:
        """Held turns that may start now, in order (they count as admitted)."""
        admitted = []
        while self.held and self.blocked(saturated) is None:
            turn_id, reason = next(iter(self.held.items()))
            if reason == "memory_pressure":
                if self.pressure_tokens <= 0:
                    break
                self.pressure_tokens -= 1
            self.held.popitem(last=False)
            self._admit(turn_id)
            admitted.append(turn_id)
        return admitted

    def pressure_reading(self, severe: bool) -> None:
        """A memory-pressure reading: severe holds every start; otherwise one turn held for
        memory pressure may start (per reading)."""
        self.memory_severe = severe
        self.pressure_tokens = 0 if severe else 1

    def _admit(self, turn_id: str) -> None:
        self.starting.add(turn_id)
        self.active.add(turn_id)

    def running(self, turn_id: str) -> None:
        self.starting.discard(turn_id)

    def ended(self, turn_id: str) -> None:
        """The turn reached a terminal status (also when it was cancelled while held)."""
        self.starting.discard(turn_id)
        self.active.discard(turn_id)
        self.held.pop(turn_id, None)
