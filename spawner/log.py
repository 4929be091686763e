"""One-line logs to stderr (journald-friendly), without the `logging` package's memory.

``T3D_LOG_FORMAT=json`` (the daemon passes its ``--log-format`` on) writes each line as
one JSON object with ``time``, ``level``, ``logger`` (``t3d.spawner``) and ``message``,
as the daemon's own JSON lines are.
"""

from __future__ import annotations

import json
import os
import sys
import time

LEVELS = ("debug", "info", "warning", "error")
_threshold = 1
_json = os.environ.get("T3D_LOG_FORMAT", "").lower() == "json"


def set_level(name: str) -> None:
    global _threshold
    _threshold = LEVELS.index(name)


def _write(level: int, message: str, args: tuple[object, ...]) -> None:
    if level >= _threshold:
        text = message % args if args else message
        if _json:
            now = time.time()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
            line = json.dumps({"time": stamp, "level": LEVELS[level], "logger": "t3d.spawner", "message": text})
        else:
            line = f"t3d-spawner {LEVELS[level].upper()} {text}"
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # stderr went away with the daemon that started us: the agents matter more


def info(message: str, *args: object) -> None:
    _write(1, message, args)


def warning(message: str, *args: object) -> None:
    _write(2, message, args)


def error(message: str, *args: object) -> None:
    _write(3, message, args)
