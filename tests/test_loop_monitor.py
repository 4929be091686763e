"""The loop monitor on a real Trio loop: lag is measured, and a stall names its culprit."""

from __future__ import annotations

import itertools
import time

import pytest
import trio

from t3d.loop_monitor import LoopMonitor


async def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # noqa: ASYNC251  (the point: a task that blocks the loop)


async def test_a_stall_over_1_s_is_measured_and_names_the_task_step_that_caused_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = LoopMonitor()
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.run)
        await trio.sleep(0.05)
        nursery.start_soon(hold_the_loop, 1.2)
        await trio.sleep(1.5)  # past the stall, so the monitor has recorded it
        nursery.cancel_scope.cancel()
    stats = monitor.statistics()
    assert stats.max_ms >= 1000 and monitor.recent_p99_ms() >= 1000
    [warning] = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
    assert "slowest task steps: " in warning and "hold_the_loop" in warning.split("slowest task steps: ")[1].split(",")[0]


async def test_an_idle_loop_is_sampled_ten_times_a_second_and_a_busy_one_a_hundred() -> None:
    """The monitor sleeps 100 ms between samples while nothing else runs and 10 ms once other
    tasks do. Checked on the sleeps it chose (the gap between two samples less the lag the
    second one measured), not on a count per second, which a loaded machine lowers."""
    monitor = LoopMonitor()

    ticks = 0

    async def busy() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.005)

    def chosen_sleeps(samples: list[tuple[float, float]]) -> list[float]:
        return sorted(round(b[0] - a[0] - b[1], 3) for a, b in itertools.pairwise(samples))

    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.run)
        await trio.sleep(1.0)
        idle = list(monitor.samples)
        nursery.start_soon(busy)
        await trio.sleep(1.0)
        busy_samples = list(monitor.samples)[len(idle) + 1 :]
        nursery.cancel_scope.cancel()
    assert len(idle) >= 3 and len(busy_samples) >= 3 and ticks > 0
    idle_sleeps, busy_sleeps = chosen_sleeps(idle[1:]), chosen_sleeps(busy_samples)
    assert idle_sleeps[len(idle_sleeps) // 2] == pytest.approx(0.1, abs=0.002), idle_sleeps
    assert busy_sleeps[len(busy_sleeps) // 2] == pytest.approx(0.01, abs=0.002), busy_sleeps


async def test_the_gate_reads_the_last_second_and_health_the_last_ten() -> None:
    """`recent_p99_ms` (the admission gate's reading) covers the samples of the last
    second only, `statistics` those of the last `WINDOW_S`: a 500 ms lag 3 s ago is in the
    health window's max and p99, not in the gate's; older than the window it is in neither."""
    monitor = LoopMonitor()
    now = trio.current_time()
    monitor.record(now - 20.0, 0.9)  # kept in the ring, but outside every window
    monitor.record(now - 3.0, 0.5)
    for n in range(100):
        monitor.record(now - 0.99 + n * 0.01, 0.002 if n != 50 else 0.004)
    assert monitor.recent_p99_ms() == pytest.approx(4.0)
    stats = monitor.statistics()
    assert stats.max_ms == pytest.approx(500.0) and stats.p99_ms == pytest.approx(4.0)
    assert stats.p50_ms == pytest.approx(2.0) and stats.last_ms == pytest.approx(2.0)
    assert monitor.samples[0] == (now - 20.0, 0.9) and len(monitor.samples) == 102
