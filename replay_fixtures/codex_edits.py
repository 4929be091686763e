"""``--apply-edits`` for the fake ``codex``: recorded patches change the fake's real files.

Job: when the replay plays the ``item/completed`` of a ``fileChange`` item with status
``completed``, apply its changes to the files in the fake's working directory, so
checkpoints, diffs and the benchmark see real changes.

Rules:
- A change's ``kind`` is ``add`` (``diff`` is the new file's content), ``delete`` or
  ``update`` (``diff`` is a unified diff; ``move_path`` renames the file).
- Paths are taken relative to the cwd (an absolute path must lie under it); a path
  leaving the cwd is skipped.
- A hunk whose old lines are not in the file changes nothing in that file, as the real
  patch would fail; a declined or failed item changes nothing.
- A file error is reported on stderr and the replay goes on.
Standard library only.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


class CodexEditApplier:
    def __init__(self, cwd: str | None = None) -> None:
        self._cwd = os.path.realpath(cwd or os.getcwd())
        self.applied = 0

    def see(self, obj: dict[str, Any]) -> None:
        """Look at one played stdout line."""
        if obj.get("method") != "item/completed":
            return
        params = obj.get("params")
        item = params.get("item") if isinstance(params, dict) else None
        if not isinstance(item, dict) or item.get("type") != "fileChange":
            return
        if item.get("status") != "completed" or not isinstance(item.get("changes"), list):
            return
        for change in item["changes"]:
            if isinstance(change, dict):
                try:
                    self._apply(change)
                except (OSError, ValueError) as error:
                    sys.stderr.write(f"fake codex: could not apply a recorded change: {error}\n")

    def _path(self, path: Any) -> str | None:
        if not isinstance(path, str) or not path:
            return None
        full = os.path.realpath(os.path.join(self._cwd, path))
        return full if full.startswith(self._cwd + os.sep) else None

    def _apply(self, change: dict[str, Any]) -> None:
        path = self._path(change.get("path"))
        kind = change.get("kind")
        kind_name = kind.get("type") if isinstance(kind, dict) else kind
        diff = change.get("diff") if isinstance(change.get("diff"), str) else ""
        if path is None:
            return
        if kind_name == "add":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(diff)
        elif kind_name == "delete":
            if os.path.exists(path):
                os.remove(path)
        elif kind_name == "update":
            with open(path, encoding="utf-8") as handle:
                old = handle.read()
            new = apply_unified_diff(old, diff)
            if new is None:
                return
            target = path
            move = kind.get("move_path") if isinstance(kind, dict) else None
            if isinstance(move, str) and move:
                target = self._path(move) or path
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(new)
            if target != path:
                os.remove(path)
        else:
            return
        self.applied += 1


def apply_unified_diff(text: str, diff: str) -> str | None:
    """``text`` with the hunks of ``diff`` applied; None if a hunk's old lines do not match."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    at = 0  # index in ``lines`` of the next line not yet copied
    hunk: list[str] = []
    hunks: list[tuple[int, list[str]]] = []
    for raw in diff.splitlines(keepends=True):
        match = HUNK.match(raw)
        if match:
            hunk = []
            hunks.append((int(match.group(1)), hunk))
        elif hunks and raw[:1] in (" ", "-", "+"):
            hunk.append(raw)
    for start, body in hunks:
        begin = max(start - 1, 0)
        old = [line[1:] for line in body if line[0] in (" ", "-")]
        if [line.rstrip("\r\n") for line in lines[begin : begin + len(old)]] != [
            line.rstrip("\r\n") for line in old
        ]:
            return None
        out.extend(lines[at:begin])
        out.extend(_ensure_newline(line[1:]) for line in body if line[0] in (" ", "+"))
        at = begin + len(old)
    out.extend(lines[at:])
    return "".join(out)


def _ensure_newline(line: str) -> str:
    return line if line.endswith("\n") else line + "\n"
