"""Host → CLI side of the Claude Code stream-json protocol (PROTOCOLS.md §1.1, §1.2).

Theory of operation
-------------------
The CLI reads one JSON object per line on stdin. This module does no I/O and
keeps no session state:

* The ``encode_*`` functions turn what the host wants into one stdin line each.
* `build_argv` gives the spawn line of a long-lived session process.

The session driver picks the ``request_id`` s, writes the lines and
correlates the CLI's answers (parsed by `t3d.providers.claude.protocol`).

Rules
-----
* **Local errors.** Every encoder serialises with orjson, so its output is
  one line of valid JSON or an exception at the call site (a value that is
  not JSON). A malformed stdin line kills the CLI and its turn (§1.6), so
  nothing here builds JSON by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from t3d.providers.claude.events import JsonObject

# -- stdin lines ------------------------------------------------------------------------


def _line(obj: JsonObject) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def encode_user_message(text: str, session_id: str = "") -> bytes:
    """A user turn. ``session_id`` may be ``""`` before the first ``init``."""
    return _line(
        {
            "type": "user",
            "message": {"role": "user", "content": text},
            "parent_tool_use_id": None,
            "session_id": session_id,
        }
    )


def _control_request(request_id: str, request: JsonObject) -> bytes:
    return _line({"type": "control_request", "request_id": request_id, "request": request})


def encode_initialize(request_id: str) -> bytes:
    """The optional ``initialize`` handshake; its response lists commands, models and the pid."""
    return _control_request(request_id, {"subtype": "initialize", "hooks": None})


def encode_interrupt(request_id: str) -> bytes:
    """Stop the running turn; it ends with an ``error_during_execution`` result."""
    return _control_request(request_id, {"subtype": "interrupt"})


def encode_set_permission_mode(request_id: str, mode: str) -> bytes:
    """Switch the permission mode (``default``, ``acceptEdits``, ``plan``, …)."""
    return _control_request(request_id, {"subtype": "set_permission_mode", "mode": mode})


def encode_set_model(request_id: str, model: str) -> bytes:
    """Switch the model for later API calls (an alias such as ``sonnet`` or a full name)."""
    return _control_request(request_id, {"subtype": "set_model", "model": model})


def _control_success(request_id: str, response: JsonObject) -> bytes:
    return _line(
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": request_id, "response": response},
        }
    )


def encode_permission_allow(request_id: str, updated_input: Mapping[str, Any]) -> bytes:
    """Allow a ``can_use_tool`` request; pass the request's ``input`` unless editing it."""
    return _control_success(request_id, {"behavior": "allow", "updatedInput": dict(updated_input)})


def encode_permission_deny(request_id: str, message: str) -> bytes:
    """Deny a ``can_use_tool`` request; ``message`` goes to the model as the tool's error."""
    return _control_success(request_id, {"behavior": "deny", "message": message})


def encode_control_error(request_id: str, message: str) -> bytes:
    """Refuse a CLI control request the host cannot serve."""
    return _line(
        {
            "type": "control_response",
            "response": {"subtype": "error", "request_id": request_id, "error": message},
        }
    )


# -- spawning ---------------------------------------------------------------------------

_BASE_FLAGS = (
    "--output-format",
    "stream-json",
    "--verbose",
    "--input-format",
    "stream-json",
    "--include-partial-messages",
    "--permission-prompt-tool",
    "stdio",
)


def build_argv(
    binary: str,
    *,
    model: str | None = None,
    permission_mode: str | None = None,
    resume: str | None = None,
    session_id: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv of a long-lived, SDK-style session process (PROTOCOLS.md §0, §4).

    No ``-p``: stdin being a pipe is enough. ``resume`` continues a saved
    session; ``session_id`` fixes the id of a new one; the two exclude each
    other. ``extra`` is appended as is (``--mcp-config``, ``--add-dir``, …).
    """
    if resume is not None and session_id is not None:
        raise ValueError("pass either resume or session_id, not both")
    if isinstance(extra, str):
        raise TypeError("extra must be a sequence of arguments, not one string")
    argv = [binary, *_BASE_FLAGS]
    if permission_mode is not None:
        argv += ["--permission-mode", permission_mode]
    if model is not None:
        argv += ["--model", model]
    if resume is not None:
        argv += ["--resume", resume]
    if session_id is not None:
        argv += ["--session-id", session_id]
    argv.extend(extra)
    return argv


def encode_answer(cli_request_id: str, data: Mapping[str, Any], decision: str, message: str | None) -> bytes:
    """The answer to a permission prompt, for a domain decision (allow, allow_session, deny, cancel)."""
    if decision in ("allow", "allow_session"):
        return encode_permission_allow(cli_request_id, data.get("input") or {})
    default = "Cancelled by the user." if decision == "cancel" else "Denied by the user."
    return encode_permission_deny(cli_request_id, message or default)
