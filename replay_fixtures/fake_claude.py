"""A fake ``claude`` CLI that replays a recorded Claude Code 2.1.197 stream-json transcript.

Job: stand in for the real CLI in tests and benchmarks. It accepts the real CLI's flags,
speaks the stream-json protocol on stdin/stdout, and replays one recording (format:
``replay_fixtures/README.md``).

Rules:

* Standard library only; no heavy imports (start-up must stay fast).
* stdout lines are the recording's, verbatim and flushed one by one, except for the
  rewrites: ``/workspace`` -> the real cwd (and its encoded ``projects/-workspace`` form),
  ``/home/user`` -> ``$HOME``, the recorded session id -> the one in force. A path that the
  recording streamed split across several deltas is first re-split so that the rewrite
  keeps the concatenated deltas equal to the final block.
* A ``>>> `` line is a point where the fake waits for the host: a user line is a turn
  boundary, a ``control_response`` is the answer to the preceding ``can_use_tool`` prompt,
  an ``interrupt`` waits (bounded) for the host's interrupt. Host lines are matched by
  type, never byte for byte, and the replay goes on whatever the host answered.
* Recorded ``control_response`` lines answer *host* requests (initialize, interrupt, ...):
  they are never played unprompted, only sent in reply to a real host request, carrying
  the host's ``request_id``.
* Host control requests are answered wherever they arrive, like the real CLI. An interrupt
  in the middle of a turn ends the turn: at the turn's recorded interrupt point if it has
  one, otherwise with a synthetic interrupted ``result``.
* stdin is read by a background thread into a queue, so every wait has a deadline and
  control requests are answered during playback. A malformed stdin line is fatal (exit 1).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

JsonObject = dict[str, Any]

FALLBACK_VERSION = "2.1.197"
FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "claude")
DEFAULT_FIXTURE = os.path.join(FIXTURES_DIR, "claude-2.1.197_multiturn_tools.jsonl")

ENV_FIXTURE = "T3D_REPLAY_FIXTURE"
ENV_SPEED = "T3D_REPLAY_SPEED"
ENV_LOOP = "T3D_REPLAY_LOOP"
ENV_INTERRUPT_TIMEOUT = "T3D_REPLAY_INTERRUPT_TIMEOUT"

EXIT_CLI_ERROR = 1
EXIT_FAKE_CONFIG_ERROR = 2

HOST_PREFIX = ">>> "
RECORDED_CWD = "/workspace"
RECORDED_HOME = "/home/user"
RECORDED_PROJECT_DIR = "/projects/-workspace/"
DEFAULT_INTERRUPT_TIMEOUT_S = 10.0
MAX_QUEUED_TURNS = 64
READ_CHUNK = 65536

UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
VERSION_RE = re.compile(r'"claude_code_version":"([^"\\]+)"')
DELTA_TEXT_FIELDS = {
    "text_delta": "text",
    "input_json_delta": "partial_json",
    "thinking_delta": "thinking",
}
INTERRUPT_NOTICE = "[Request interrupted by user]"

# Step kinds of a replay script.
EMIT = "emit"
WAIT_USER = "wait_user"
WAIT_PERMISSION = "wait_permission"
WAIT_INTERRUPT = "wait_interrupt"


class UsageError(Exception):
    """A command line the real CLI rejects (exit 1, message on stderr)."""


class ConfigError(Exception):
    """A problem with the fake's own configuration: fixture, speed, timeouts (exit 2)."""


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


class Options:
    """The flags that change what the fake does; every other real flag is accepted and ignored."""

    def __init__(self) -> None:
        self.print_mode = False
        self.verbose = False
        self.version = False
        self.fork_session = False
        self.loop = False
        self.output_format = "text"
        self.input_format = "text"
        self.session_id: str | None = None
        self.resume: str | None = None
        self.fixture: str | None = None
        self.speed: str | None = None
        self.prompt: list[str] = []


