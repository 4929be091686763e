"""`t3d ctl threads` and `t3d ctl projects` as text: pure functions of the shell's rows.

A thread row is the shell's (``GET /api/shell``, ``subscribe.shell``) plus what ctl
reads of its turns (`TurnsSeen`: the last finished turn, the open one), since the shell
carries only counts. Ids are shown by their shortest unique prefix of at least
`SHORT_ID` characters (commands take any unique prefix); titles are cut to the width
left, at a word boundary, and a title that is a whole prompt is cut to its first
sentence.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from t3d.ctl.render import TERMINAL_TURN_STATUSES, format_duration, one_line

JsonDict = dict[str, Any]

SHORT_ID = 8
THREAD_STATUSES = ("idle", "running", "waiting", "queued", "archived")
# A title cut at a word boundary keeps at least this share of the room it has.
_WORD_CUT_SHARE = 0.6
# A first sentence this short says too little to stand for the title.
_MIN_SENTENCE = 12
# Widest title printed when the output is not a terminal.
PIPE_TITLE_CHARS = 80
_SENTENCE_ENDS = (". ", "? ", "! ", "; ", ": ")


@attrs.frozen
class TurnsSeen:
    """What ctl read of a thread's turns: its last finished turn and its open (running,
    waiting, starting or queued) turn, each None when there is none."""

    last: JsonDict | None = None
    open: JsonDict | None = None


def turns_seen(turns: Iterable[Mapping[str, Any]]) -> TurnsSeen:
    """The last finished turn and the first open one among ``turns`` (any order)."""
    done = [t for t in turns if t.get("status") in TERMINAL_TURN_STATUSES]
    active = [t for t in turns if t.get("status") not in TERMINAL_TURN_STATUSES]
    last = max(done, key=lambda t: t.get("ordinal") or 0, default=None)
    first_open = min(active, key=lambda t: t.get("ordinal") or 0, default=None)
    return TurnsSeen(dict(last) if last else None, dict(first_open) if first_open else None)


# -- ids ----------------------------------------------------------------------


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def short_ids(ids: Iterable[str], minimum: int = SHORT_ID) -> dict[str, str]:
    """Each id -> its shortest prefix of at least ``minimum`` characters that no other id
    shares (the whole id when it is a prefix of another)."""
    ordered = sorted(set(ids))
    shown: dict[str, str] = {}
    for index, ident in enumerate(ordered):
        common = 0
        for neighbour in (ordered[index - 1] if index else None, ordered[index + 1] if index + 1 < len(ordered) else None):
            if neighbour is not None:
                common = max(common, _common_prefix(ident, neighbour))
        shown[ident] = ident[: max(minimum, common + 1)]
    return shown


def match_id(given: str, ids: Iterable[str]) -> tuple[str | None, list[str]]:
    """(the id ``given`` names, []) for an exact id or a unique prefix; (None, candidates)
    for a prefix several ids share; (None, []) when none matches."""
    ids = list(ids)
    if given in ids:
        return given, []
    matches = sorted(ident for ident in ids if ident.startswith(given))
    if len(matches) == 1:
        return matches[0], []
    return None, matches


# -- titles -------------------------------------------------------------------


def shorten_title(title: str, limit: int) -> str:
    """``title`` on one line in at most ``limit`` characters: a prompt used as a title is
    cut to its first sentence when that is long enough to tell it apart, and anything still
    too long is cut at a word boundary with an ellipsis."""
    flat = " ".join(title.split())
    if len(flat) > limit:
        ends = [(flat.find(end, _MIN_SENTENCE), end) for end in _SENTENCE_ENDS]
        at, end = min(((at, end) for at, end in ends if at >= 0), default=(-1, ""))
        if 0 <= at < limit - 1:
            kept = flat[: at + 1] if end[0] in "?!" else flat[:at].rstrip(" .")
            return kept + "…"
    if len(flat) <= limit:
        return flat
    if limit <= 1:
        return "…"[:limit]
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit * _WORD_CUT_SHARE:
        cut = cut[:space]
    return cut.rstrip(" ,;:-") + "…"


def title_from_prompt(prompt: str, limit: int = 60) -> str:
    """The title a thread started from ``prompt`` gets: its first line, shortened."""
    first = next((line for line in prompt.splitlines() if line.strip()), prompt)
    return shorten_title(first, limit)


# -- thread rows ----------------------------------------------------------------


def thread_state(thread: Mapping[str, Any]) -> str:
    """``archived``, or the thread's status."""
    return "archived" if thread.get("archived_at") else str(thread.get("status") or "?")


