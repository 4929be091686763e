"""A Codex app-server recording turned into the steps the fake ``codex`` plays.

Job: compile a recording's lines (``transcript.read_recording``) into ``Step``s: emit a
stdout line, or wait for the host. Keep what the player needs to answer the host beyond
the recording: the recorded thread and its ``thread/start`` result, the ``initialize``
result, and Codex's error messages.

Rules:

* A host (``>>> ``) line becomes a wait: ``initialize`` and ``thread/start`` wait for that
  request; ``turn/start`` is a turn boundary; ``turn/interrupt`` a bounded wait for the
  host's interrupt; a response (the host's answer to an approval) a wait for the answer to
  the server request just played. The ``initialized`` notification and other host lines
  are dropped.
* A recorded response to a host request is emitted where it was recorded, carrying the id
  the host really used for that request (``answers`` names the recorded id). A recorded
  server request (``request`` names its recorded id) gets the player's own id.
* Recorded ids are rewritten when played: the thread id to the host's thread, each turn's
  id to a fresh one (``Step.turn_id`` is the recorded id of the turn a boundary opens).
  Paths are rewritten at load: ``/workspace`` -> the cwd, ``/home/user/.codex`` ->
  ``$CODEX_HOME``, ``/home/user`` -> ``$HOME``.
* A recording without host lines (``…_error_paths.jsonl``) only gives templates: its
  ``initialize`` result and error messages.
* Standard library only; no heavy imports.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, NamedTuple

from replay_fixtures.transcript import JsonObject, Line, Rewriter, json_string_body, read_recording

EMIT = "emit"
WAIT_INITIALIZE = "wait_initialize"
WAIT_THREAD = "wait_thread"
WAIT_TURN = "wait_turn"
WAIT_INTERRUPT = "wait_interrupt"
WAIT_ANSWER = "wait_answer"

HOST_WAITS = {
    "initialize": WAIT_INITIALIZE,
    "thread/start": WAIT_THREAD,
    "thread/resume": WAIT_THREAD,
    "turn/start": WAIT_TURN,
    "turn/interrupt": WAIT_INTERRUPT,
}
RECORDED_HOME = "/home/user"
RECORDED_CODEX_HOME = "/home/user/.codex"
RECORDED_CWD = "/workspace"

NOT_INITIALIZED = "Not initialized"
ALREADY_INITIALIZED = "Already initialized"
NO_ROLLOUT = "no rollout found for thread id {}"
NO_ROLLOUT_RE = re.compile(r"no rollout found for thread id (\S+)")
DEFAULT_INITIALIZE_RESULT: JsonObject = {
    "userAgent": "codex/0.171.0",
    "codexHome": RECORDED_CODEX_HOME,
    "platformFamily": "unix",
    "platformOs": "linux",
}


class Step(NamedTuple):
    """One thing to do: emit a line, or wait for the host (at the recorded time)."""

    kind: str
    at_ms: float | None
    text: str
    obj: JsonObject
    answers: Any = None  # EMIT of a response: the recorded id of the host request it answers
    request: Any = None  # EMIT of a server request: its recorded id
    recorded_id: Any = None  # a wait for a host request: the id the recording host used
    turn_id: str | None = None  # WAIT_TURN: the recorded id of the turn it opens


class Script(NamedTuple):
    steps: list[Step]
    first_turn: int  # index of the first turn boundary (where a loop restarts)
    thread_id: str  # the recorded thread id ("" without one)
    thread_result: JsonObject  # the recorded thread/start result (a template)
    initialize_result: JsonObject
    errors: dict[str, str]  # Codex's error messages by case, from the recording
    exit_code: int


def _response_id(obj: JsonObject) -> Any:
    if "method" in obj or ("result" not in obj and "error" not in obj):
        return None
    return obj.get("id")


def _recorded_turn_ids(lines: list[Line]) -> dict[Any, str]:
    """Recorded host request id of each ``turn/start`` -> the turn id its response gave."""
    starts = {
        line.obj.get("id")
        for line in lines
        if line.host and line.obj.get("method") == "turn/start"
    }
    turns: dict[Any, str] = {}
    for line in lines:
        if line.host or _response_id(line.obj) not in starts:
            continue
        result = line.obj.get("result")
        turn = result.get("turn") if isinstance(result, dict) else None
        if isinstance(turn, dict) and isinstance(turn.get("id"), str):
            turns[line.obj["id"]] = turn["id"]
    return turns


def _error_templates(lines: list[Line]) -> dict[str, str]:
    errors = {
        "not_initialized": NOT_INITIALIZED,
        "already_initialized": ALREADY_INITIALIZED,
        "no_rollout": NO_ROLLOUT,
    }
    for line in lines:
        error = line.obj.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if line.host or not isinstance(message, str):
            continue
        if message == NOT_INITIALIZED:
            errors["not_initialized"] = message
        elif message == ALREADY_INITIALIZED:
            errors["already_initialized"] = message
        elif match := NO_ROLLOUT_RE.fullmatch(message):
            errors["no_rollout"] = message.replace(match.group(1), "{}")
    return errors


def build_script(lines: list[Line], rewrite: Rewriter, exit_code: int | None) -> Script:
    """Turn recording lines into steps and templates (see the module rules)."""
    turn_ids = _recorded_turn_ids(lines)
    host_methods = {
        line.obj.get("id"): line.obj.get("method")
        for line in lines
        if line.host and isinstance(line.obj.get("method"), str) and "id" in line.obj
    }
    steps: list[Step] = []
    thread_id = ""
    thread_result: JsonObject = {}
    initialize_result = DEFAULT_INITIALIZE_RESULT
    for line in lines:
        obj = line.obj
        if line.host:
            method = obj.get("method")
            kind = HOST_WAITS.get(method) if isinstance(method, str) else None
            if kind is not None and "id" in obj:
                turn = turn_ids.get(obj["id"]) if kind == WAIT_TURN else None
                steps.append(Step(kind, line.at_ms, "", obj, recorded_id=obj["id"], turn_id=turn))
            elif method is None and ("result" in obj or "error" in obj):
                steps.append(Step(WAIT_ANSWER, line.at_ms, "", obj, recorded_id=obj.get("id")))
            continue
        text = rewrite(line.text)
        played: JsonObject = json.loads(text)
        answered = _response_id(played)
        method = host_methods.get(answered) if answered is not None else None
        result = played.get("result")
        if method in ("thread/start", "thread/resume") and isinstance(result, dict):
            thread = result.get("thread")
            if isinstance(thread, dict) and isinstance(thread.get("id"), str):
                thread_id, thread_result = thread["id"], result
        elif isinstance(result, dict) and "codexHome" in result:
            initialize_result = result
        if answered is not None and answered not in host_methods:
            continue  # answers a host request the recording did not keep: a template only
        request = played.get("id") if "method" in played and "id" in played else None
        steps.append(Step(EMIT, line.at_ms, text, played, answers=answered, request=request))
    first_turn = next((i for i, step in enumerate(steps) if step.kind == WAIT_TURN), len(steps))
    return Script(
        steps,
        first_turn,
        thread_id,
        thread_result,
        initialize_result,
        _error_templates(lines),
        exit_code if exit_code is not None else 0,
    )


def rewriter(cwd: str, home: str, codex_home: str) -> Rewriter:
    """The path rewrites of a Codex recording for this environment."""
    return Rewriter(
        {
            RECORDED_CODEX_HOME: json_string_body(codex_home),
            RECORDED_CWD: json_string_body(cwd),
            RECORDED_HOME: json_string_body(home),
        }
    )


def load_script(path: str, exit_code: int | None) -> Script:
    home = (os.environ.get("HOME") or os.path.expanduser("~")).rstrip("/") or "/"
    codex_home = os.environ.get("CODEX_HOME") or os.path.join(home, ".codex")
    return build_script(read_recording(path), rewriter(os.getcwd(), home, codex_home), exit_code)