BOOL_FLAGS = {
    "-p": "print_mode",
    "--print": "print_mode",
    "--verbose": "verbose",
    "-v": "version",
    "--version": "version",
    "--fork-session": "fork_session",
    "--replay-loop": "loop",
}
VALUE_FLAGS = {
    "--output-format": "output_format",
    "--input-format": "input_format",
    "--session-id": "session_id",
    "--resume": "resume",
    "-r": "resume",
    "--replay-fixture": "fixture",
    "--speed": "speed",
}
IGNORED_BOOL_FLAGS = frozenset(
    {
        "--include-partial-messages",
        "--replay-user-messages",
        "--strict-mcp-config",
        "-c",
        "--continue",
        "--dangerously-skip-permissions",
        "--no-session-persistence",
        "--include-hook-events",
        "--bare",
        "--await-initialize",
        "--resume-drops-turn",
    }
)
IGNORED_VALUE_FLAGS = frozenset(
    {
        "--permission-prompt-tool",
        "--permission-mode",
        "--model",
        "--fallback-model",
        "--max-turns",
        "--system-prompt",
        "--append-system-prompt",
        "--setting-sources",
        "--settings",
        "--max-budget-usd",
        "--effort",
        "--json-schema",
        "--agents",
        "--name",
        "--max-thinking-tokens",
        "--thinking",
        "--resume-session-at",
        "--session-mirror",
    }
)
IGNORED_VARIADIC_FLAGS = frozenset(
    {
        "--mcp-config",
        "--allowedTools",
        "--allowed-tools",
        "--disallowedTools",
        "--disallowed-tools",
        "--add-dir",
        "--tools",
        "--betas",
        "--plugin-dir",
    }
)


def parse_args(argv: list[str]) -> Options:
    """Parse argv like the real CLI (commander); unknown flags are skipped, never fatal."""
    options = Options()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            options.prompt.extend(argv[i:])
            break
        if not arg.startswith("-") or arg == "-":
            options.prompt.append(arg)
            continue
        flag, has_inline, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if flag in BOOL_FLAGS:
            setattr(options, BOOL_FLAGS[flag], True)
        elif flag in VALUE_FLAGS:
            if has_inline:
                value = inline
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise UsageError(f"error: option '{flag}' argument missing")
            setattr(options, VALUE_FLAGS[flag], value)
        elif has_inline or flag in IGNORED_BOOL_FLAGS:
            pass
        elif flag in IGNORED_VALUE_FLAGS:
            i += 1
        elif flag in IGNORED_VARIADIC_FLAGS:
            while i < len(argv) and not argv[i].startswith("-"):
                i += 1
        elif i < len(argv) and not argv[i].startswith("-"):
            i += 1  # an ignored or unknown flag's value, best effort
    return options


def check_options(options: Options) -> None:
    """Reject the flag combinations the real CLI rejects, with its messages."""
    if options.print_mode and options.output_format == "stream-json" and not options.verbose:
        raise UsageError(
            "Error: When using --print, --output-format=stream-json requires --verbose"
        )
    if options.input_format == "stream-json" and options.output_format != "stream-json":
        raise UsageError("Error: --input-format=stream-json requires output-format=stream-json.")
    if options.session_id is not None and not UUID_RE.fullmatch(options.session_id):
        raise UsageError("Error: Invalid session ID. Must be a valid UUID.")


def choose_fixture(options: Options) -> str:
    return options.fixture or os.environ.get(ENV_FIXTURE) or DEFAULT_FIXTURE


def parse_speed(options: Options) -> float:
    """Return the delay scale: recorded ms are multiplied by it (0 = no delays)."""
    raw = options.speed if options.speed is not None else os.environ.get(ENV_SPEED, "1")
    try:
        speed = float(raw)
    except ValueError:
        speed = -1.0
    if not speed >= 0:  # also rejects NaN
        raise ConfigError(f"fake claude: invalid speed {raw!r} (--speed / {ENV_SPEED}; >= 0)")
    return 0.0 if speed in (0.0, float("inf")) else 1.0 / speed


def parse_interrupt_timeout() -> float:
    raw = os.environ.get(ENV_INTERRUPT_TIMEOUT)
    if raw is None:
        return DEFAULT_INTERRUPT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"fake claude: invalid {ENV_INTERRUPT_TIMEOUT} {raw!r} (seconds >= 0)")
    return seconds


def loop_enabled(options: Options) -> bool:
    return options.loop or os.environ.get(ENV_LOOP, "").lower() in ("1", "true", "yes", "on")


def session_in_force(options: Options) -> str | None:
    """The session id the CLI would report, or None to keep the recorded one."""
    if options.session_id is not None:
        return options.session_id
    if options.resume is not None:
        return str(uuid.uuid4()) if options.fork_session else options.resume
    return None


# ---------------------------------------------------------------------------------------
# Recording files
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# Rewriting recorded values
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# The replay script
# ---------------------------------------------------------------------------------------


