"""The fake ``claude`` CLI's command line and environment: what to replay, and how.

Job: turn argv (and the ``T3D_REPLAY_*`` variables) into ``Options`` and the fake's own
settings, rejecting what the real Claude Code 2.1.197 CLI rejects.

Rules:

* argv is parsed like the real CLI (commander): every real flag is accepted; the few that
  change what the fake does are kept, the rest are skipped. Unknown flags are never fatal.
* A command line the real CLI rejects raises ``UsageError`` with the real CLI's message
  (the fake exits 1).
* The fake's own settings come from a flag, else from the environment (fixture, speed,
  loop), or from the environment only (interrupt timeout). An invalid speed or timeout
  raises ``ConfigError`` (the fake exits 2).
* Standard library only; no heavy imports.
"""

from __future__ import annotations

import os
import re
import uuid

FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "claude")
DEFAULT_FIXTURE = os.path.join(FIXTURES_DIR, "claude-2.1.197_multiturn_tools.jsonl")

ENV_FIXTURE = "T3D_REPLAY_FIXTURE"
ENV_SPEED = "T3D_REPLAY_SPEED"
ENV_LOOP = "T3D_REPLAY_LOOP"
ENV_APPLY_EDITS = "T3D_REPLAY_APPLY_EDITS"
ENV_INTERRUPT_TIMEOUT = "T3D_REPLAY_INTERRUPT_TIMEOUT"

DEFAULT_INTERRUPT_TIMEOUT_S = 10.0

UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class UsageError(Exception):
    """A command line the real CLI rejects (exit 1, message on stderr)."""


class ConfigError(Exception):
    """A problem with the fake's own configuration: fixture, speed, timeouts (exit 2)."""


class Options:
    """The flags that change what the fake does; every other real flag is accepted and ignored."""

    def __init__(self) -> None:
        self.print_mode = False
        self.verbose = False
        self.version = False
        self.fork_session = False
        self.loop = False
        self.apply_edits = False
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
    "--apply-edits": "apply_edits",
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


def apply_edits_enabled(options: Options) -> bool:
    """``--apply-edits``, or ``T3D_REPLAY_APPLY_EDITS=1`` (``0`` leaves files alone)."""
    return options.apply_edits or os.environ.get(ENV_APPLY_EDITS, "").lower() in ("1", "true", "yes", "on")


def session_in_force(options: Options) -> str | None:
    """The session id the CLI would report, or None to keep the recorded one."""
    if options.session_id is not None:
        return options.session_id
    if options.resume is not None:
        return str(uuid.uuid4()) if options.fork_session else options.resume
    return None
