"""The pure memory-pressure core: PSI parsing, the level's hysteresis table, the 30 s
fallback, size rounding and ranking (t3d/pressure/core.py), plus the admission arithmetic
for memory pressure (t3d/admission/core.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from t3d.admission.core import AdmissionQueue
from t3d.pressure.core import (
    STALE_S,
    AgentMemory,
    PressureTracker,
    Psi,
    PsiFormatError,
    Sample,
    heaviest,
    next_level,
    parse_psi,
    payload,
    round_size,
)

KERNEL = (
    "some avg10=12.50 avg60=3.10 avg300=0.80 total=123456\n"
    "full avg10=6.40 avg60=1.00 avg300=0.20 total=65432\n"
)


def psi(some: float = 0.0, full: float = 0.0) -> Psi:
    return Psi(some=some, full=full)


# --- parsing ---------------------------------------------------------------------------------


def test_parse_psi_reads_the_avg10_of_both_lines_as_the_kernel_writes_them() -> None:
    assert parse_psi(KERNEL) == Psi(some=12.5, full=6.4)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no 'some' or 'full' line"),
        ("some avg10=1.00 avg60=0 avg300=0 total=0\n", "no 'full' line"),
        ("some avg60=1.00\nfull avg10=0\n", "no avg10="),
        ("some avg10=abc\nfull avg10=0\n", "not a number"),
        ("some avg10=nan\nfull avg10=0\n", "not a percentage"),
        ("some avg10=-1\nfull avg10=0\n", "not a percentage"),
        ("some avg10=100.01\nfull avg10=0\n", "not a percentage"),
        ("cpu avg10=1\n", "starts with 'cpu'"),
        ("some avg10=1\nsome avg10=2\nfull avg10=0\n", "repeats"),
    ],
)
def test_a_malformed_psi_file_is_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(PsiFormatError, match=says):
        parse_psi(text)


@given(st.text(max_size=200))
def test_parse_psi_never_raises_anything_but_psi_format_error(text: str) -> None:
    try:
        value = parse_psi(text)
    except PsiFormatError:
        return
    assert 0 <= value.some <= 100 and 0 <= value.full <= 100


@given(st.floats(0, 100), st.floats(0, 100))
def test_parse_psi_round_trips_what_the_kernel_prints(some: float, full: float) -> None:
    text = f"some avg10={some:.2f} avg60=0.00 avg300=0.00 total=1\nfull avg10={full:.2f} avg60=0.00 avg300=0.00 total=1\n"
    assert parse_psi(text) == Psi(float(f"{some:.2f}"), float(f"{full:.2f}"))


# --- the level: the seed's thresholds, exactly ------------------------------------------------

TABLE = [
    # previous, host (some, full) or None, agents full or None, expected
    ("none", (0.0, 0.0), None, "none"),
    ("none", (0.0, 1.99), None, "none"),
    ("none", (0.0, 2.0), None, "elevated"),  # host full >= 2 %
    ("none", (9.99, 0.0), None, "none"),
    ("none", (10.0, 0.0), None, "elevated"),  # host some >= 10 %
    ("none", (99.0, 0.0), None, "elevated"),  # host some alone never makes severe
    ("none", None, 4.99, "none"),
    ("none", None, 5.0, "elevated"),  # agents full >= 5 %
    ("none", (0.0, 9.99), None, "elevated"),
    ("none", (0.0, 10.0), None, "severe"),  # host full >= 10 %
    ("none", None, 19.99, "elevated"),
    ("none", None, 20.0, "severe"),  # agents full >= 20 %
    ("none", (0.0, 6.4), 84.7, "severe"),  # the seed's incident reading
    # left only well below (half of) the threshold that holds the level
    ("elevated", (0.0, 1.0), None, "elevated"),
    ("elevated", (0.0, 0.99), None, "none"),
    ("elevated", (5.0, 0.0), None, "elevated"),
    ("elevated", (4.99, 0.0), None, "none"),
    ("elevated", None, 2.5, "elevated"),
    ("elevated", None, 2.49, "none"),
    ("severe", (0.0, 5.0), None, "severe"),
    ("severe", (0.0, 4.99), None, "elevated"),
    ("severe", None, 10.0, "severe"),
    ("severe", None, 9.99, "elevated"),
    ("severe", (0.0, 0.5), 1.0, "none"),
    ("severe", None, None, "severe"),  # nothing readable: the level stays (see the fallback)
    ("none", None, None, "none"),  # a host without PSI stays none
]


@pytest.mark.parametrize(("previous", "host", "agents", "expected"), TABLE)
def test_the_level_follows_the_seeds_thresholds_with_hysteresis(
    previous: str, host: tuple[float, float] | None, agents: float | None, expected: str
) -> None:
    sample = Sample(
        None if host is None else psi(*host), None if agents is None else psi(full=agents)
    )
    assert next_level(previous, sample) == expected  # type: ignore[arg-type]


percent = st.floats(0, 100)
samples = st.builds(
    Sample,
    st.none() | st.builds(Psi, percent, percent),
    st.none() | st.builds(Psi, percent, percent),
)
levels = st.sampled_from(["none", "elevated", "severe"])


@given(levels, samples)
def test_a_steady_reading_settles_at_once(previous: str, sample: Sample) -> None:
    """The level a reading leads to is a fixed point of that reading: no flapping on a steady host."""
    level = next_level(previous, sample)  # type: ignore[arg-type]
    assert next_level(level, sample) == level


def _scaled(sample: Sample, factor: float) -> Sample:
    def scale(value: Psi | None) -> Psi | None:
        return (
            None
            if value is None
            else Psi(min(value.some * factor, 100.0), min(value.full * factor, 100.0))
        )

    return Sample(scale(sample.host), scale(sample.agents))


@given(samples, st.floats(0.51, 1.0), st.integers(2, 40))
def test_readings_that_waver_by_less_than_half_change_the_level_at_most_twice(
    sample: Sample, factor: float, rounds: int
) -> None:
    """A host whose readings alternate between x and x*f (f > 0.5) climbs at most
    none -> elevated -> severe and never drops: the hysteresis absorbs the wavering."""
    low = _scaled(sample, factor)
    level, changes = "none", 0
    for step in range(rounds):
        new = next_level(level, sample if step % 2 == 0 else low)  # type: ignore[arg-type]
        changes += new != level
        level = new
    assert changes <= 2


@given(levels, samples)
def test_a_level_is_never_entered_below_its_threshold(previous: str, sample: Sample) -> None:
    level = next_level(previous, sample)  # type: ignore[arg-type]
    rank = ["none", "elevated", "severe"]
    if rank.index(level) > rank.index(previous):
        host, agents = sample.host or psi(), sample.agents or psi()
        if level == "severe":
            assert host.full >= 10 or agents.full >= 20
        else:
            assert host.full >= 2 or host.some >= 10 or agents.full >= 5


@given(levels, samples, samples)
def test_more_pressure_never_gives_a_lower_level(previous: str, a: Sample, b: Sample) -> None:
    def most(x: Psi | None, y: Psi | None) -> Psi | None:
        if x is None or y is None:
            return x or y
        return Psi(max(x.some, y.some), max(x.full, y.full))

    rank = ["none", "elevated", "severe"]
    worse = Sample(most(a.host, b.host), most(a.agents, b.agents))
    if a.readable:
        assert rank.index(next_level(previous, worse)) >= rank.index(next_level(previous, a))  # type: ignore[arg-type]


def test_with_no_readable_source_for_30_s_the_level_falls_back_to_none() -> None:
    tracker = PressureTracker()
    assert tracker.observe(0.0, Sample(psi(full=50), None)) == "severe"
    nothing = Sample(None, None)
    assert tracker.observe(10.0, nothing) == "severe"
    assert tracker.observe(STALE_S - 0.01, nothing) == "severe"
    assert tracker.observe(STALE_S, nothing) == "none"
    assert tracker.observe(STALE_S + 5, Sample(psi(), None)) == "none"


# --- sizes -------------------------------------------------------------------------------------


def test_a_28_mb_agent_does_not_round_to_0() -> None:
    assert 26_000_000 <= round_size(28_000_000) <= 30_000_000


@given(st.integers(1, 1 << 50))
def test_rounding_keeps_a_size_within_a_sixteenth_and_never_zero(size: int) -> None:
    rounded = round_size(size)
    assert rounded > 0 and abs(rounded - size) <= size / 16


def test_sizes_snap_to_a_grid_so_small_growth_leaves_the_value_alone() -> None:
    """1.00 GiB and 1.02 GiB report the same size: growth within a grid step sends no update."""
    assert round_size(1 << 30) == round_size(int((1 << 30) * 1.02))


def test_ranking_uses_raw_sizes_and_keeps_three() -> None:
    agents = [
        AgentMemory("a", 1_000_000_000, "pss"),
        AgentMemory("b", 1_010_000_000, "pss"),  # rounds like a, but is heavier
        AgentMemory("c", 28_000_000, "pss"),
        AgentMemory("d", 5_000_000, "pss"),
    ]
    top = heaviest(agents)
    assert [a.thread_id for a in top] == ["b", "a", "c"]
    assert top[2].size == round_size(28_000_000)


def test_the_payload_names_agents_only_while_the_level_is_not_none() -> None:
    agents = [AgentMemory("a", 1 << 30, "scope")]
    assert payload("none", agents, None) == {"level": "none", "agents": []}
    assert payload("severe", agents, None)["agents"] == [
        {"thread_id": "a", "memory_bytes": 1 << 30, "source": "scope"}
    ]
    assert payload("none", [], "no PSI")["unavailable"] == "no PSI"


# --- admission under memory pressure ------------------------------------------------------------


def test_while_severe_turns_are_held_and_once_clear_start_one_per_reading() -> None:
    queue = AdmissionQueue()
    queue.pressure_reading(severe=True)
    assert [queue.offer(t, False) for t in ("t1", "t2", "t3")] == ["memory_pressure"] * 3
    assert queue.admit_next(False) == []
    queue.pressure_reading(severe=False)
    assert queue.offer("t4", False) == "memory_pressure"  # behind the others
    assert queue.admit_next(False) == ["t1"]
    assert queue.admit_next(False) == []  # the next one waits for the next reading
    queue.pressure_reading(severe=False)
    assert queue.admit_next(False) == ["t2"]
    queue.pressure_reading(severe=True)
    assert queue.admit_next(False) == []
    for _ in range(2):
        queue.pressure_reading(severe=False)
        queue.admit_next(False)
    assert not queue.held and queue.offer("t5", False) is None
