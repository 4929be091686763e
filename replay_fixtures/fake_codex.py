"""A fake ``codex`` CLI: ``codex app-server`` replaying a recorded Codex 0.171.0 session.

Job: stand in for the real CLI in tests, benchmarks and demos. It accepts the real CLI's
command line (``codex [-c key=value]... app-server [-c key=value]... [--listen stdio://]``),
speaks the app-server's JSON-RPC on stdin/stdout, and replays one recording (format:
``replay_fixtures/README.md``). This module is the player and ``main``; the recording is
read by ``transcript`` and compiled by ``codex_script``; the pacing and ``T3D_REPLAY_*``
settings are the fake ``claude``'s (``fake_cli_args``).

Rules:

* Standard library only; no heavy imports (start-up must stay fast).
* stdout lines are the script's (the recording's, rewritten), one flushed write each,
  paced from the host input before them; like the real server it omits ``"jsonrpc"``.
* Host requests are answered wherever they arrive, like the real server: ``initialize``
  once (a second gets ``Already initialized``, anything before it ``Not initialized``),
  ``thread/start`` and ``thread/resume`` (an unknown thread gets ``no rollout found``),
  ``turn/start`` (queued until the script reaches a turn), ``turn/interrupt`` (ends the
  running turn ``interrupted``), ``turn/steer`` (taken into the running turn, which plays
  on as recorded), ``account/read``; any other method gets Codex's
  ``unknown variant`` error. A malformed stdin line gets no reply, as with the real CLI.
* Server requests (approvals) get the fake's own ids, counting from 0; the replay waits
  for the host's answer and goes on the same way whatever it was, except ``cancel``,
  which interrupts the turn as Codex does.
* A thread's rollout is a file under ``$CODEX_HOME/sessions`` when ``CODEX_HOME`` is set
  (resume then needs it); without ``CODEX_HOME`` every thread id but the recorded unknown
  one resumes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from replay_fixtures.codex_edits import CodexEditApplier
from replay_fixtures.codex_script import (
    WAIT_ANSWER,
    WAIT_INITIALIZE,
    WAIT_INTERRUPT,
    WAIT_THREAD,
    WAIT_TURN,
    Script,
    Step,
    load_script,
)
from replay_fixtures.fake_claude import EndOfInput, Inbox, Malformed, Output
from replay_fixtures.fake_cli_args import (
    ENV_APPLY_EDITS,
    ENV_FIXTURE,
    ConfigError,
    loop_enabled,
    parse_interrupt_timeout,
    parse_speed,
)
from replay_fixtures.transcript import JsonObject, dump, read_exit_code, run_stem

VERSION = "codex-cli 0.171.0"
FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "codex")
DEFAULT_FIXTURE = os.path.join(FIXTURES_DIR, "codex-0.171.0_app-server_multiturn.jsonl")
UNKNOWN_THREAD = "00000000-0000-0000-0000-000000000000"
ENV_HOST_LOG = "T3D_REPLAY_HOST_LOG"

EXIT_USAGE = 2
MAX_QUEUED = 64
INVALID_REQUEST = -32600


class UsageError(Exception):
    """A command line the fake cannot run (exit 2, message on stderr)."""


class Reposition(Exception):
    """Raised from a host-message handler after an interrupt moved the play position."""


NO_REQUEST = object()


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------


class Options:
    """What the command line asks for; the attributes ``fake_cli_args`` reads are here too."""

    def __init__(self) -> None:
        self.command: str | None = None
        self.version = False
        self.overrides: list[str] = []
        self.listen = "stdio://"
        self.fixture: str | None = None
        self.speed: str | None = None
        self.loop = False
        self.apply_edits = False


VALUE_FLAGS = {"--listen": "listen", "--replay-fixture": "fixture", "--speed": "speed"}
BOOL_FLAGS = {"--replay-loop": "loop", "--apply-edits": "apply_edits"}
GLOBAL_VALUE_FLAGS = frozenset(
    {"-c", "--config", "--enable", "--disable", "-m", "--model", "-p", "--profile", "-s", "--sandbox",
     "-a", "--ask-for-approval", "-C", "--cd", "--add-dir", "-i", "--image",
     "--ws-auth", "--ws-token", "--ws-token-file", "--ws-signing-key-file"}
)  # fmt: skip


def parse_args(argv: list[str]) -> Options:
    """Parse argv like the real CLI: global options, the subcommand, its options."""
    options = Options()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        flag, has_inline, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        takes_value = flag in VALUE_FLAGS or flag in GLOBAL_VALUE_FLAGS
        value = ""
        if takes_value:
            if has_inline:
                value = inline
            elif i < len(argv):
                value, i = argv[i], i + 1
            else:
                raise UsageError(
                    f"error: a value is required for '{flag} <VALUE>' but none was supplied"
                )
        if flag in ("--version", "-V"):
            options.version = True
        elif flag in ("-c", "--config"):
            if "=" not in value:
                raise UsageError(f"Error: Invalid override (missing '='): {value}")
            options.overrides.append(value)
        elif flag == "--stdio":
            options.listen = "stdio://"
        elif flag in VALUE_FLAGS:
            setattr(options, VALUE_FLAGS[flag], value)
        elif flag in BOOL_FLAGS:
            setattr(options, BOOL_FLAGS[flag], True)
        elif not arg.startswith("-") and options.command is None:
            options.command = arg
        # Other flags (--strict-config, --print-startup-config, ...) are accepted and ignored.
    return options


def check_options(options: Options) -> None:
    if options.command != "app-server":
        raise UsageError(
            f"fake codex: only `codex app-server` is replayed, not {options.command or 'the interactive CLI'!r}"
        )
    if options.listen not in ("stdio://", "stdio"):
        raise UsageError(f"fake codex: only --listen stdio:// is replayed, not {options.listen!r}")


def choose_fixture(options: Options) -> str:
    return options.fixture or os.environ.get(ENV_FIXTURE) or DEFAULT_FIXTURE


def apply_edits_enabled(options: Options) -> bool:
    return options.apply_edits or os.environ.get(ENV_APPLY_EDITS, "").lower() in (
        "1",
        "true",
        "yes",
        "on",
    )


# ---------------------------------------------------------------------------------------
# Rollouts: which threads can be resumed
# ---------------------------------------------------------------------------------------


class Rollouts:
    """Thread ids that exist, as files under ``$CODEX_HOME/sessions`` (when it is set)."""

    def __init__(self, codex_home: str | None) -> None:
        self._dir = os.path.join(codex_home, "sessions") if codex_home else None
        self._mine: set[str] = set()

    def create(self, thread_id: str) -> None:
        self._mine.add(thread_id)
        if self._dir is None:
            return
        try:
            os.makedirs(self._dir, exist_ok=True)
            with open(
                os.path.join(self._dir, f"rollout-fake-{thread_id}.jsonl"), "a", encoding="utf-8"
            ):
                pass
        except OSError as error:
            sys.stderr.write(f"fake codex: could not write a rollout: {error}\n")

    def exists(self, thread_id: str) -> bool:
        if thread_id in self._mine:
            return True
        if self._dir is None:
            return thread_id != UNKNOWN_THREAD
        return os.path.exists(os.path.join(self._dir, f"rollout-fake-{thread_id}.jsonl"))


# ---------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------


class CodexInbox(Inbox):
    """The fake ``claude``'s stdin reader, except that a malformed line is skipped; with
    ``log`` (``T3D_REPLAY_HOST_LOG``), every stdin line is also appended to that file."""

    def __init__(self, log: str | None = None) -> None:
        super().__init__()
        self._log = log

    def _accept(self, raw: bytes) -> bool:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return True
        if self._log:
            with open(self._log, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")
        try:
            message = json.loads(text)
        except ValueError:
            return True  # the real app-server does not answer a line that is not JSON
        if isinstance(message, dict):
            self.put(message)
        return True


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
        rollouts: Rollouts,
        edits: CodexEditApplier | None = None,
    ) -> None:
        self._script = script
        self._steps = script.steps
        self._inbox = inbox
        self._out = output
        self._delay_scale = delay_scale
        self._interrupt_timeout_s = interrupt_timeout_s
        self._loop = loop
        self._rollouts = rollouts
        self._edits = edits
        self._pos = 0
        self._anchor = (time.monotonic(), 0.0)
        self._initialized = False
        self._thread_waits = deque[JsonObject](maxlen=MAX_QUEUED)
        self._init_waits = deque[JsonObject](maxlen=MAX_QUEUED)
        self._turns = deque[JsonObject](maxlen=MAX_QUEUED)
        self._host_ids: dict[Any, Any] = {}  # recorded host request id -> the host's id
        self._server_ids: dict[Any, int] = {}  # recorded server request id -> ours
        self._next_server_id = 0
        self._last_request: int | None = None
        self._outstanding: set[int] = set()
        self._answers: dict[int, JsonObject] = {}
        self._host_interrupt: Any = NO_REQUEST
        self._thread_done = False  # the script's thread wait is behind us
        self._live_thread = script.thread_id
        self._live_turn = ""
        self._replace: list[tuple[str, str]] = []
        self._eof = False
        self._in_turn = False
        self._turn_started = 0.0
        self._played_to_end = False

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
        if step.kind == WAIT_TURN:
            return self._await_turn(step)
        if step.kind == WAIT_INITIALIZE:
            return self._await_initialize(step)
        if step.kind == WAIT_THREAD:
            return self._await_thread(step)
        if step.kind == WAIT_ANSWER:
            self._await_answer(step)
        elif step.kind == WAIT_INTERRUPT:
            self._await_interrupt(step)
        else:
            self._play(step)
        return None

    def _finish(self) -> int | None:
        self._in_turn = False
        self._played_to_end = True
        if self._loop and self._script.first_turn < len(self._steps):
            self._pos = self._script.first_turn
            return None
        self._wait_until(lambda: False)
        return self._script.exit_code

    def _exit_code(self) -> int:
        return self._script.exit_code if self._played_to_end else 0

    def _await_initialize(self, step: Step) -> int | None:
        if not self._wait_until(lambda: bool(self._init_waits)):
            return self._exit_code()
        request = self._init_waits.popleft()
        self._initialized = True
        self._host_ids[step.recorded_id] = request.get("id")
        self._passed_host_point(step)
        return None

    def _await_thread(self, step: Step) -> int | None:
        if not self._wait_until(lambda: bool(self._thread_waits)):
            return self._exit_code()
        request = self._thread_waits.popleft()
        self._thread_done = True
        self._live_thread = self._open_thread(request)
        self._replace = (
            [(self._script.thread_id, self._live_thread)] if self._script.thread_id else []
        )
        self._host_ids[step.recorded_id] = request.get("id")
        self._passed_host_point(step)
        return None

    def _await_turn(self, step: Step) -> int | None:
        self._in_turn = False
        if not self._wait_until(lambda: bool(self._turns)):
            return self._exit_code()
        request = self._turns.popleft()
        params = request.get("params") if isinstance(request.get("params"), dict) else {}
        thread = params.get("threadId") if isinstance(params, dict) else None
        if isinstance(thread, str) and thread:
            self._live_thread = thread
        self._live_turn = new_id()
        self._replace = (
            [(self._script.thread_id, self._live_thread)] if self._script.thread_id else []
        )
        if step.turn_id:
            self._replace.append((step.turn_id, self._live_turn))
        self._host_ids[step.recorded_id] = request.get("id")
        self._in_turn = True
        self._turn_started = time.monotonic()
        self._passed_host_point(step)
        return None

    def _await_answer(self, step: Step) -> None:
        wanted = self._last_request
        if wanted is not None and self._wait_until(lambda: wanted in self._answers):
            answer = self._answers.pop(wanted)
            self._passed_host_point(step)
            if answer_decision(answer) == "cancel":
                self._interrupt(None)  # Codex interrupts the turn on cancel
            return
        self._passed_host_point(step)

    def _await_interrupt(self, step: Step) -> None:
        self._wait_until(lambda: self._host_interrupt is not NO_REQUEST, self._interrupt_timeout_s)
        if self._host_interrupt is not NO_REQUEST:
            self._host_ids[step.recorded_id] = self._host_interrupt
            self._host_interrupt = NO_REQUEST
        self._passed_host_point(step)

    def _play(self, step: Step) -> None:
        self._pump_until(self._due(step.at_ms))
        self._pos += 1
        text = step.text
        for recorded, live in self._replace:
            text = text.replace(recorded, live)
        obj: JsonObject | None = None
        if step.answers is not None:
            if step.answers not in self._host_ids:
                return  # the host never sent this request (an interrupt that did not come)
            obj = json.loads(text)
            obj["id"] = self._host_ids.pop(step.answers)
        elif step.request is not None:
            obj = json.loads(text)
            obj["id"] = self._server_ids[step.request] = self._new_server_id()
        elif '"serverRequest/resolved"' in text:
            obj = json.loads(text)
            params = obj.get("params")
            if isinstance(params, dict):
                params["requestId"] = self._server_ids.get(
                    params.get("requestId"), params.get("requestId")
                )
        if obj is not None:
            text = dump(obj)
        self._out.write_line(text)
        if self._edits is not None and '"fileChange"' in text and '"item/completed"' in text:
            self._edits.see(obj if obj is not None else json.loads(text))

    def _new_server_id(self) -> int:
        request_id = self._next_server_id
        self._next_server_id += 1
        self._outstanding.add(request_id)
        self._last_request = request_id
        return request_id

    def _passed_host_point(self, step: Step) -> None:
        if step.at_ms is not None:
            self._anchor = (time.monotonic(), step.at_ms)
        self._pos += 1

    def _due(self, at_ms: float | None) -> float:
        if at_ms is None or self._delay_scale == 0:
            return 0.0
        wall, recorded_ms = self._anchor
        return wall + max(at_ms - recorded_ms, 0.0) * self._delay_scale / 1000.0

    # -- host input -------------------------------------------------------------------

    def _pump_until(self, due: float) -> None:
        while (item := self._inbox.get(due - time.monotonic())) is not None:
            self._handle(item)

    def _wait_until(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
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

    def _handle(self, item: JsonObject | Malformed | EndOfInput) -> None:
        if isinstance(item, EndOfInput):
            self._eof = True
            return
        if isinstance(item, Malformed):
            return
        method = item.get("method")
        if isinstance(method, str) and "id" in item:
            self._request(item.get("id"), method, item)
        elif "id" in item and ("result" in item or "error" in item):
            answered = item.get("id")
            if answered in self._outstanding:
                self._outstanding.discard(answered)
                self._answers[answered] = item
        # Notifications (`initialized`) and anything else need no answer.

    def _request(self, request_id: Any, method: str, request: JsonObject) -> None:
        params = request.get("params") if isinstance(request.get("params"), dict) else {}
        if method == "initialize":
            if self._initialized or self._init_waits:
                self._error(request_id, self._script.errors["already_initialized"])
            elif self._has_wait(WAIT_INITIALIZE):
                self._init_waits.append(request)
            else:
                self._initialized = True
                self._result(request_id, self._script.initialize_result)
        elif not self._initialized:
            self._error(request_id, self._script.errors["not_initialized"])
        elif method in ("thread/start", "thread/resume"):
            self._thread_request(request_id, method, params)
        elif method == "turn/start":
            self._turns.append(request)
        elif method == "turn/interrupt":
            self._interrupt(request_id)
        elif method == "turn/steer":
            self._steer(request_id, params)
        elif method == "account/read":
            self._result(
                request_id,
                {
                    "account": None,
                    "userId": None,
                    "requiresOpenaiAuth": False,
                    "workspaceRouting": None,
                },
            )
        else:
            self._error(
                request_id,
                f"Invalid request: unknown variant `{method}`, expected one of `initialize`, `thread/start`, `thread/resume`, `turn/start`, `turn/interrupt`, …",
            )

    def _steer(self, request_id: Any, params: JsonObject) -> None:
        """``turn/steer``: more input for the running turn, which goes on as recorded (the
        input is the model's from its next request on). Refused without a running turn, or
        when ``expectedTurnId`` names another one."""
        expected = params.get("expectedTurnId")
        if not self._in_turn:
            self._error(request_id, "no active turn to steer")
        elif expected != self._live_turn:
            self._error(request_id, f"expected active turn id {expected} but found {self._live_turn}")
        else:
            self._result(request_id, {"turnId": self._live_turn})

    def _thread_request(self, request_id: Any, method: str, params: JsonObject) -> None:
        if method == "thread/resume":
            wanted = params.get("threadId")
            if not isinstance(wanted, str) or not self._rollouts.exists(wanted):
                self._error(request_id, self._script.errors["no_rollout"].format(wanted))
                return
        request = {"id": request_id, "method": method, "params": params}
        if not self._thread_done and self._has_wait(WAIT_THREAD):
            self._thread_waits.append(request)
            return
        thread_id = self._open_thread(request)  # the script has had its thread: a template
        result = json.loads(
            dump(self._script.thread_result).replace(self._script.thread_id or "\0", thread_id)
        )
        self._result(request_id, result)

    def _open_thread(self, request: JsonObject) -> str:
        params = request.get("params")
        wanted = params.get("threadId") if isinstance(params, dict) else None
        if request.get("method") == "thread/resume" and isinstance(wanted, str):
            return wanted
        thread_id = new_id()
        self._rollouts.create(thread_id)
        return thread_id

    def _has_wait(self, kind: str) -> bool:
        return any(step.kind == kind for step in self._steps[self._pos :])

    def _result(self, request_id: Any, result: Any) -> None:
        self._out.write_line(dump({"id": request_id, "result": result}))

    def _error(self, request_id: Any, message: str) -> None:
        self._out.write_line(
            dump({"error": {"code": INVALID_REQUEST, "message": message}, "id": request_id})
        )

    # -- interrupts -------------------------------------------------------------------

    def _interrupt(self, request_id: Any) -> None:
        """Answer a host interrupt (``request_id`` None: a cancelled approval); during a
        turn, end the turn (raises Reposition)."""
        if not self._in_turn:
            if request_id is not None:
                self._result(request_id, {})
            return
        turn_end = next(
            (i for i in range(self._pos, len(self._steps)) if self._steps[i].kind == WAIT_TURN),
            len(self._steps),
        )
        recorded_point = next(
            (i for i in range(self._pos, turn_end) if self._steps[i].kind == WAIT_INTERRUPT), None
        )
        if recorded_point is not None and request_id is not None:
            self._host_interrupt = request_id
            self._pos = recorded_point
        else:
            if request_id is not None:
                self._result(request_id, {})
            self._emit_interruption()
            self._pos = turn_end
            self._in_turn = False
        raise Reposition

    def _emit_interruption(self) -> None:
        """The lines the real server writes for an interrupted turn."""
        thread, turn = self._live_thread, self._live_turn
        now_ms = int(time.time() * 1000)
        self._out.write_line(
            dump(
                {
                    "method": "thread/status/changed",
                    "params": {"threadId": thread, "status": {"type": "idle"}},
                    "emittedAtMs": now_ms,
                }
            )
        )
        completed = {
            "id": turn, "rootTurnId": turn, "items": [], "itemsView": "notLoaded", "status": "interrupted",
            "error": None, "startedAt": int(self._turn_started), "completedAt": now_ms // 1000,
            "durationMs": int((time.monotonic() - self._turn_started) * 1000),
        }  # fmt: skip
        self._out.write_line(
            dump(
                {
                    "method": "turn/completed",
                    "params": {"threadId": thread, "turn": completed},
                    "emittedAtMs": now_ms,
                }
            )
        )


def answer_decision(answer: JsonObject) -> Any:
    result = answer.get("result")
    return result.get("decision") if isinstance(result, dict) else None


def new_id() -> str:
    return str(uuid.uuid4())


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Tests of force stop: a provider that ignores SIGTERM must still be KILLed.
    ignore_term = os.environ.get("T3D_FAKE_IGNORE_SIGTERM") == "1"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_term else signal.SIG_DFL)
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
        if options.version:
            Output(1, "stream-json").write_line(VERSION)
            return 0
        check_options(options)
        delay_scale, interrupt_timeout_s = parse_speed(options), parse_interrupt_timeout()  # type: ignore[arg-type]
        fixture = choose_fixture(options)
        script = load_script(fixture, read_exit_code(run_stem(fixture) + ".meta.json"))
        inbox = CodexInbox(os.environ.get(ENV_HOST_LOG))
        inbox.start_reader(0)
        replayer = Replayer(
            script,
            inbox,
            Output(1, "stream-json"),
            delay_scale=delay_scale,
            interrupt_timeout_s=interrupt_timeout_s,
            loop=loop_enabled(options),  # type: ignore[arg-type]
            rollouts=Rollouts(os.environ.get("CODEX_HOME")),
            edits=CodexEditApplier() if apply_edits_enabled(options) else None,
        )
        return replayer.run()
    except UsageError as error:
        sys.stderr.write(f"{error}\n")
        return EXIT_USAGE
    except ConfigError as error:
        sys.stderr.write(f"{str(error).replace('fake claude', 'fake codex')}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
