"""Reading a Claude recording and rewriting its recorded values to the live ones.

Job: load one run (``<run>.jsonl`` or ``<run>.stdout.jsonl``, with its ``.timing.tsv`` and
``.meta.json``) into ``Line``s, and rewrite what the recording holds of the recording
machine: ``/workspace`` -> the real cwd (and its encoded ``projects/-workspace`` form),
``/home/user`` -> ``$HOME``, the recorded session id -> the one in force.

Rules:

* A missing, unreadable or malformed transcript raises ``ConfigError`` naming the path; a
  missing timing or meta file only means "no delays" or "no recorded exit code".
* Timing indices refer to the combined ``.jsonl``, so a ``.stdout.jsonl`` gets none.
* Rewrites are plain substitutions of JSON string bodies, one line at a time. A token that
  the recording streamed split across several deltas of one block is first re-split into
  one delta, so the concatenated deltas still equal the final block after rewriting.
* Standard library only; no heavy imports.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, NamedTuple

from replay_fixtures.fake_cli_args import ENV_FIXTURE, ConfigError

JsonObject = dict[str, Any]

FALLBACK_VERSION = "2.1.197"
HOST_PREFIX = ">>> "
RECORDED_CWD = "/workspace"
RECORDED_HOME = "/home/user"
RECORDED_PROJECT_DIR = "/projects/-workspace/"

VERSION_RE = re.compile(r'"claude_code_version":"([^"\\]+)"')
DELTA_TEXT_FIELDS = {
    "text_delta": "text",
    "input_json_delta": "partial_json",
    "thinking_delta": "thinking",
}


class Line(NamedTuple):
    """One line of a recording: host (``>>> ``) or CLI stdout, with its recorded time."""

    host: bool
    text: str
    obj: JsonObject
    at_ms: float | None


def run_stem(path: str) -> str:
    for suffix in (".stdout.jsonl", ".jsonl"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return os.path.splitext(path)[0]


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"fake claude: cannot read replay fixture {path!r}: {error}"
            f" (choose one with --replay-fixture PATH or {ENV_FIXTURE})"
        ) from None


def read_version(path: str) -> str:
    """The ``claude_code_version`` of the fixture's init line, else the 2.1.197 constant."""
    try:
        match = VERSION_RE.search(read_text(path))
    except ConfigError:
        return FALLBACK_VERSION
    return match.group(1) if match else FALLBACK_VERSION


def read_timing(path: str) -> dict[int, float]:
    """Map line index -> ms since spawn, from ``<run>.timing.tsv`` rows (``ms  in|out  index``)."""
    try:
        with open(path, encoding="utf-8") as handle:
            rows = [row.split("\t") for row in handle.read().splitlines()]
    except OSError:
        return {}
    timing: dict[int, float] = {}
    for row in rows:
        if len(row) == 3 and row[2].strip().isdigit():
            try:
                timing[int(row[2])] = float(row[0])
            except ValueError:
                continue
    return timing


