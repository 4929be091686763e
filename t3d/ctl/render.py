"""What `t3d ctl` writes to the terminal: pure functions of the daemon's entities.

No trio, no I/O: :class:`TurnRenderer` is fed event dicts (``{"kind",
"sequence", "entity"}``) and snapshot objects and returns :class:`Rendered`
text plus the approval questions to ask; the driver (``turn.py``) writes
the text and asks.

Rules of the turn renderer:
- Only the run's own turn counts; entities of other turns are ignored.
- Entities may arrive again, or older than what was seen (resync, snapshot
  chunks): a text is printed by suffix only (printed length per item), a
  tool line, a result line and a question once each. Nothing is printed twice.
- An assistant message streams without a newline until it completes;
  anything else printed first ends the open line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import orjson

JsonDict = dict[str, Any]

TERMINAL_TURN_STATUSES = frozenset({"completed", "interrupted", "failed", "cancelled"})
SUMMARY_CHARS = 80  # a tool call's input summary
RESULT_CHARS = 100  # a tool result's first line
# Input fields that say most about a tool call, best first.
_TELLING_KEYS = (
    "file_path",
    "notebook_path",
    "path",
    "command",
    "pattern",
    "url",
    "query",
    "description",
    "prompt",
)


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _shorten_path(value: str, cwd: str | None) -> str:
    if cwd and value.startswith(cwd.rstrip("/") + "/"):
        return value[len(cwd.rstrip("/")) + 1 :]
    return value


def summarize_input(tool_input: Any, *, cwd: str | None = None, limit: int = SUMMARY_CHARS) -> str:
    """The telling part of a tool's input: ``notes.txt`` for a Read, the command for a Bash."""
    if not isinstance(tool_input, Mapping) or not tool_input:
        return "" if tool_input in (None, {}) else one_line(str(tool_input), limit)
    for key in _TELLING_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return one_line(_shorten_path(value, cwd), limit)
    parts = (f"{key}: {value}" for key, value in tool_input.items())
    return one_line(", ".join(parts), limit)


def tool_line(name: str, tool_input: Any, *, cwd: str | None = None) -> str:
    """``⏺ Read(notes.txt)``."""
    return f"⏺ {name}({summarize_input(tool_input, cwd=cwd)})"


def result_line(result: Any, *, failed: bool, recorded: bool = False) -> str:
    """``  ⎿  first line of the result`` (``Error: ...`` for a failed call; ``recorded: ...``
    for a replay, whose results are the recording's, whatever was answered here)."""
    text = "" if result is None else str(result)
    lines = [line for line in text.splitlines() if line.strip()]
    first = one_line(lines[0], RESULT_CHARS) if lines else ("failed" if failed else "done")
    more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    return f"  ⎿  {'recorded: ' if recorded else ''}{'Error: ' if failed and lines else ''}{first}{more}"


PROMPT_MARK = "\u203a"  # a single right-pointing angle quotation mark
PROMPT_LINES = 6  # a prompt's lines shown by attach and log; the rest are counted


def prompt_lines(text: str, limit: int = PROMPT_LINES) -> str:
    """A user's prompt as ``\u203a first line`` and indented continuation lines, at most
    ``limit`` of them (then how many more there are)."""
    lines = text.strip("\n").splitlines() or [""]
    shown = [f"{PROMPT_MARK if n == 0 else ' '} {line}".rstrip() for n, line in enumerate(lines[:limit])]
    if len(lines) > limit:
        shown.append(f"  (+{len(lines) - limit} lines)")
    return "\n".join(shown)


# Said once when the run's thread plays a recording (provider ``replay`` or ``replay-codex``).
REPLAY_NOTE = (
    "note: replay plays a recorded Claude Code session: it ignores your prompt, "
    "and your answers do not change what it plays"
)
REPLAY_NOTES = {
    "replay": REPLAY_NOTE,
    "replay-codex": "note: replay-codex plays a recorded Codex session: it ignores your prompt, "
    "and your answers do not change what it plays",
}


