"""Admission arithmetic (pure): the saturation gate's hysteresis and the admission line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from t3d.admission.core import (
    REOPEN_FRACTION,
    SATURATE_AFTER_S,
    SATURATED_STARTS,
    AdmissionQueue,
    SaturationGate,
)

MARK = 40.0
readings = st.lists(
    st.tuples(st.floats(0.01, 1.0), st.floats(0.0, 3 * MARK)), min_size=1, max_size=200
)


def test_the_seed_s_gate_closes_after_2_s_at_the_mark_and_reopens_below_three_quarters() -> None:
    gate = SaturationGate(MARK)
    t = 0.0
    for _ in range(19):  # 1.9 s at the mark: still open
        assert not gate.observe(t, 40.0)
        t += 0.1
    assert not gate.saturated
    assert gate.observe(t + 0.1, 45.0) and gate.saturated  # 2.0 s
    assert not gate.observe(t + 1, 30.0)  # between 30 and 40: stays closed
    assert gate.observe(t + 2, 29.9) and not gate.saturated
    assert gate.closed_total_s == 1.9
    assert not SaturationGate(0).observe(0, 10_000)  # mark 0: the gate is off


@given(readings)
def test_the_gate_moves_only_when_a_threshold_is_crossed(trace: list[tuple[float, float]]) -> None:
    gate = SaturationGate(MARK)
    now, above_since = 0.0, None
    for step, p99 in trace:
        now += step
        was = gate.saturated
        changed = gate.observe(now, p99)
        above_since = (above_since if above_since is not None else now) if p99 >= MARK else None
        assert changed == (gate.saturated != was)
        if changed and gate.saturated:
            # Closed only after the lag stayed at or above the mark for the whole hold time.
            assert above_since is not None and now - above_since >= SATURATE_AFTER_S
        if changed and not gate.saturated:
            assert p99 < REOPEN_FRACTION * MARK
        if not changed and was:
            assert p99 >= REOPEN_FRACTION * MARK  # no reopening from between the thresholds
    assert gate.closed_seconds(now) <= now


@given(st.lists(st.floats(REOPEN_FRACTION * MARK, MARK * 0.999), min_size=1, max_size=100))
def test_no_flapping_between_the_thresholds(between: list[float]) -> None:
    """Readings between ¾ of the mark and the mark change nothing, open or closed."""
    for start_saturated in (False, True):
        gate = SaturationGate(MARK)
        if start_saturated:
            gate.observe(0, MARK)
            gate.observe(SATURATE_AFTER_S, MARK)
        for n, p99 in enumerate(between):
            assert not gate.observe(SATURATE_AFTER_S + 1 + n, p99)
        assert gate.saturated == start_saturated


class AdmissionLine(RuleBasedStateMachine):
    """Any interleaving of offers, provider starts, ends and gate changes keeps the promises."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = AdmissionQueue(max_active=3)
        self.saturated = False
        self.next_id = 0
        self.held_order: list[str] = []
        self.admitted_order: list[str] = []

    def _note_admitted(self, turn_ids: list[str]) -> None:
        for turn_id in turn_ids:
            assert turn_id == self.held_order.pop(0), "held turns start in the order they were held"
            self.admitted_order.append(turn_id)

    @rule()
    def offer(self) -> None:
        turn_id = f"t{self.next_id}"
        self.next_id += 1
        starting_before = len(self.queue.starting)
        reason = self.queue.offer(turn_id, self.saturated)
        if reason is None:
            assert not self.held_order, "nobody jumps the line"
            if self.saturated:
                assert starting_before < SATURATED_STARTS
        else:
            assert reason in ("max_active_turns", "loop_saturated")
            self.held_order.append(turn_id)

    @rule(saturated=st.booleans())
    def gate_moves(self, saturated: bool) -> None:
        self.saturated = saturated
        self._note_admitted(self.queue.admit_next(saturated))

    @precondition(lambda self: bool(self.queue.starting))
    @rule(data=st.data())
    def provider_runs(self, data: st.DataObject) -> None:
        self.queue.running(data.draw(st.sampled_from(sorted(self.queue.starting))))

    @precondition(lambda self: bool(self.queue.active or self.queue.held))
    @rule(data=st.data())
    def turn_ends(self, data: st.DataObject) -> None:
        turn_id = data.draw(st.sampled_from(sorted(self.queue.active | set(self.queue.held))))
        self.queue.ended(turn_id)
        if turn_id in self.held_order:
            self.held_order.remove(turn_id)  # cancelled while held
        self._note_admitted(self.queue.admit_next(self.saturated))

    @invariant()
    def the_cap_holds(self) -> None:
        assert len(self.queue.active) <= 3
        assert self.queue.starting <= self.queue.active
        assert not (set(self.queue.held) & self.queue.active)
        assert list(self.queue.held) == self.held_order


TestAdmissionLine = AdmissionLine.TestCase
