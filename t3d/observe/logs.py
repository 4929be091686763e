"""How `t3d serve` logs: to stderr, one record a line, as text or as JSON (``--log-format``).

Text: ``2026-01-01 12:00:00,000 INFO t3d.turns: thread … turn 1 (…) completed after 3.2 s on replay``.
JSON: one object per line with ``time`` (UTC, ISO 8601, milliseconds), ``level``,
``logger`` and ``message``, then the record's structured fields (what the code passed
as ``extra``: turn and agent lines carry ``event``, ``thread_id``, ``provider``...; the
stall record its figures) and ``exception`` (the traceback) when there is one.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {"message", "asctime", "taskName"}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a record was given (``extra=``), in the order given."""
    return {key: value for key, value in vars(record).items() if key not in _STANDARD and not key.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside values are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return orjson.dumps(out, default=repr, option=orjson.OPT_NON_STR_KEYS).decode()


def configure_logging(level: str, log_format: str = "text") -> None:
    """Send every record at ``level`` and above to stderr, formatted as ``log_format``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
