"""One-line logs to stderr (journald-friendly), without the `logging` package's memory."""

from __future__ import annotations

import sys

LEVELS = ("debug", "info", "warning", "error")
_threshold = 1


def set_level(name: str) -> None:
    global _threshold
    _threshold = LEVELS.index(name)


def _write(level: int, message: str, args: tuple[object, ...]) -> None:
    if level >= _threshold:
        sys.stderr.write(f"t3d-spawner {LEVELS[level].upper()} {message % args if args else message}\n")
        sys.stderr.flush()


def info(message: str, *args: object) -> None:
    _write(1, message, args)


def warning(message: str, *args: object) -> None:
    _write(2, message, args)


def error(message: str, *args: object) -> None:
    _write(3, message, args)