def read_exit_code(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as handle:
            code = json.load(handle).get("exit_code")
    except (OSError, ValueError, AttributeError):
        return None
    return code if isinstance(code, int) else None


def read_recording(path: str) -> list[Line]:
    """Parse a combined ``.jsonl`` (with ``>>> `` lines) or a ``.stdout.jsonl`` transcript.

    Timing comes from ``<run>.timing.tsv``, whose indices refer to the combined ``.jsonl``;
    a ``.stdout.jsonl`` therefore replays without delays.
    """
    timing = {} if path.endswith(".stdout.jsonl") else read_timing(run_stem(path) + ".timing.tsv")
    lines: list[Line] = []
    for index, raw in enumerate(read_text(path).split("\n")):
        if not raw.strip():
            continue
        host = raw.startswith(HOST_PREFIX)
        text = raw[len(HOST_PREFIX) :] if host else raw
        try:
            obj = json.loads(text)
        except ValueError as error:
            raise ConfigError(
                f"fake claude: replay fixture {path!r} line {index + 1}: {error}"
            ) from None
        if not isinstance(obj, dict):
            raise ConfigError(
                f"fake claude: replay fixture {path!r} line {index + 1} is not an object"
            )
        lines.append(Line(host, text, obj, timing.get(index)))
    return lines


def dump(obj: JsonObject) -> str:
    """Serialise like the CLI (JSON.stringify): compact, non-ASCII kept."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def json_string_body(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)[1:-1]


class Rewriter:
    """Replaces recorded values (working directory, home, session id) with the live ones."""

    def __init__(self, replacements: dict[str, str]) -> None:
        self._replacements = replacements
        self.pattern = re.compile(
            "|".join(map(re.escape, sorted(replacements, key=len, reverse=True)))
        )

    @classmethod
    def for_environment(
        cls, cwd: str, home: str, recorded_session: str | None, session: str | None
    ) -> Rewriter:
        project_dir = re.sub(r"[^A-Za-z0-9]", "-", cwd)
        replacements = {
            RECORDED_PROJECT_DIR: json_string_body(f"/projects/{project_dir}/"),
            RECORDED_CWD: json_string_body(cwd),
            RECORDED_HOME: json_string_body(home),
        }
        if recorded_session and session:
            replacements[recorded_session] = json_string_body(session)
        return cls(replacements)

    def __call__(self, text: str) -> str:
        return self.pattern.sub(lambda match: self._replacements[match.group(0)], text)


def recorded_session_id(lines: list[Line]) -> str | None:
    for line in lines:
        session = line.obj.get("session_id")
        if not line.host and isinstance(session, str) and session:
            return session
    return None


def delta_field(line: Line) -> tuple[Any, str, str] | None:
    """(block index, delta type, text field) of a streamed text piece, else None."""
    event = line.obj.get("event")
    if line.host or line.obj.get("type") != "stream_event" or not isinstance(event, dict):
        return None
    delta = event.get("delta")
    if event.get("type") != "content_block_delta" or not isinstance(delta, dict):
        return None
    field = DELTA_TEXT_FIELDS.get(str(delta.get("type")))
    if field is None or not isinstance(delta.get(field), str):
        return None
    return event.get("index"), str(delta.get("type")), field


def delta_runs(lines: list[Line]) -> list[list[tuple[int, str]]]:
    """(line index, text field) of consecutive delta lines that stream the same block."""
    runs: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    current_key: tuple[Any, str, str] | None = None
    for index, line in enumerate(lines):
        key = delta_field(line)
        if key is None or key != current_key:
            if len(current) > 1:
                runs.append(current)
            current = []
        current_key = key
        if key is not None:
            current.append((index, key[2]))
    if len(current) > 1:
        runs.append(current)
    return runs


def heal_split_tokens(lines: list[Line], tokens: re.Pattern[str]) -> list[Line]:
    """Move delta boundaries that cut through a token to the token's end.

    The concatenation of each block's deltas is unchanged, but every token now lies in one
    line, so a per-line rewrite keeps the deltas consistent with the final block.
    """
    healed = list(lines)
    for run in delta_runs(lines):
        pieces: list[str] = [lines[index].obj["event"]["delta"][field] for index, field in run]
        joined = "".join(pieces)
        cuts: list[int] = []
        for piece in pieces[:-1]:
            cuts.append((cuts[-1] if cuts else 0) + len(piece))
        for match in tokens.finditer(joined):
            cuts = [match.end() if match.start() < cut < match.end() else cut for cut in cuts]
        bounds = [0, *cuts, len(joined)]
        for (index, field), old, start, end in zip(
            run, pieces, bounds[:-1], bounds[1:], strict=True
        ):
            if joined[start:end] != old:
                obj = json.loads(lines[index].text)
                obj["event"]["delta"][field] = joined[start:end]
                healed[index] = lines[index]._replace(text=dump(obj), obj=obj)
    return healed
