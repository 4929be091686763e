"""A fake ``claude`` CLI that replays a recorded Claude Code 2.1.197 stream-json transcript.

Job: stand in for the real CLI in tests and benchmarks. It accepts the real CLI's flags,
speaks the stream-json protocol on stdin/stdout, and replays one recording (format:
``replay_fixtures/README.md``). This module is the player and ``main``; the command line
is parsed in ``fake_cli_args``, the recording read and rewritten in ``transcript``, and
turned into steps in ``replay_script``.

Rules:

* Standard library only; no heavy imports (start-up must stay fast).
* stdout lines are the script's (the recording's, rewritten), flushed one by one, each
  paced from the host input before it.
* A wait step is a point where the fake waits for the host: a turn boundary waits for a
  user message, a permission wait for the answer to the preceding ``can_use_tool`` prompt,
  an interrupt wait (bounded) for the host's interrupt. Host lines are matched by type,
  never byte for byte, and the replay goes on whatever the host answered.
* Recorded ``control_response`` lines answer *host* requests (initialize, interrupt, ...):
  they are never played unprompted, only sent in reply to a real host request, carrying
  the host's ``request_id``.
* Host control requests are answered wherever they arrive, like the real CLI. An interrupt
  in the middle of a turn ends the turn: at the turn's recorded interrupt point if it has
  one, otherwise with a synthetic interrupted ``result``.
* stdin is read by a background thread into a queue, so every wait has a deadline and
  control requests are answered during playback. A malformed stdin line is fatal (exit 1).
* Output with no user message before it (a background task waking the agent after a
  ``result``) plays like any other, at its recorded time after the last host input; the
  fake is between turns from a ``result`` until the next turn's first line, so an
  interrupt there is only answered, and an interrupt in such a turn ends that turn only.
* An interrupt that cuts a message short makes its partial ``assistant`` line carry the
  text the fake streamed, not the recorded one.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from replay_fixtures.apply_edits import EditApplier
from replay_fixtures.fake_cli_args import (
    ConfigError,
    Options,
    UsageError,
    apply_edits_enabled,
    check_options,
    choose_fixture,
    loop_enabled,
    parse_args,
    parse_interrupt_timeout,
    parse_speed,
    session_in_force,
)
from replay_fixtures.replay_script import (
    EMIT,
    WAIT_INTERRUPT,
    WAIT_PERMISSION,
    WAIT_USER,
    Script,
    Step,
    load_script,
)
from replay_fixtures.transcript import JsonObject, dump, read_version

EXIT_CLI_ERROR = 1
EXIT_FAKE_CONFIG_ERROR = 2

MAX_QUEUED_TURNS = 64
READ_CHUNK = 65536

INTERRUPT_NOTICE = "[Request interrupted by user]"


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


ENV_HOST_LOG = "T3D_REPLAY_HOST_LOG"


class Inbox:
    """Host messages, read from stdin by a daemon thread, with timed waits; with ``log``
    (``T3D_REPLAY_HOST_LOG``), every stdin line is also appended to that file."""

    def __init__(self, log: str | None = None) -> None:
        self._queue: queue.Queue[InboxItem] = queue.Queue()
        self._log = log

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
        if self._log:
            with open(self._log, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")
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
        edits: EditApplier | None = None,
    ) -> None:
        self._script = script
        self._steps = script.steps
        self._inbox = inbox
        self._out = output
        self._delay_scale = delay_scale
        self._interrupt_timeout_s = interrupt_timeout_s
        self._loop = loop
        self._edits = edits  # --apply-edits: recorded file edits change real files
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
        # Text streamed per block of the current message, and whether an interrupt cut the
        # message short (its partial assistant line then carries what was streamed).
        self._streamed: dict[Any, str] = {}
        self._last_block: Any = None
        self._cut_short = False

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
        obj, text = step.obj, step.text
        kind = obj.get("type")
        if not self._in_turn and starts_turn(obj):  # a turn with no user message: a wake
            self._in_turn = True
            self._turn_started = time.monotonic()
        self._track_stream(obj)
        if kind == "assistant" and self._cut_short:
            obj, text = self._streamed_text(obj, text)
        self._out.emit(text, obj)
        if self._edits is not None:
            self._edits.see(obj)
        if kind == "control_request":
            self._prompts_outstanding += 1
        elif kind == "result":
            self._last_result = obj
            self._in_turn = False
            self._cut_short = False
        self._pos += 1

    def _track_stream(self, obj: JsonObject) -> None:
        event = obj.get("event") if obj.get("type") == "stream_event" else None
        if not isinstance(event, dict):
            return
        if event.get("type") == "message_start":
            self._streamed, self._last_block, self._cut_short = {}, None, False
        elif event.get("type") == "content_block_delta" and isinstance(event.get("delta"), dict):
            delta = event["delta"]
            piece = delta.get("text", delta.get("thinking"))
            if isinstance(piece, str):
                index = event.get("index")
                self._streamed[index] = self._streamed.get(index, "") + piece
                self._last_block = index

    def _streamed_text(self, obj: JsonObject, text: str) -> tuple[JsonObject, str]:
        """The partial assistant line of a message cut short: the text actually streamed."""
        message = obj.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], dict):
            return obj, text
        block = content[0]
        field = {"text": "text", "thinking": "thinking"}.get(str(block.get("type")))
        if field is None or self._last_block not in self._streamed:
            return obj, text
        rewritten = {**obj, "message": {**message, "content": [{**block, field: self._streamed[self._last_block]}]}}
        return rewritten, dump(rewritten)

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
        turn_end = self._turn_end()
        recorded_point = next(
            (i for i in range(self._pos, turn_end) if self._steps[i].kind == WAIT_INTERRUPT), None
        )
        if recorded_point is not None:
            self._host_interrupt = request_id
            self._cut_short = self._cut_short or any(
                self._steps[i].kind == EMIT and is_delta(self._steps[i].obj) for i in range(self._pos, recorded_point)
            )
            self._skip_to(recorded_point)
        else:
            self._reply_interrupt(request_id)
            self._emit_interruption()
            self._skip_to(turn_end)
            self._in_turn = False
        raise Reposition

    def _skip_to(self, position: int) -> None:
        """Jump ahead; a user line skipped inside the turn was a message steered into it,
        which the host's message already queued stands for (the CLI runs it after the turn)."""
        for i in range(self._pos, position):
            if self._steps[i].kind == WAIT_USER and self._pending_turns:
                self._pending_turns.popleft()
        self._pos = position

    def _turn_end(self) -> int:
        """Where the turn being played ends: just past its ``result`` (what follows may be a
        turn of its own: a wake, or the answer to a steered message). A user line before the
        result is a message steered into the turn, not its end."""
        for i in range(self._pos, len(self._steps)):
            step = self._steps[i]
            if step.kind == EMIT and step.obj.get("type") == "result":
                return i + 1
        return len(self._steps)

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


def starts_turn(obj: JsonObject) -> bool:
    """A line of the agent's own turn (not a task, status or subagent line): played while
    no turn runs, it starts one."""
    kind = obj.get("type")
    if kind == "system":
        return obj.get("subtype") == "init"
    return kind in ("assistant", "stream_event", "user", "result") and not obj.get("parent_tool_use_id")


def is_delta(obj: JsonObject) -> bool:
    event = obj.get("event")
    return obj.get("type") == "stream_event" and isinstance(event, dict) and event.get("type") == "content_block_delta"


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
    # Tests of force stop: a provider that ignores SIGTERM must still be KILLed.
    ignore_term = os.environ.get("T3D_FAKE_IGNORE_SIGTERM") == "1"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_term else signal.SIG_DFL)
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
        fixture = choose_fixture(options)
        if options.version:
            Output(1, "stream-json").write_line(f"{read_version(fixture)} (Claude Code)")
            return 0
        check_options(options)
        delay_scale, interrupt_timeout_s = parse_speed(options), parse_interrupt_timeout()
        script = load_script(fixture, session_in_force(options))
        inbox = Inbox(os.environ.get(ENV_HOST_LOG))
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
            edits=EditApplier() if apply_edits_enabled(options) else None,
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
