"""Host → Codex app-server side of the protocol (PROTOCOLS.md §2.3-§2.5). Sans-IO.

Theory of operation
-------------------
The app-server reads one JSON-RPC message per line on stdin. This module does
no I/O and keeps no session state:

* ``encode_*`` turn a request, a notification or an answer into one stdin line.
* ``*_params`` build the params of the requests a session sends
  (``initialize``, ``thread/start``, ``thread/resume``, ``turn/start``,
  ``turn/interrupt``).
* `approval_result` turns a t3d decision (allow, allow_session, deny, cancel)
  into the answer each kind of Codex approval request takes.
* `RUNTIME_MODES` maps t3d's runtime modes onto Codex's approval policy and
  sandbox; `build_argv` gives the spawn line.

Rules
-----
* **Local errors.** Every encoder serialises with orjson, so its output is one
  line of valid JSON or an exception at the call site. The host sends
  ``"jsonrpc":"2.0"``, which the server accepts (§2.2).
* **Decisions.** ``allow`` → ``accept``; ``allow_session`` → ``acceptForSession``
  (``accept`` when Codex did not offer it); ``deny`` → ``decline`` (the turn goes
  on without the action); ``cancel`` → ``cancel`` (Codex also interrupts the turn).
  The legacy v1 requests get their own spellings (``approved``,
  ``approved_for_session``, ``denied``, ``abort``); a permissions request is
  granted what it asked for (for the turn, or the session) or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from t3d.providers.codex.events import ApprovalRequested, JsonObject, RequestId

# Unknown method / cannot serve: the JSON-RPC "method not found" code.
METHOD_NOT_FOUND = -32601

# t3d runtime mode -> (approvalPolicy, sandbox). approval-required asks before every
# command that is not known to be safe and every patch; auto-accept-edits lets the agent
# edit and run commands inside the workspace sandbox and asks only to go beyond it;
# full-access never asks and runs without a sandbox.
RUNTIME_MODES: Mapping[str, tuple[str, str]] = {
    "approval-required": ("untrusted", "workspace-write"),
    "auto-accept-edits": ("on-request", "workspace-write"),
    "full-access": ("never", "danger-full-access"),
}
DEFAULT_RUNTIME_MODE = "approval-required"

# -- lines --------------------------------------------------------------------------------


def _line(obj: JsonObject) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def encode_request(request_id: int, method: str, params: JsonObject) -> bytes:
    return _line({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


def encode_notification(method: str, params: JsonObject | None = None) -> bytes:
    message: JsonObject = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return _line(message)


def encode_result(request_id: RequestId, result: Any) -> bytes:
    """The answer to a server→client request."""
    return _line({"jsonrpc": "2.0", "id": request_id, "result": result})


def encode_error(request_id: RequestId, message: str, code: int = METHOD_NOT_FOUND) -> bytes:
    """Refuse a server→client request the host cannot serve, so Codex never waits on it."""
    return _line({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})


# -- request params ---------------------------------------------------------------------------


def initialize_params(name: str, version: str) -> JsonObject:
    """``initialize``: who the client is (Codex builds its user agent from it)."""
    return {"clientInfo": {"name": name, "title": name, "version": version}}


def _policy(runtime_mode: str | None) -> tuple[str, str]:
    return RUNTIME_MODES.get(
        runtime_mode or DEFAULT_RUNTIME_MODE, RUNTIME_MODES[DEFAULT_RUNTIME_MODE]
    )


def thread_start_params(cwd: str, runtime_mode: str | None, model: str | None) -> JsonObject:
    """``thread/start`` in ``cwd`` with the runtime mode's approval policy and sandbox."""
    approval, sandbox = _policy(runtime_mode)
    params: JsonObject = {"cwd": cwd, "approvalPolicy": approval, "sandbox": sandbox}
    if model is not None:
        params["model"] = model
    return params


def thread_resume_params(
    thread_id: str, cwd: str, runtime_mode: str | None, model: str | None
) -> JsonObject:
    """``thread/resume`` of a saved thread (its rollout file), with the current settings."""
    return {"threadId": thread_id, **thread_start_params(cwd, runtime_mode, model)}


def turn_start_params(thread_id: str, text: str) -> JsonObject:
    return {"threadId": thread_id, "input": [{"type": "text", "text": text, "text_elements": []}]}


def turn_interrupt_params(thread_id: str, turn_id: str) -> JsonObject:
    return {"threadId": thread_id, "turnId": turn_id}


def turn_steer_params(thread_id: str, turn_id: str, text: str) -> JsonObject:
    """``turn/steer``: more input for the running turn ``turn_id`` (Codex refuses it when
    another turn, or none, is running: ``expectedTurnId`` is its precondition)."""
    return {
        "threadId": thread_id,
        "expectedTurnId": turn_id,
        "input": [{"type": "text", "text": text, "text_elements": []}],
    }


# -- approvals ----------------------------------------------------------------------------------

_DECISIONS: Mapping[str, str] = {
    "allow": "accept",
    "allow_session": "acceptForSession",
    "deny": "decline",
    "cancel": "cancel",
}
_LEGACY_DECISIONS: Mapping[str, str] = {
    "allow": "approved",
    "allow_session": "approved_for_session",
    "deny": "denied",
    "cancel": "abort",
}


def approval_result(
    request: ApprovalRequested, decision: str, message: str | None = None
) -> JsonObject:
    """The ``result`` that answers ``request`` with a t3d ``decision``."""
    if request.kind == "permissions":
        if decision in ("allow", "allow_session"):
            granted = request.params.get("permissions")
            return {
                "permissions": granted if isinstance(granted, dict) else {},
                "scope": "session" if decision == "allow_session" else "turn",
            }
        return {"permissions": {}}
    if request.legacy:
        legacy = _LEGACY_DECISIONS.get(decision, "denied")
        if legacy == "denied":
            return {"decision": {"denied": {"rejection": message or "Denied by the user."}}}
        return {"decision": legacy}
    wanted = _DECISIONS.get(decision, "decline")
    if (
        wanted == "acceptForSession"
        and request.available is not None
        and wanted not in request.available
    ):
        wanted = "accept"
    return {"decision": wanted}


# -- spawning -----------------------------------------------------------------------------------


def build_argv(
    binary: str, *, overrides: Sequence[str] = (), extra: Sequence[str] = ()
) -> list[str]:
    """``codex app-server`` on stdio, with ``-c key=value`` config ``overrides`` (TOML values)."""
    if isinstance(overrides, str) or isinstance(extra, str):
        raise TypeError("overrides and extra must be sequences of arguments, not one string")
    argv = [binary, "app-server"]
    for override in overrides:
        argv += ["-c", override]
    argv.extend(extra)
    return argv