def status_cell(thread: Mapping[str, Any]) -> str:
    state = thread_state(thread)
    if state == "queued" and thread.get("queue_reason"):
        return f"queued ({thread['queue_reason']})"
    if state == "waiting":
        return "waiting (approval)"
    return state


def running_for(seen: TurnsSeen | None, now: float) -> str:
    """How long the open turn has run (or waited to start, for a queued one)."""
    turn = seen.open if seen else None
    if not turn:
        return ""
    since = turn.get("started_at") or turn.get("requested_at")
    return format_duration(now - float(since)) if isinstance(since, int | float) else ""


def last_turn_cell(seen: TurnsSeen | None, now: float) -> str:
    """``#3 completed 5m ago`` for the last finished turn."""
    turn = seen.last if seen else None
    if not turn:
        return ""
    at = turn.get("completed_at") or turn.get("started_at") or turn.get("requested_at")
    age = f" {format_duration(now - float(at))} ago" if isinstance(at, int | float) else ""
    reverted = " (reverted)" if turn.get("reverted_at") else ""
    return f"#{turn.get('ordinal', '?')} {turn.get('status', '?')}{age}{reverted}"


def project_name(project: Mapping[str, Any] | None) -> str:
    if not project:
        return "?"
    path = str(project.get("path") or "")
    return str(project.get("title") or os.path.basename(path.rstrip("/")) or path or "?")


def project_matches(given: str, project: Mapping[str, Any], cwd: str) -> bool:
    """``--project`` names a project by id (or a prefix of it), path, or directory name."""
    ident, path = str(project.get("id") or ""), str(project.get("path") or "")
    if given == ident or (len(given) >= 4 and ident.startswith(given)):
        return True
    wanted = os.path.normpath(os.path.join(cwd, os.path.expanduser(given)))
    return wanted == os.path.normpath(path) or given in (project.get("title"), os.path.basename(path.rstrip("/")))


@attrs.frozen
class ThreadFilter:
    """Which threads `t3d ctl threads` shows; empty fields match everything."""

    projects: frozenset[str] = frozenset()  # project ids
    statuses: frozenset[str] = frozenset()  # THREAD_STATUSES
    providers: frozenset[str] = frozenset()
    waiting: bool = False  # waiting on someone: an answer (waiting) or the daemon (queued)
    archived: bool = False  # include archived threads though no status asks for them

    def __call__(self, thread: Mapping[str, Any]) -> bool:
        state = thread_state(thread)
        if self.projects and thread.get("project_id") not in self.projects:
            return False
        if self.providers and thread.get("provider") not in self.providers:
            return False
        if self.waiting and state not in ("waiting", "queued"):
            return False
        if self.statuses:
            return state in self.statuses
        return self.archived or state != "archived"


def thread_rows(
    threads: Sequence[Mapping[str, Any]],
    projects: Mapping[str, Mapping[str, Any]],
    seen: Mapping[str, TurnsSeen],
    now: float,
) -> list[JsonDict]:
    """The ``--json`` form: each shell row with ``project_path``, ``last_turn`` and
    ``open_turn`` (each None when there is none) and ``running_s``, oldest thread first."""
    rows = []
    for thread in sorted(threads, key=lambda t: t.get("created_at") or 0):
        got = seen.get(str(thread.get("id")))
        open_turn = got.open if got else None
        since = (open_turn or {}).get("started_at") or (open_turn or {}).get("requested_at")
        rows.append(
            {
                **thread,
                "project_path": (projects.get(str(thread.get("project_id"))) or {}).get("path"),
                "last_turn": got.last if got else None,
                "open_turn": open_turn,
                "running_s": round(now - since, 3) if isinstance(since, int | float) else None,
            }
        )
    return rows


def format_threads(
    threads: Sequence[Mapping[str, Any]],
    projects: Mapping[str, Mapping[str, Any]],
    seen: Mapping[str, TurnsSeen],
    now: float,
    *,
    all_ids: Iterable[str] = (),
    width: int | None = None,
) -> str:
    """The `t3d ctl threads` table, oldest thread first; ``width`` (a terminal's) fits the
    titles to it, else titles are cut at PIPE_TITLE_CHARS."""
    if not threads:
        return ""
    ids = short_ids([*all_ids, *(str(t.get("id")) for t in threads)])
    header = ("ID", "PROJECT", "PROVIDER", "STATUS", "FOR", "LAST TURN", "TURNS", "TITLE")
    rows: list[tuple[str, ...]] = [header]
    titles = [""]
    for thread in sorted(threads, key=lambda t: t.get("created_at") or 0):
        got = seen.get(str(thread.get("id")))
        rows.append(
            (
                ids.get(str(thread.get("id")), str(thread.get("id"))),
                one_line(project_name(projects.get(str(thread.get("project_id")))), 24),
                str(thread.get("provider", "?")),
                status_cell(thread),
                running_for(got, now),
                last_turn_cell(got, now),
                str(thread.get("turn_count", "?")),
            )
        )
        titles.append(str(thread.get("title") or ""))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    used = sum(widths) + 2 * (len(widths))
    room = max(20, (width - used) if width else PIPE_TITLE_CHARS)
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.rjust(w) if column == 6 else cell.ljust(w) for column, (cell, w) in enumerate(zip(row, widths, strict=False))]
        title = header[-1] if index == 0 else shorten_title(titles[index], room)
        lines.append("  ".join([*cells, title]).rstrip())
    return "\n".join(lines) + "\n"


