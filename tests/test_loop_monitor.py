"""The loop monitor on a real Trio loop: lag is measured, and a stall names its culprit."""

from __future__ import annotations

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
    monitor = LoopMonitor()

    ticks = 0

    async def busy() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.005)

    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.run)
        await trio.sleep(1.0)
        idle_samples = len(monitor.samples)
        nursery.start_soon(busy)
        await trio.sleep(1.0)
        busy_samples = len(monitor.samples) - idle_samples
        nursery.cancel_scope.cancel()
    assert idle_samples <= 12
    assert busy_samples >= 50 and ticks > 0
