"""bench/long_tasks.py: a long task in Chromium's trace is named with what ran inside it."""

from __future__ import annotations

from typing import Any

from bench import long_tasks

MAIN = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "CrRendererMain"}}
OTHER = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "Compositor"}}


def x(name: str, ts_ms: float, dur_ms: float, tid: int = 7, **data: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "X", "name": name, "pid": 1, "tid": tid, "ts": ts_ms * 1000, "dur": dur_ms * 1000}
    if data:
        event["args"] = {"data": data}
    return event


def test_a_long_task_is_broken_down_into_its_nested_parts_with_script_sources() -> None:
    """Only main-thread tasks over 50 ms after the window's mark are reported; each part of
    at least 2 ms is listed in order, indented by nesting, a script call with its function
    and file:line."""
    events = [
        MAIN, OTHER,
        x("RunTask", 0, 90),  # before the window: left out
        {"ph": "R", "name": long_tasks.WINDOW_MARK, "pid": 1, "tid": 7, "ts": 100_000},
        x("RunTask", 200, 30),  # short
        x("RunTask", 300, 80),
        x("FunctionCall", 301, 20, functionName="render", url="http://h/js/shell.js", lineNumber=254),
        x("Layout", 305, 10),  # inside the call
        x("Layout", 330, 40),
        x("Paint", 371, 1),  # under 2 ms: left out
        x("RunTask", 300, 90, tid=9),  # not the main thread
    ]  # fmt: skip
    assert long_tasks.report(events) == [
        "task of 80.0 ms, 0.200 s into the window",
        "     20.0 ms  FunctionCall render shell.js:254",
        "       10.0 ms  Layout",
        "     40.0 ms  Layout",
    ]


def test_without_a_window_mark_every_long_task_counts() -> None:
    """A trace with no mark (the window began with the trace) reports from its start."""
    events = [MAIN, x("ThreadControllerImpl::RunTask", 5, 60), x("MajorGC", 6, 58)]
    lines = long_tasks.report(events)
    assert lines[0].startswith("task of 60.0 ms")
    assert "MajorGC" in lines[1]
