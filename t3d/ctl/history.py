"""A thread's turns one after another: `t3d ctl attach` live, `t3d ctl log` from history. Pure.

`ThreadFollower` is fed what ``subscribe.thread`` sends (snapshot chunks, events) and
renders each turn with its own :class:`TurnRenderer`: the open turn the attach finds,
then every later one, each between a header and an outcome line. It follows one turn
at a time, the oldest open one; a turn that ended before the attach is not replayed
(that is `log`'s job). `format_log` renders finished history the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from t3d.ctl.render import (
    REPLAY_NOTES,
    TERMINAL_TURN_STATUSES,
    Rendered,
    TurnRenderer,
    final_error,
    format_duration,
    one_line,
)

JsonDict = dict[str, Any]

OUTCOME_ERROR_CHARS = 160


def _clock(at: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if isinstance(at, int | float) else "?"


def turn_header(turn: Mapping[str, Any]) -> str:
    """``── turn 3 · 2026-12-01 09:53 ──``."""
    return f"── turn {turn.get('ordinal', '?')} · {_clock(turn.get('requested_at'))} ──"


def turn_outcome(turn: Mapping[str, Any], now: float, *, thread_id: str | None = None) -> str:
    """How a turn ended (or how long an open one has run): ``── turn 3 completed in 12s ──``."""
    ordinal, status = turn.get("ordinal", "?"), str(turn.get("status") or "?")
    started, ended = turn.get("started_at"), turn.get("completed_at")
    reverted = " · reverted" if turn.get("reverted_at") else ""
    if status not in TERMINAL_TURN_STATUSES:
        since = started or turn.get("requested_at")
        took = f" for {format_duration(now - since)}" if isinstance(since, int | float) else ""
        follow = f"; follow it with `t3d ctl attach {thread_id}`" if thread_id else ""
        return f"── turn {ordinal} {status}{took}{follow} ──"
    took = ""
    if isinstance(started, int | float) and isinstance(ended, int | float):
        took = f" {'in' if status == 'completed' else 'after'} {format_duration(ended - started)}"
    why = "" if status == "completed" else f": {one_line(final_error(turn), OUTCOME_ERROR_CHARS)}"
    if why == f": {status}":
        why = ""
    return f"── turn {ordinal} {status}{took}{why}{reverted} ──"


def _merge(into: Rendered, part: Rendered) -> None:
    into.out += part.out
    into.err += part.err
    into.asks.extend(part.asks)
    into.settled.extend(part.settled)


def _dicts(value: Any) -> list[JsonDict]:
    if isinstance(value, dict):
        return [value]
    return [row for row in value if isinstance(row, dict)] if isinstance(value, list) else []


class ThreadFollower:
    """Renders a thread's turns as they happen; see the module docstring.

    ``json_lines``: each turn's events as JSON lines (the renderer's), no headers.
    ``project_dirs`` (project id -> path) shortens paths under the thread's directory.
    """

    def __init__(self, thread_id: str, *, json_lines: bool = False, project_dirs: Mapping[str, str] | None = None) -> None:
        self.thread_id = thread_id
        self.json_lines = json_lines
        self._project_dirs = project_dirs or {}
        self.thread: JsonDict | None = None
        self.gone = False  # the thread was deleted
        self._turns: dict[str, JsonDict] = {}
        self._ended: set[str] = set()
        self._current: TurnRenderer | None = None
        self._based = False
        self._replay_noted = False

    @property
    def current_turn(self) -> JsonDict | None:
        return self._current.turn if self._current else None

    @property
    def following(self) -> str | None:
        """The id of the turn being shown, None while the thread is idle."""
        return self._current.turn_id if self._current else None

    # -- feeding -----------------------------------------------------------

    def feed_thread(self, thread: Any) -> Rendered:
        """The thread's row alone: its notes (a replay, archived), to show before its turns."""
        result = Rendered()
        if isinstance(thread, dict):
            self._thread_row(thread, result)
        return result

    def feed_snapshot(self, snapshot: Mapping[str, Any], now: float) -> Rendered:
        """A whole snapshot (the subscription's base, its chunks joined): the thread row,
        turns, items, requests. The first one decides what is history."""
        result = Rendered()
        thread = snapshot.get("thread")
        if isinstance(thread, dict):
            self._thread_row(thread, result)
        turns = _dicts(snapshot.get("turns"))
        for turn in turns:
            self._turns[str(turn.get("id"))] = turn
        if not self._based:
            self._based = True
            self._skip_past(result, now)
        rest = {"turns": turns, "items": snapshot.get("items") or [], "requests": snapshot.get("requests") or []}
        self._drive(result, now, lambda renderer: renderer.feed_snapshot(rest))
        return result

    def feed_event(self, event: Mapping[str, Any], now: float) -> Rendered:
        """One ``event`` notification's data."""
        result = Rendered()
        kind, entity = event.get("kind"), event.get("entity")
        if not isinstance(entity, dict):
            return result
        if kind == "thread.updated" and entity.get("id") == self.thread_id:
            self._thread_row(entity, result)
        elif kind == "thread.deleted" and entity.get("id") == self.thread_id:
            self._end_current(result, now, abandoned=True)
            self.gone = True
            result.err += f"thread {self.thread_id} was deleted; nothing more to follow\n"
            return result
        elif kind == "turn.updated":
            self._turns[str(entity.get("id"))] = entity
        elif kind in ("item.updated", "request.updated") and self._current is None:
            turn_id = str(entity.get("turn_id"))
            if turn_id not in self._ended and turn_id not in self._turns:
                self._turns[turn_id] = {"id": turn_id, "thread_id": self.thread_id, "status": "running"}
        self._drive(result, now, lambda renderer: renderer.feed_event(event))
        return result

    def _drive(self, result: Rendered, now: float, feed: Callable[[TurnRenderer], Rendered]) -> None:
        """Feed the turn being shown; when it ends, show its outcome and go on to the next."""
        self._pick(result)
        while self._current is not None:
            _merge(result, feed(self._current))
            if not self._current.done:
                return
            self._end_current(result, now)
            self._pick(result)

    def finish(self) -> Rendered:
        """Stop following (detach): end the open line, settle the questions asked."""
        result = Rendered()
        if self._current is not None:
            _merge(result, self._current.finish(abandoned=True))
        return result

    # -- turns -------------------------------------------------------------

    def _thread_row(self, thread: JsonDict, result: Rendered) -> None:
        before = self.thread
        self.thread = thread
        note = REPLAY_NOTES.get(str(thread.get("provider")))
        if note is not None and not self._replay_noted:
            self._replay_noted = True
            result.err += note + "\n"
        if before is not None and bool(before.get("archived_at")) != bool(thread.get("archived_at")):
            if thread.get("archived_at"):
                result.err += f"thread {self.thread_id} was archived (its open turns are cancelled); still following\n"
            else:
                result.err += f"thread {self.thread_id} was unarchived\n"

    def _skip_past(self, result: Rendered, now: float) -> None:
        """At the attach: finished turns are history; say what the thread is doing."""
        past = [t for t in self._turns.values() if t.get("status") in TERMINAL_TURN_STATUSES]
        self._ended.update(str(t.get("id")) for t in past)
        if any(t.get("status") not in TERMINAL_TURN_STATUSES for t in self._turns.values()):
            return
        last = max(past, key=lambda t: t.get("ordinal") or 0, default=None)
        said = "it has no turns yet"
        if last is not None:
            at = last.get("completed_at")
            ago = f" {format_duration(now - at)} ago" if isinstance(at, int | float) else ""
            said = f"its last turn, #{last.get('ordinal')}, {last.get('status')}{ago} (`t3d ctl log {self.thread_id}` shows it)"
        result.err += f"thread {self.thread_id} is idle; {said}. Waiting for its next turn (Ctrl-C detaches)\n"

    def _pick(self, result: Rendered) -> None:
        """Follow the oldest open turn not shown yet, if none is being shown."""
        if self._current is not None or not self._based or self.gone:
            return
        waiting = [t for tid, t in self._turns.items() if tid not in self._ended]
        if not waiting:
            return
        turn = min(waiting, key=lambda t: t.get("ordinal") or 1 << 62)
        renderer = TurnRenderer(str(turn.get("id")), json_lines=self.json_lines, show_prompt=True)
        thread = self.thread or {}
        renderer.cwd = thread.get("worktree_path") or self._project_dirs.get(str(thread.get("project_id")))
        renderer.replay = thread.get("provider") in REPLAY_NOTES
        self._current = renderer
        if not self.json_lines and turn.get("ordinal") is not None:
            result.out += turn_header(turn) + "\n"
        _merge(result, renderer.feed_snapshot({"turns": [turn]}))

    def _end_current(self, result: Rendered, now: float, *, abandoned: bool = False) -> None:
        renderer, self._current = self._current, None
        if renderer is None:
            return
        self._ended.add(renderer.turn_id)
        _merge(result, renderer.finish(abandoned=True))
        if not self.json_lines and not abandoned and renderer.turn is not None:
            result.out += turn_outcome(renderer.turn, now) + "\n"