class Step(NamedTuple):
    """One thing to do: emit a stdout line, or wait for the host (at the recorded time)."""

    kind: str
    at_ms: float | None
    text: str
    obj: JsonObject

    @classmethod
    def wait(cls, kind: str, at_ms: float | None) -> Step:
        return cls(kind, at_ms, "", {})


class Script(NamedTuple):
    steps: list[Step]
    session_id: str
    first_turn: int
    initialize_payload: JsonObject
    interrupt_reply: JsonObject
    interrupted_result: JsonObject
    exit_code: int


DEFAULT_INITIALIZE_PAYLOAD: JsonObject = {
    "commands": [],
    "agents": [],
    "models": [],
    "account": {"tokenSource": "none", "apiProvider": "firstParty"},
    "pid": 0,
}
DEFAULT_INTERRUPT_REPLY: JsonObject = {
    "type": "control_response",
    "response": {"subtype": "success", "request_id": ""},
}
DEFAULT_INTERRUPTED_RESULT: JsonObject = {
    "type": "result",
    "subtype": "error_during_execution",
    "duration_ms": 0,
    "duration_api_ms": 0,
    "is_error": True,
    "num_turns": 1,
    "stop_reason": None,
    "session_id": "",
    "total_cost_usd": 0,
    "usage": {
        "input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    },
    "modelUsage": {},
    "permission_denials": [],
    "terminal_reason": "aborted_streaming",
    "fast_mode_state": "off",
    "uuid": "",
    "errors": ["[ede_diagnostic] result_type=user last_content_type=n/a stop_reason=null"],
}


def answered_subtype(response: JsonObject, host_requests: dict[str, str]) -> str:
    """Which host request a recorded CLI ``control_response`` answers."""
    request_id = response.get("request_id")
    if isinstance(request_id, str) and request_id in host_requests:
        return host_requests[request_id]
    payload = response.get("response")
    if response.get("subtype") == "success" and (
        payload is None or (isinstance(payload, dict) and "still_queued" in payload)
    ):
        return "interrupt"
    return "initialize" if isinstance(payload, dict) and "commands" in payload else "other"


def host_step(line: Line) -> str | None:
    kind = line.obj.get("type")
    if kind == "user":
        return WAIT_USER
    if kind == "control_response":
        return WAIT_PERMISSION
    request = line.obj.get("request")
    if (
        kind == "control_request"
        and isinstance(request, dict)
        and request.get("subtype") == "interrupt"
    ):
        return WAIT_INTERRUPT
    return None


def build_script(
    lines: list[Line], rewrite: Rewriter, session_id: str, meta_exit_code: int | None
) -> Script:
    """Turn recording lines into steps; keep the recorded replies to host requests as templates."""
    host_requests = {
        str(line.obj.get("request_id")): str(line.obj["request"].get("subtype"))
        for line in lines
        if line.host
        and line.obj.get("type") == "control_request"
        and isinstance(line.obj.get("request"), dict)
    }
    steps: list[Step] = []
    initialize_payload = DEFAULT_INITIALIZE_PAYLOAD
    interrupt_reply = DEFAULT_INTERRUPT_REPLY
    interrupted_result = DEFAULT_INTERRUPTED_RESULT
    last_result: JsonObject = {}
    for line in heal_split_tokens(lines, rewrite.pattern):
        if line.host:
            kind = host_step(line)
            if kind is not None:
                steps.append(Step.wait(kind, line.at_ms))
            continue
        text = rewrite(line.text)
        obj: JsonObject = json.loads(text)
        response = obj.get("response")
        if obj.get("type") == "control_response" and isinstance(response, dict):
            answered = answered_subtype(response, host_requests)
            if answered == "initialize" and isinstance(response.get("response"), dict):
                initialize_payload = response["response"]
            elif answered == "interrupt":
                interrupt_reply = obj
                if response.get("request_id") not in host_requests:
                    steps.append(Step.wait(WAIT_INTERRUPT, line.at_ms))
            continue
        if obj.get("type") == "result":
            last_result = obj
            if obj.get("terminal_reason") == "aborted_streaming":
                interrupted_result = obj
        steps.append(Step(EMIT, line.at_ms, text, obj))
    if not any(step.kind == WAIT_USER for step in steps):
        steps.insert(0, Step.wait(WAIT_USER, None))
    first_turn = next(i for i, step in enumerate(steps) if step.kind == WAIT_USER)
    exit_code = (
        meta_exit_code if meta_exit_code is not None else int(last_result.get("is_error") is True)
    )
    return Script(
        steps,
        session_id,
        first_turn,
        initialize_payload,
        interrupt_reply,
        interrupted_result,
        exit_code,
    )


def load_script(path: str, session: str | None) -> Script:
    lines = read_recording(path)
    recorded_session = recorded_session_id(lines)
    home = os.environ.get("HOME") or os.path.expanduser("~")
    rewrite = Rewriter.for_environment(
        os.getcwd(), home.rstrip("/") or "/", recorded_session, session
    )
    session_id = session or recorded_session or ""
    return build_script(lines, rewrite, session_id, read_exit_code(run_stem(path) + ".meta.json"))


# ---------------------------------------------------------------------------------------
# stdin and stdout
# ---------------------------------------------------------------------------------------


class Malformed(NamedTuple):
    line: str
    error: str


class EndOfInput:
    """Marks stdin EOF in the inbox."""


EOF = EndOfInput()
InboxItem = JsonObject | Malformed | EndOfInput


class Inbox:
    """Host messages, read from stdin by a daemon thread, with timed waits."""

    def __init__(self) -> None:
        self._queue: queue.Queue[InboxItem] = queue.Queue()

    def put(self, item: InboxItem) -> None:
        self._queue.put(item)

    def start_reader(self, fd: int) -> None:
        threading.Thread(target=self._read, args=(fd,), name="stdin-reader", daemon=True).start()

    def get(self, timeout: float | None) -> InboxItem | None:
        """Next item; None when ``timeout`` seconds pass first (``<= 0`` does not block)."""
        try:
            if timeout is not None and timeout <= 0:
                return self._queue.get_nowait()
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def _read(self, fd: int) -> None:
        pending = bytearray()
        while chunk := read_chunk(fd):
            scan_from = len(pending)
            pending += chunk
            while (newline := pending.find(b"\n", scan_from)) >= 0:
                if not self._accept(bytes(pending[:newline])):
                    return
                del pending[: newline + 1]
                scan_from = 0
        if pending.strip() and not self._accept(bytes(pending)):
            return
        self._queue.put(EOF)

    def _accept(self, raw: bytes) -> bool:
        """Queue one stdin line; False after a malformed line (the reader stops)."""
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return True
        try:
            message = json.loads(text)
        except ValueError as error:
            self._queue.put(Malformed(text, str(error)))
            return False
        if isinstance(message, dict):
            self._queue.put(message)
        return True


def read_chunk(fd: int) -> bytes:
    try:
        return os.read(fd, READ_CHUNK)
    except OSError:
        return b""


class Output:
    """stdout writer (unbuffered, one flushed line per call) for the chosen output format."""

    def __init__(self, fd: int, output_format: str) -> None:
        self._fd = fd
        self._format = output_format

    def emit(self, text: str, obj: JsonObject) -> None:
        if self._format == "stream-json":
            self.write_line(text)
        elif obj.get("type") == "result":
            self.write_line(text if self._format == "json" else str(obj.get("result", "")))

    def emit_obj(self, obj: JsonObject) -> None:
        self.emit(dump(obj), obj)

    def write_line(self, text: str) -> None:
        data = memoryview((text + "\n").encode("utf-8"))
        while data:
            data = data[os.write(self._fd, data) :]


# ---------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------


NO_REQUEST = object()


class Reposition(Exception):
    """Raised from a host-message handler after an interrupt moved the play position."""


class FatalInput(Exception):
    """A malformed stdin line: the real CLI prints the message and exits 1."""


class Replayer:
    """Plays a script against the host: paces lines, waits at host points, answers requests."""

    def __init__(
        self,
        script: Script,
        inbox: Inbox,
        output: Output,
        *,
        delay_scale: float,
        interrupt_timeout_s: float,
        loop: bool,
    ) -> None:
        self._script = script
        self._steps = script.steps
        self._inbox = inbox
        self._out = output
        self._delay_scale = delay_scale
        self._interrupt_timeout_s = interrupt_timeout_s
        self._loop = loop
        self._pos = 0
        self._anchor = (time.monotonic(), 0.0)  # (wall clock, recorded ms) of the last host point
        self._pending_turns: deque[JsonObject] = deque(maxlen=MAX_QUEUED_TURNS)
        self._prompts_outstanding = 0
        self._prompt_answers = 0
        self._host_interrupt: Any = NO_REQUEST  # id of a host interrupt bound for a recorded point
        self._eof = False
        self._in_turn = False
        self._turn_started = 0.0
        self._played_to_end = False
        self._last_result: JsonObject = {}

    def run(self) -> int:
        """Replay until stdin EOF; return the exit code."""
        while True:
            try:
                code = self._advance()
            except Reposition:
                continue
            if code is not None:
                return code

    # -- steps ------------------------------------------------------------------------

    def _advance(self) -> int | None:
        if self._pos >= len(self._steps):
            return self._finish()
        step = self._steps[self._pos]
        if step.kind == WAIT_USER:
            return self._await_turn(step)
        if step.kind == WAIT_PERMISSION:
            self._await_permission_answer(step)
        elif step.kind == WAIT_INTERRUPT:
            self._await_interrupt(step)
        else:
            self._play(step)
        return None

    def _finish(self) -> int | None:
        """After the last line: restart at the first turn (loop), or wait for EOF."""
        self._in_turn = False
        self._played_to_end = True
        if self._loop:
            self._pos = self._script.first_turn
            return None
        self._wait_until(lambda: False)
        return self._script.exit_code

    def _await_turn(self, step: Step) -> int | None:
        self._in_turn = False
        if not self._wait_until(lambda: bool(self._pending_turns)):
            return self._script.exit_code if self._played_to_end else 0
        self._pending_turns.popleft()
        self._in_turn = True
        self._turn_started = time.monotonic()
        self._prompts_outstanding = self._prompt_answers = 0
        self._passed_host_point(step)
        return None

    def _await_permission_answer(self, step: Step) -> None:
        if self._wait_until(lambda: self._prompt_answers > 0):
            self._prompt_answers -= 1
        self._passed_host_point(step)

    def _await_interrupt(self, step: Step) -> None:
        self._wait_until(lambda: self._host_interrupt is not NO_REQUEST, self._interrupt_timeout_s)
        if self._host_interrupt is not NO_REQUEST:
            self._reply_interrupt(self._host_interrupt)
            self._host_interrupt = NO_REQUEST
        self._passed_host_point(step)

    def _play(self, step: Step) -> None:
        self._pump_until(self._due(step.at_ms))
        self._out.emit(step.text, step.obj)
        if step.obj.get("type") == "control_request":
            self._prompts_outstanding += 1
        elif step.obj.get("type") == "result":
            self._last_result = step.obj
        self._pos += 1

    def _passed_host_point(self, step: Step) -> None:
        if step.at_ms is not None:
            self._anchor = (time.monotonic(), step.at_ms)
        self._pos += 1

    def _due(self, at_ms: float | None) -> float:
        """Monotonic time to emit a line recorded at ``at_ms``, relative to the last host point."""
        if at_ms is None or self._delay_scale == 0:
            return 0.0
        wall, recorded_ms = self._anchor
        return wall + max(at_ms - recorded_ms, 0.0) * self._delay_scale / 1000.0

    # -- host input -------------------------------------------------------------------

    def _pump_until(self, due: float) -> None:
        """Handle host messages until ``due`` (at least those already queued)."""
        while (item := self._inbox.get(due - time.monotonic())) is not None:
            self._handle(item)

    def _wait_until(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Handle host messages until ``ready()``; False on EOF or timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            if self._eof:
                return False
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            item = self._inbox.get(remaining)
            if item is not None:
                self._handle(item)
        return True

    def _handle(self, item: InboxItem) -> None:
        if isinstance(item, EndOfInput):
            self._eof = True
        elif isinstance(item, Malformed):
            raise FatalInput(
                f"Error parsing streaming input line: {item.line}: SyntaxError: JSON Parse error: {item.error}"
            )
        elif item.get("type") == "user":
            self._pending_turns.append(item)
        elif item.get("type") == "control_request":
            request = item.get("request")
            self._handle_control_request(
                item.get("request_id"), request if isinstance(request, dict) else {}
            )
        elif item.get("type") == "control_response" and self._prompts_outstanding > 0:
            self._prompts_outstanding -= 1
            self._prompt_answers += 1
        # Anything else (keep_alive, unknown types, unrequested responses) is ignored.

    def _handle_control_request(self, request_id: Any, request: JsonObject) -> None:
        subtype = request.get("subtype")
        if subtype == "interrupt":
            self._interrupt(request_id)
        elif subtype == "initialize":
            self._reply_success(request_id, {**self._script.initialize_payload, "pid": os.getpid()})
        elif subtype == "set_permission_mode":
            self._reply_success(request_id, {"mode": request.get("mode")})
        elif subtype == "set_model":
            self._reply_success(request_id)
        else:
            error = f"Unsupported control request subtype: {subtype}"
            self._reply({"subtype": "error", "request_id": request_id, "error": error})

    def _reply(self, response: JsonObject) -> None:
        self._out.emit_obj({"type": "control_response", "response": response})

    def _reply_success(self, request_id: Any, payload: JsonObject | None = None) -> None:
        response: JsonObject = {"subtype": "success", "request_id": request_id}
        if payload is not None:
            response["response"] = payload
        self._reply(response)

    def _reply_interrupt(self, request_id: Any) -> None:
        recorded = self._script.interrupt_reply
        self._out.emit_obj(
            {**recorded, "response": {**recorded["response"], "request_id": request_id}}
        )

    # -- interrupts -------------------------------------------------------------------

    def _interrupt(self, request_id: Any) -> None:
        """Answer a host interrupt; during a turn, end the turn (raises Reposition)."""
        if not self._in_turn:
            self._reply_interrupt(request_id)
            return
        turn_end = next(
            (i for i in range(self._pos, len(self._steps)) if self._steps[i].kind == WAIT_USER),
            len(self._steps),
        )
        recorded_point = next(
            (i for i in range(self._pos, turn_end) if self._steps[i].kind == WAIT_INTERRUPT), None
        )
        if recorded_point is not None:
            self._host_interrupt = request_id
            self._pos = recorded_point
        else:
            self._reply_interrupt(request_id)
            self._emit_interruption()
            self._pos = turn_end
            self._in_turn = False
        raise Reposition

    def _emit_interruption(self) -> None:
        """The notice and ``result`` the real CLI prints for an interrupted turn."""
        session = self._script.session_id
        self._out.emit_obj(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [{"type": "text", "text": INTERRUPT_NOTICE}],
                },
                "parent_tool_use_id": None,
                "session_id": session,
                "uuid": str(uuid.uuid4()),
                "timestamp": iso_timestamp(time.time()),
            }
        )
        result = {
            **self._script.interrupted_result,
            "duration_ms": int((time.monotonic() - self._turn_started) * 1000),
            "session_id": session,
            "uuid": str(uuid.uuid4()),
        }
        for cumulative in ("total_cost_usd", "modelUsage"):
            if cumulative in self._last_result:
                result[cumulative] = self._last_result[cumulative]
        self._out.emit_obj(result)


