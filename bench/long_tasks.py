"""What a page's long tasks were made of, from Chromium's timeline trace. Pure.

`web_page --trace` collects the renderer's trace events (bench/chromium.py
`TRACE_CATEGORIES`) and marks where its long-task window begins (`WINDOW_MARK`); `long_tasks` finds each main-thread task over the
bound and `breakdown` names what ran inside it (script calls with their function and
source line, style, layout, paint, garbage collection), nested, longest first, so a long
task can be pinned on the code that made it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

WINDOW_MARK = "t3d:long-task-window"  # a performance.mark: the tasks after it are reported
TASK_NAMES = frozenset({"RunTask", "ThreadControllerImpl::RunTask"})
LONG_TASK_MS = 50.0
SHOWN_MS = 2.0  # parts of a task shorter than this are left out of its breakdown


@attrs.frozen
class Span:
    name: str
    start_us: float
    dur_us: float
    what: str  # the function and its source for a script call, else ""

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def main_threads(events: Iterable[dict[str, Any]]) -> set[tuple[int, int]]:
    """(pid, tid) of each renderer's main thread, from the trace's thread names."""
    return {
        (e["pid"], e["tid"])
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("args", {}).get("name") == "CrRendererMain"
    }


def spans(events: Iterable[dict[str, Any]], thread: tuple[int, int]) -> list[Span]:
    """The complete events (``ph: X``) of ``thread``, by start."""
    out = []
    for e in events:
        if e.get("ph") != "X" or (e.get("pid"), e.get("tid")) != thread or "dur" not in e:
            continue
        out.append(Span(e["name"], float(e["ts"]), float(e["dur"]), _what(e)))
    out.sort(key=lambda s: (s.start_us, -s.dur_us))
    return out


def long_tasks(all_spans: Sequence[Span], over_ms: float = LONG_TASK_MS) -> list[Span]:
    return [s for s in all_spans if s.name in TASK_NAMES and s.dur_us > over_ms * 1000]


def breakdown(task: Span, all_spans: Sequence[Span], shown_ms: float = SHOWN_MS) -> list[tuple[int, Span]]:
    """The parts of ``task`` of at least ``shown_ms``, each with its nesting depth (1: run
    by the task itself), in the order they ran."""
    inside = [
        s for s in all_spans
        if s is not task and s.start_us >= task.start_us and s.end_us <= task.end_us and s.dur_us >= shown_ms * 1000
    ]  # fmt: skip
    out: list[tuple[int, Span]] = []
    open_: list[Span] = []
    for s in inside:
        while open_ and s.start_us >= open_[-1].end_us:
            open_.pop()
        out.append((len(open_) + 1, s))
        open_.append(s)
    return out


def report(events: Sequence[dict[str, Any]], over_ms: float = LONG_TASK_MS) -> list[str]:
    """Lines naming each long task of every renderer main thread and what it ran."""
    lines: list[str] = []
    starts = [float(e["ts"]) for e in events if e.get("name") == WINDOW_MARK and "ts" in e]
    since = min(starts, default=0.0)
    for thread in sorted(main_threads(events)):
        mine = spans(events, thread)
        for task in long_tasks(mine, over_ms):
            if task.start_us < since:
                continue
            lines.append(f"task of {task.dur_us / 1000:.1f} ms, {(task.start_us - since) / 1e6:.3f} s into the window")
            for depth, part in breakdown(task, mine):
                label = f"{part.name} {part.what}".rstrip()
                lines.append(f"{'  ' * depth}{part.dur_us / 1000:7.1f} ms  {label}")
    return lines


def _what(e: dict[str, Any]) -> str:
    data = e.get("args", {}).get("data") or {}
    if not isinstance(data, dict):
        return ""
    name = data.get("functionName") or ""
    url = str(data.get("url") or "").rsplit("/", 1)[-1]
    line = data.get("lineNumber")
    where = f"{url}:{line}" if url and line is not None else url
    return " ".join(part for part in (name, where) if part)