@attrs.frozen
class ApprovalPrompt:
    """A permission question for one pending request."""

    request_id: str
    question: str  # "Allow Edit notes.txt?"

    @property
    def prompt(self) -> str:
        return f"{self.question} [y/N] "


@attrs.define
class Rendered:
    """What one feed produced: text for stdout and stderr, questions, settled requests."""

    out: str = ""
    err: str = ""
    asks: list[ApprovalPrompt] = attrs.Factory(list)
    # Requests asked about earlier that are no longer pending: stop asking.
    settled: list[str] = attrs.Factory(list)


class TurnRenderer:
    """Renders one turn of one thread; see the module docstring for its rules.

    ``json_lines`` writes each event of the turn as one JSON line instead of
    human text (snapshot rows only when they differ from what was seen).
    ``cwd`` shortens paths under the project directory; without it, ``project_dirs``
    (project id -> path) finds the thread's directory from the snapshot's thread row.
    """

    def __init__(
        self,
        turn_id: str,
        *,
        json_lines: bool = False,
        cwd: str | None = None,
        project_dirs: Mapping[str, str] | None = None,
        show_prompt: bool = False,
    ) -> None:
        self.turn_id = turn_id
        self.json_lines = json_lines
        self.show_prompt = show_prompt  # print the turn's user message (attach, log)
        self.cwd = cwd
        self._project_dirs = project_dirs or {}
        self.turn: JsonDict | None = None
        self._out: list[str] = []
        self._err: list[str] = []
        self._result = Rendered()
        self._at_line_start = True
        self._streaming: str | None = None  # item whose text ends the last write
        self._printed: dict[str, int] = {}  # item id -> characters of its text written
        self._headed: set[str] = set()  # items whose first line is written
        self._finished: set[str] = set()  # items whose closing line is written
        self._approvals: dict[str, JsonDict] = {}  # approval_request items by id
        self._asked: set[str] = set()
        self._settled: set[str] = set()
        self._seen: dict[str, JsonDict] = {}  # json_lines: last entity written per id
        self._queue_reasons_noted: set[str] = set()
        # The run's thread plays a recording (known from the snapshot's thread row).
        self.replay = False

    @property
    def done(self) -> bool:
        return self.turn is not None and self.turn.get("status") in TERMINAL_TURN_STATUSES

    @property
    def exit_code(self) -> int:
        """0 for a completed turn, 1 for any other end."""
        return 0 if self.turn is not None and self.turn.get("status") == "completed" else 1

    # -- feeding -----------------------------------------------------------

    def feed_event(self, event: Mapping[str, Any]) -> Rendered:
        """One ``event`` notification's data: ``{"kind", "sequence", "entity"}``."""
        kind = event.get("kind")
        entity = event.get("entity")
        if not isinstance(entity, dict) or not self._is_ours(kind, entity):
            return Rendered()
        if self.json_lines:
            self._seen[str(entity.get("id"))] = entity
            self._out.append(orjson.dumps(dict(event)).decode() + "\n")
        self._apply(kind, entity)
        return self._take()

    def feed_snapshot(self, snapshot: Mapping[str, Any]) -> Rendered:
        """A snapshot object (or chunk): ``thread``, ``turns``, ``items``, ``requests``."""
        thread = snapshot.get("thread")
        if isinstance(thread, dict):
            if self.cwd is None:
                self.cwd = thread.get("worktree_path") or self._project_dirs.get(str(thread.get("project_id")))
            note = REPLAY_NOTES.get(str(thread.get("provider")))
            if note is not None and not self.replay:
                self.replay = True
                self._err.append(note + "\n")
        # Items by ordinal, so that text and tool lines come out in transcript order;
        # requests after items, so that a question can name its tool; the turn
        # last, so that a finished turn ends the run after its items.
        items = sorted(_dicts(snapshot.get("items")), key=lambda item: item.get("ordinal") or 0)
        rows = [
            *(("item.updated", item) for item in items),
            *(("request.updated", request) for request in _dicts(snapshot.get("requests"))),
            *(("turn.updated", turn) for turn in _dicts(snapshot.get("turns"))),
        ]
        for kind, entity in rows:
            if not self._is_ours(kind, entity):
                continue
            if self.json_lines and self._seen.get(str(entity.get("id"))) != entity:
                self._seen[str(entity.get("id"))] = entity
                line = {"kind": kind, "sequence": None, "entity": entity, "snapshot": True}
                self._out.append(orjson.dumps(line).decode() + "\n")
            self._apply(kind, entity)
        return self._take()

    def finish(self, *, abandoned: bool = False, interrupted_here: bool = False) -> Rendered:
        """The closing output: end the open line; the final JSON line or error line.

        ``abandoned``: the user stopped following a turn that goes on, so
        there is no error to report, only the last state seen (JSON).
        ``interrupted_here``: this client asked for the interrupt (Ctrl-C), so an
        interrupted turn is not reported as stopped by another client.
        """
        self._end_line()
        if self.json_lines:
            self._out.append(orjson.dumps({"turn": self.turn}).decode() + "\n")
        elif self.exit_code != 0 and not abandoned:
            self._err.append(f"error: {final_error(self.turn, interrupted_here=interrupted_here)}\n")
        self._result.settled.extend(sorted(self._asked - self._settled))
        self._settled |= self._asked
        return self._take()

    # -- entities ----------------------------------------------------------

    def _is_ours(self, kind: Any, entity: Mapping[str, Any]) -> bool:
        if kind == "turn.updated":
            return entity.get("id") == self.turn_id
        if kind in ("item.updated", "request.updated"):
            return entity.get("turn_id") == self.turn_id
        return False

    def _apply(self, kind: Any, entity: JsonDict) -> None:
        if kind == "turn.updated":
            self._turn(entity)
        elif kind == "item.updated":
            self._item(entity)
        elif kind == "request.updated":
            self._request(entity)

    def _turn(self, turn: JsonDict) -> None:
        if self.done:
            return  # a terminal status is final; an older row must not reopen it
        self.turn = turn
        reason = str(turn.get("queue_reason") or "thread_busy")
        if turn.get("status") == "queued" and reason not in self._queue_reasons_noted:
            self._queue_reasons_noted.add(reason)
            self._err.append(f"{queued_note(reason)}\n")

    def _item(self, item: JsonDict) -> None:
        item_id = str(item.get("id"))
        kind = item.get("kind")
        if kind == "approval_request":
            self._approvals[item_id] = item
        if self.json_lines:
            return
        status = item.get("status")
        if kind == "assistant_message":
            self._stream(item_id, item.get("text") or "", status)
        elif kind == "tool_call":
            data = item.get("data") or {}
            if self._head(item_id):
                self._line(
                    tool_line(
                        str(item.get("title") or data.get("name") or "tool"),
                        data.get("input"),
                        cwd=self.cwd,
                    )
                )
            if status in ("completed", "failed") and self._finish(item_id):
                failed = status == "failed" or bool(data.get("is_error"))
                self._line(result_line(data.get("result"), failed=failed, recorded=self.replay))
        elif kind in ("command", "file_change"):  # Codex's shell commands and patches
            if self._head(item_id):
                self._line(f"⏺ {one_line(str(item.get('title') or kind), SUMMARY_CHARS)}")
            if status in ("completed", "failed") and self._finish(item_id):
                output = (item.get("data") or {}).get("output") if kind == "command" else None
                self._line(result_line(output, failed=status == "failed", recorded=self.replay))
        elif kind == "approval_request":
            if status in ("allowed", "denied") and self._finish(item_id):
                either_way = " (the replay goes on as recorded either way)" if self.replay else ""
                self._line(f"  ⎿  {str(status).capitalize()}{either_way}")
        elif kind == "reasoning":
            if status == "completed" and item.get("text") and self._finish(item_id):
                self._line(f"✻ {one_line(str(item.get('text')), SUMMARY_CHARS)}")
        elif kind == "error":
            if self._finish(item_id):
                self._line(f"✗ {item.get('text') or item.get('title') or 'error'}")
        elif kind == "user_message":
            if self.show_prompt and item.get("text") and self._head(item_id):
                self._line(prompt_lines(str(item.get("text"))))
        elif self._head(item_id):
            self._line(f"⏺ {one_line(str(item.get('title') or kind), SUMMARY_CHARS)}")

    def _request(self, request: JsonDict) -> None:
        request_id = str(request.get("id"))
        if request.get("status") != "pending":
            if request_id in self._asked and request_id not in self._settled:
                self._settled.add(request_id)
                self._result.settled.append(request_id)
            return
        if request_id in self._asked or request_id in self._settled:
            return
        self._asked.add(request_id)
        if request.get("kind", "permission") != "permission":
            self._err.append(
                f"request {request_id} ({request.get('kind')}) waits for an answer `t3d ctl` cannot give; "
                "answer it in a t3d UI\n"
            )
            return
        if not self.json_lines:
            self._end_line()
        self._result.asks.append(ApprovalPrompt(request_id, self._question(request)))

    def _question(self, request: JsonDict) -> str:
        item = self._approvals.get(str(request.get("item_id")))
        data = request.get("data") or {}
        item_data = (item or {}).get("data") or {}
        name = (
            (item or {}).get("title")
            or item_data.get("tool_name")
            or data.get("tool_name")
            or "this tool"
        )
        tool_input = item_data.get("input", data.get("input"))
        target = summarize_input(tool_input, cwd=self.cwd, limit=60)
        return f"Allow {name}{' ' + target if target else ''}?"

    # -- text --------------------------------------------------------------

    def _stream(self, item_id: str, text: str, status: Any) -> None:
        printed = self._printed.get(item_id, 0)
        if len(text) > printed:
            if self._streaming != item_id:
                self._end_line()
            self._write(text[printed:])
            self._printed[item_id] = len(text)
            self._streaming = item_id
        if (
            status in ("completed", "failed")
            and self._finish(item_id)
            and self._streaming == item_id
        ):
            self._end_line()

    def _head(self, item_id: str) -> bool:
        """True the first time only: the item's first line is to be written now."""
        if item_id in self._headed:
            return False
        self._headed.add(item_id)
        return True

    def _finish(self, item_id: str) -> bool:
        """True the first time only: the item's closing line is to be written now."""
        if item_id in self._finished:
            return False
        self._finished.add(item_id)
        return True

    def _write(self, text: str) -> None:
        if text:
            self._out.append(text)
            self._at_line_start = text.endswith("\n")

    def _line(self, text: str) -> None:
        self._end_line()
        self._write(text + "\n")

    def _end_line(self) -> None:
        if not self._at_line_start:
            self._write("\n")
        self._streaming = None

    def _take(self) -> Rendered:
        result = self._result
        result.out, result.err = "".join(self._out), "".join(self._err)
        self._out, self._err, self._result = [], [], Rendered()
        return result