# -- log ----------------------------------------------------------------------------


def format_log(
    thread: Mapping[str, Any],
    turns: Sequence[Mapping[str, Any]],
    items: Iterable[Mapping[str, Any]],
    requests: Iterable[Mapping[str, Any]],
    now: float,
    *,
    cwd: str | None = None,
) -> str:
    """A thread's turns, oldest first, each as attach shows it: header, prompt, what the
    agent said and did, and how it ended (questions still open are named, not asked)."""
    by_turn: dict[str, list[Mapping[str, Any]]] = {}
    for item in items:
        by_turn.setdefault(str(item.get("turn_id")), []).append(item)
    pending: dict[str, list[Mapping[str, Any]]] = {}
    for request in requests:
        pending.setdefault(str(request.get("turn_id")), []).append(request)
    chunks = []
    thread_id = str(thread.get("id"))
    for turn in sorted(turns, key=lambda t: t.get("ordinal") or 0):
        renderer = TurnRenderer(str(turn.get("id")), show_prompt=True, cwd=cwd)
        renderer.replay = thread.get("provider") in REPLAY_NOTES
        shown = renderer.feed_snapshot(
            {"turns": [turn], "items": by_turn.get(str(turn.get("id")), []), "requests": pending.get(str(turn.get("id")), [])}
        )
        text = shown.out
        for ask in shown.asks:
            text += f"{ask.question} (waiting for an answer: `t3d ctl attach {thread_id}` asks it)\n"
        text += renderer.finish(abandoned=True).out
        chunks.append(f"{turn_header(turn)}\n{text}{turn_outcome(turn, now, thread_id=thread_id)}\n")
    return "\n".join(chunks)


def log_json_lines(turns: Sequence[Mapping[str, Any]], items: Iterable[Mapping[str, Any]]) -> str:
    """`log --json`: one line per turn, oldest first: ``{"turn": ..., "items": [...]}``."""
    by_turn: dict[str, list[Mapping[str, Any]]] = {}
    for item in items:
        by_turn.setdefault(str(item.get("turn_id")), []).append(item)
    lines = [
        orjson.dumps({"turn": turn, "items": by_turn.get(str(turn.get("id")), [])}).decode()
        for turn in sorted(turns, key=lambda t: t.get("ordinal") or 0)
    ]
    return "".join(line + "\n" for line in lines)
