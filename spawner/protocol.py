"""Spawner wire format: length-prefixed JSON frames. Pure: no sockets, no threads.

Theory of operation. Both directions carry frames: a 4-byte big-endian length,
then that many bytes of one UTF-8 JSON object. Requests carry an integer
``id`` and an ``op``; the reply to a request carries the same ``id`` and
``ok``. Replies may come in any order (several requests are in flight at
once). Unsolicited frames carry ``event`` instead of ``id`` (child exits).
Operations: ``run``, ``spawn``, ``attach``, ``ack``, ``close_stdin``, ``signal``,
``adopt``, ``stats``, ``ping`` (`spawner.agents` says what the agent ones do).
Binary fields (stdin, stdout, stderr) travel base64-encoded in ``*_b64``.

File descriptors travel beside frames with SCM_RIGHTS: a frame that carries
``"fds": n`` was sent in the same ``sendmsg`` as its ``n`` descriptors, so the
receiver has them no later than the frame's first byte. The receiver keeps
descriptors in arrival order and hands the first ``n`` to that frame.

Rules:
- A frame is at most `MAX_FRAME` bytes; a longer length prefix is a
  `FrameError` and the connection is beyond repair (the peer is closed).
- A frame that is not a JSON object is a `FrameError` for that frame only:
  the length prefix kept the stream in step, so the next frame still parses.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

MAX_FRAME = 32 * 1024 * 1024
_HEADER = struct.Struct(">I")
SIGNALS = ("TERM", "KILL", "INT", "HUP")
POOLS = ("git", "forge", "other")


class FrameError(ValueError):
    """A peer sent bytes that are not a frame; ``fatal`` when the stream lost its framing."""

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


def encode_frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Bytes in, JSON objects out. ``feed`` then iterate ``frames()``."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def next_frame(self) -> dict[str, Any] | None:
        """The next complete frame, None if more bytes are needed; raises FrameError."""
        if len(self._buffer) < _HEADER.size:
            return None
        (length,) = _HEADER.unpack_from(self._buffer)
        if length > MAX_FRAME:
            raise FrameError(f"frame length {length} is over the {MAX_FRAME}-byte limit", fatal=True)
        end = _HEADER.size + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[_HEADER.size : end])
        del self._buffer[:end]
        try:
            message = json.loads(body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise FrameError(f"frame is not JSON: {exc}") from None
        if not isinstance(message, dict):
            raise FrameError(f"frame is a JSON {type(message).__name__}, not an object")
        return message


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise FrameError(f"{field} is not base64") from None


# -- request validation (used by the spawner; names every bad field) ------------------------


_MISSING: Any = object()


def _field(message: dict[str, Any], name: str, kind: tuple[type, ...], default: Any = _MISSING) -> Any:
    value = message.get(name, default)
    if value is _MISSING:
        raise FrameError(f"{name!r} is missing")
    if isinstance(value, bool) or not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in kind)
        raise FrameError(f"{name!r} must be {names}, not {type(value).__name__}")
    return value


def check_argv(message: dict[str, Any]) -> list[str]:
    argv = _field(message, "argv", (list,))
    if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise FrameError("'argv' must be a non-empty list of strings without NUL bytes")
    return list(argv)


def check_env(message: dict[str, Any]) -> dict[str, str] | None:
    env = message.get("env")
    if env is None:
        return None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
        for k, v in env.items()
    ):
        raise FrameError("'env' must be an object of string names (no '=') to string values")
    return env


def check_cwd(message: dict[str, Any]) -> str | None:
    cwd = message.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise FrameError("'cwd' must be an absolute path")
    return cwd


def check_number(message: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = _field(message, name, (int, float), default)
    if not low <= value <= high:
        raise FrameError(f"{name!r}={value} is out of range; use {low:g} to {high:g}")
    return float(value)


MAX_META = 4096


def check_meta(message: dict[str, Any]) -> dict[str, Any]:
    """The daemon's opaque ``meta`` object (at most `MAX_META` bytes as JSON)."""
    meta = message.get("meta")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise FrameError("'meta' must be an object")
    if len(json.dumps(meta, separators=(",", ":"))) > MAX_META:
        raise FrameError(f"'meta' is over {MAX_META} bytes as JSON; keep it to a few ids")
    return meta


def check_choice(message: dict[str, Any], name: str, allowed: tuple[str, ...], default: str | None = None) -> str:
    value = _field(message, name, (str,), _MISSING if default is None else default)
    if value not in allowed:
        raise FrameError(f"{name!r}={value!r} is not one of {', '.join(allowed)}")
    return str(value)