# What `t3d ctl run` says when its turn waits, by the turn's queue_reason.
QUEUED_NOTES = {
    "thread_busy": "turn queued behind the thread's open turn; it starts when that one ends",
    "memory_pressure": "turn held: memory pressure is severe (see `t3d ctl memory`); it starts once the pressure eases",
    "loop_saturated": "turn held: the daemon is saturated (its loop lags); it starts once the load eases",
    "max_active_turns": "turn held: --max-active-turns turns already run; it starts when one of them ends",
}


def queued_note(reason: str) -> str:
    """Why a turn waits and when it starts, for a ``queued`` turn's ``queue_reason``."""
    return QUEUED_NOTES.get(reason, f"turn queued ({reason}); it starts when the daemon lets it")


def final_error(turn: Mapping[str, Any] | None, *, interrupted_here: bool = False) -> str:
    """What ended a turn that did not complete, in the daemon's words if it gave any. An
    interrupt this client did not send came from another one (the daemon's words, "by the
    user", would name the wrong person)."""
    if turn is None:
        return "the turn ended without a status"
    if turn.get("status") == "interrupted" and turn.get("reason") == "interrupt":
        return "interrupted (Ctrl-C here)" if interrupted_here else "interrupted (turn.interrupt from another client)"
    return str(turn.get("error") or turn.get("status") or "unknown")