NO_THREADS = 'no threads; start one with `t3d ctl run "your prompt"` or `t3d ctl new`\n'


def no_threads_note(total: int, shown_archived: bool) -> str:
    """What an empty table says: there are none, or none that the filters let through."""
    if total == 0:
        return NO_THREADS
    hint = "" if shown_archived else " (archived ones show with --all)"
    return f"no thread matches; {total} thread{'s' if total != 1 else ''} in all{hint}\n"


# -- projects -----------------------------------------------------------------


def project_rows(projects: Sequence[Mapping[str, Any]], threads: Sequence[Mapping[str, Any]]) -> list[JsonDict]:
    """Each project with its thread counts (``threads`` live, ``active`` running, waiting
    or queued, ``archived``), oldest first."""
    rows = []
    for project in sorted(projects, key=lambda p: p.get("created_at") or 0):
        own = [t for t in threads if t.get("project_id") == project.get("id")]
        states = [thread_state(t) for t in own]
        rows.append(
            {
                **project,
                "threads": sum(1 for s in states if s != "archived"),
                "active": sum(1 for s in states if s in ("running", "waiting", "queued")),
                "archived": states.count("archived"),
            }
        )
    return rows


def format_projects(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "no projects; `t3d ctl new --project DIR` (or `t3d ctl run`) makes one\n"
    ids = short_ids(str(r.get("id")) for r in rows)
    table = [("ID", "THREADS", "ACTIVE", "ARCHIVED", "PATH")]
    table += [
        (ids[str(r.get("id"))], str(r["threads"]), str(r["active"]), str(r["archived"]), str(r.get("path") or ""))
        for r in rows
    ]
    widths = [max(len(row[c]) for row in table) for c in range(4)]
    lines = []
    for row in table:
        cells = [row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:4], widths[1:], strict=True))]
        lines.append("  ".join([*cells, row[4]]).rstrip())
    return "\n".join(lines) + "\n"


# -- the shell, followed ------------------------------------------------------------


class ShellState:
    """The shell as ``subscribe.shell`` tells it: a base (snapshot chunks, then
    ``snapshot.end``), then events. ``changed`` holds the ids of threads whose rows moved
    since it was last cleared (their turns are worth reading again)."""

    def __init__(self) -> None:
        self.projects: dict[str, JsonDict] = {}
        self.threads: dict[str, JsonDict] = {}
        self.based = False
        self.changed: set[str] = set()
        self._base: tuple[dict[str, JsonDict], dict[str, JsonDict]] | None = None

    def feed(self, kind: Any, data: Any) -> bool:
        """One notification of the subscription; True when what is shown may have changed."""
        if kind == "snapshot.chunk" and isinstance(data, dict):
            projects, threads = self._base if self._base is not None else ({}, {})
            projects.update((str(p.get("id")), p) for p in data.get("projects") or [] if isinstance(p, dict))
            threads.update((str(t.get("id")), t) for t in data.get("threads") or [] if isinstance(t, dict))
            self._base = (projects, threads)
            return False
        if kind == "snapshot.end":
            projects, threads = self._base if self._base is not None else ({}, {})
            self._base = None
            self.changed |= {tid for tid, row in threads.items() if self.threads.get(tid) != row}
            self.projects, self.threads, self.based = projects, threads, True
            return True
        if kind == "resync":
            self._base = None  # a fresh base follows
            return False
        if kind != "event" or not isinstance(data, dict) or not isinstance(data.get("entity"), dict):
            return False
        entity, event = data["entity"], data.get("kind")
        ident = str(entity.get("id"))
        if event == "project.updated":
            self.projects[ident] = entity
        elif event == "shell.updated":
            self.threads[ident] = entity
            self.changed.add(ident)
        elif event == "shell.removed":
            self.threads.pop(ident, None)
        else:
            return False
        return True