def iso_timestamp(seconds: float) -> str:
    """UTC time like the CLI's ``timestamp`` fields: ``2026-11-29T09:04:22.650Z``."""
    millis = int(seconds * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


def one_shot_prompt(options: Options) -> JsonObject:
    """The user message of a text-input run: the prompt argument, else all of stdin."""
    prompt = " ".join(options.prompt)
    if not prompt.strip():
        prompt = sys.stdin.read() if sys.stdin else ""
    if not prompt.strip():
        raise UsageError(
            "Error: Input must be provided either through stdin or as a prompt argument when using --print"
        )
    return {
        "type": "user",
        "message": {"role": "user", "content": prompt},
        "parent_tool_use_id": None,
        "session_id": "",
    }


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
        fixture = choose_fixture(options)
        if options.version:
            Output(1, "stream-json").write_line(f"{read_version(fixture)} (Claude Code)")
            return 0
        check_options(options)
        delay_scale, interrupt_timeout_s = parse_speed(options), parse_interrupt_timeout()
        script = load_script(fixture, session_in_force(options))
        inbox = Inbox()
        if options.input_format == "stream-json":
            inbox.start_reader(0)
        else:
            inbox.put(one_shot_prompt(options))
            inbox.put(EOF)
        replayer = Replayer(
            script,
            inbox,
            Output(1, options.output_format),
            delay_scale=delay_scale,
            interrupt_timeout_s=interrupt_timeout_s,
            loop=loop_enabled(options),
        )
        return replayer.run()
    except (UsageError, FatalInput) as error:
        sys.stderr.write(f"{error}\n")
        return EXIT_CLI_ERROR
    except ConfigError as error:
        sys.stderr.write(f"{error}\n")
        return EXIT_FAKE_CONFIG_ERROR
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