def _dicts(value: Any) -> Iterable[JsonDict]:
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [row for row in value if isinstance(row, dict)]
    return []


# -- tables ------------------------------------------------------------------


def format_duration(seconds: float) -> str:
    """``3d 4h``, ``2h 5m``, ``4m 10s``, ``12s``."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def count_threads(threads: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Thread counts for `t3d ctl status`; archived threads count only as archived."""
    live = [thread for thread in threads if not thread.get("archived_at")]
    return {
        "threads": len(live),
        "running_threads": sum(1 for thread in live if thread.get("status") == "running"),
        "waiting_threads": sum(1 for thread in live if thread.get("status") == "waiting"),
        "queued_threads": sum(1 for thread in live if thread.get("status") == "queued"),
        "archived_threads": len(threads) - len(live),
    }


def format_status(
    url: str, health: Mapping[str, Any], projects: int, counts: Mapping[str, int]
) -> str:
    """The human report of `t3d ctl status`."""
    uptime = health.get("uptime_s")
    up = f", up {format_duration(float(uptime))}" if isinstance(uptime, int | float) else ""
    lines = [
        f"t3d {health.get('version', '?')} at {url}: {health.get('status', '?')}{up}",
        f"projects  {projects}",
        f"threads   {counts['threads']} ({counts['running_threads']} running, "
        f"{counts['waiting_threads']} waiting for approval, {counts.get('queued_threads', 0)} held, "
        f"{counts['archived_threads']} archived)",
    ]
    lines += [f"          {reason}" for reason in health.get("reasons") or ()]
    admission = health.get("admission")
    if isinstance(admission, Mapping) and admission.get("state") not in (None, "off", "open"):
        lines.append(f"admission {admission.get('state')}: {admission.get('held_turns', 0)} turn(s) held")
    return "\n".join(lines) + "\n"


