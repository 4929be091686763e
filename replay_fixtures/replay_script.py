"""The replay script: a recording turned into the steps the player runs.

Job: compile the recording's lines into ``Step``s (emit a stdout line, or wait for the
host) and keep the recorded replies to host requests as templates (``Script``).

Rules:

* A host (``>>> ``) line becomes a wait: a user line is a turn boundary, a
  ``control_response`` the answer to the preceding ``can_use_tool`` prompt, an interrupt
  a bounded wait for the host's interrupt. Other host lines are dropped.
* A recorded ``control_response`` answers a *host* request: it is never a step, only a
  template (``initialize`` payload, interrupt reply). When the recording lacks the request
  (a ``.stdout.jsonl`` has no host lines), the payload tells which request it answers, and
  an interrupt reply also marks an interrupt wait.
* A script always has at least one turn boundary; its exit code is ``exit_code`` from the
  meta file, else 1 when the last recorded ``result`` is an error, else 0.
* Standard library only; no heavy imports.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from replay_fixtures.transcript import (
    JsonObject,
    Line,
    Rewriter,
    heal_split_tokens,
    read_exit_code,
    read_recording,
    recorded_session_id,
    run_stem,
)

# Step kinds of a replay script.
EMIT = "emit"
WAIT_USER = "wait_user"
WAIT_PERMISSION = "wait_permission"
WAIT_INTERRUPT = "wait_interrupt"


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
