"""``--apply-edits``: recorded Write, Edit and MultiEdit calls change the fake's real files.

Job: when the replay plays the tool result of a recorded Write, Edit or MultiEdit call
(the ``user`` line whose ``tool_result`` answers that ``tool_use``), apply the call's
input to the files in the fake's working directory, so checkpoints, diffs and the
benchmark see real changes.

Rules:
- Paths under the recording's own cwd (its init line's ``cwd``, already rewritten to the
  fake's cwd) map to the fake's cwd; any other path, or one leaving the cwd, is skipped.
- A tool result marked ``is_error`` (the call was denied or failed) changes nothing.
- Edit replaces ``old_string`` (every occurrence with ``replace_all``, else the first);
  an ``old_string`` that is not in the file changes nothing, as the real tool would fail.
  Write creates the file (and its directories) or replaces it.
- A file error is reported on stderr and the replay goes on.
- At most `MAX_CALLS` calls are remembered (the oldest forgotten first).
Standard library only.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from typing import Any

EDIT_TOOLS = frozenset({"Write", "Edit", "MultiEdit"})
MAX_CALLS = 256


class EditApplier:
    def __init__(self, cwd: str | None = None) -> None:
        self._cwd = os.path.realpath(cwd or os.getcwd())
        self._recorded_cwd = self._cwd
        self._calls: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()
        self.applied = 0

    def see(self, obj: dict[str, Any]) -> None:
        """Look at one played stdout line."""
        kind = obj.get("type")
        if kind == "system" and obj.get("subtype") == "init" and isinstance(obj.get("cwd"), str):
            self._recorded_cwd = obj["cwd"]
        elif kind == "assistant":
            for block in _content(obj):
                if block.get("type") == "tool_use" and block.get("name") in EDIT_TOOLS and isinstance(block.get("input"), dict):
                    self._calls[str(block.get("id"))] = (block["name"], block["input"])
                    while len(self._calls) > MAX_CALLS:
                        self._calls.popitem(last=False)
        elif kind == "user":
            for block in _content(obj):
                if block.get("type") != "tool_result" or block.get("is_error"):
                    continue
                call = self._calls.pop(str(block.get("tool_use_id")), None)
                if call is not None:
                    self._apply(*call)

    def _target(self, file_path: object) -> str | None:
        if not isinstance(file_path, str):
            return None
        recorded = self._recorded_cwd.rstrip("/") + "/"
        if not file_path.startswith(recorded):
            return None
        path = os.path.normpath(os.path.join(self._cwd, file_path[len(recorded) :]))
        return path if path.startswith(self._cwd + os.sep) else None

    def _apply(self, name: str, tool_input: dict[str, Any]) -> None:
        path = self._target(tool_input.get("file_path"))
        if path is None:
            return
        try:
            if name == "Write":
                os.makedirs(os.path.dirname(path), exist_ok=True)
                _write(path, str(tool_input.get("content", "")))
            else:
                edits = tool_input.get("edits") if name == "MultiEdit" else [tool_input]
                text = _read(path)
                for edit in edits if isinstance(edits, list) else []:
                    text = _edit(text, edit)
                if text is None:
                    return
                _write(path, text)
            self.applied += 1
        except OSError as error:
            sys.stderr.write(f"fake claude: could not apply {name} to {path}: {error}\n")


def _content(obj: dict[str, Any]) -> list[dict[str, Any]]:
    message = obj.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def _edit(text: str | None, edit: object) -> str | None:
    if not isinstance(edit, dict):
        return text
    old, new = edit.get("old_string"), edit.get("new_string")
    if not isinstance(old, str) or not isinstance(new, str):
        return text
    if text is None:
        return new if old == "" else None  # Edit with an empty old_string creates the file
    if old not in text:
        return text
    return text.replace(old, new) if edit.get("replace_all") else text.replace(old, new, 1)