def format_bytes(size: int) -> str:
    """A size for people: ``28 MiB``, ``1.2 GiB``."""
    if size >= 1 << 30:
        return f"{size / (1 << 30):.1f} GiB"
    return f"{max(size >> 20, 1) if size else 0} MiB"


def format_memory(value: Mapping[str, Any]) -> str:
    """One `memory_pressure` value as lines: the level, why it cannot be read, the heaviest agents."""
    line = f"memory    {value.get('level', '?')}"
    if value.get("unavailable"):
        line += f" (cannot read memory pressure: {value['unavailable']})"
    lines = [line]
    for agent in value.get("agents") or ():
        if isinstance(agent, Mapping):
            size = agent.get("memory_bytes")
            shown = format_bytes(size) if isinstance(size, int) else "?"
            lines.append(f"          {shown:>9}  thread {agent.get('thread_id', '?')} ({agent.get('source', '?')})")
    return "\n".join(lines) + "\n"


# -- diffs --------------------------------------------------------------------

_BOLD, _RED, _GREEN, _CYAN, _RESET = "\x1b[1m", "\x1b[31m", "\x1b[32m", "\x1b[36m", "\x1b[0m"
_DIFF_HEADS = ("diff --git ", "index ", "--- ", "+++ ", "new file mode", "deleted file mode", "similarity ", "rename ", "old mode", "new mode")


def color_diff(text: str) -> str:
    """A unified diff coloured as git colours it: headers bold, hunks cyan, + green, - red."""
    lines = []
    in_header = False
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        end = line[len(body) :]
        if body.startswith("diff --git "):
            in_header = True
        elif body.startswith("@@"):
            in_header = False
        if in_header and body.startswith(_DIFF_HEADS):
            color = _BOLD
        elif body.startswith("@@"):
            color = _CYAN
        elif body.startswith("+"):
            color = _GREEN
        elif body.startswith("-"):
            color = _RED
        else:
            color = ""
        lines.append(f"{color}{body}{_RESET}{end}" if color and body else line)
    return "".join(lines)
