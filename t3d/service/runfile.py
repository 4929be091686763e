"""``<state>/daemon.json``: where the daemon of a state dir serves, for clients to find it.

The daemon writes it once its API serves and removes it on a clean exit, so a file that
is left names a daemon that died (``kill -9``, a crash, power loss). Its fields: ``pid``,
``url``, ``host``, ``port``, ``version``, ``started_at`` (ISO 8601, UTC) and ``token``
(the token file's path).

Rules:
- `encode` and `decode` are pure; `decode` refuses anything that is not the shape above,
  naming what is wrong.
- The file is mode 0600 from its first byte (``mkstemp``) and appears under its name
  atomically (``os.replace``): a reader sees the old file, the new one or none.
- Only the daemon that holds the state dir's lock writes or removes it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import orjson

NAME = "daemon.json"
MAX_BYTES = 64 * 1024  # a bigger file is not ours


class RunFileError(ValueError):
    """daemon.json exists but cannot be read or is not what the daemon writes."""


@attrs.frozen
class RunFile:
    pid: int
    url: str
    host: str
    port: int
    version: str
    started_at: str
    token: str


def started_at_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def encode(run: RunFile) -> bytes:
    return orjson.dumps(attrs.asdict(run), option=orjson.OPT_INDENT_2) + b"\n"


def decode(raw: bytes) -> RunFile:
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RunFileError(f"it is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise RunFileError("it is not a JSON object")
    kinds = {f.name: int if f.name in ("pid", "port") else str for f in attrs.fields(RunFile)}
    wrong = [
        name
        for name, kind in kinds.items()
        if not isinstance(value.get(name), kind) or isinstance(value.get(name), bool)
    ]
    if wrong:
        raise RunFileError(f"it lacks or has a wrong value for {', '.join(wrong)}")
    if value["pid"] <= 0 or not 0 <= value["port"] <= 65535:
        raise RunFileError("its pid or port is out of range")
    return RunFile(**{name: value[name] for name in kinds})


def path_in(state_dir: Path) -> Path:
    return state_dir / NAME


def write_runfile(state_dir: Path, run: RunFile) -> Path:
    """Write ``<state_dir>/daemon.json`` atomically, mode 0600. Raises OSError."""
    path = path_in(state_dir)
    fd, temp_name = tempfile.mkstemp(dir=state_dir, prefix=".daemon.json-")
    try:
        with os.fdopen(fd, "wb") as temp:
            temp.write(encode(run))
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    return path


def remove_runfile(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path_in(state_dir).unlink()


def read_runfile(state_dir: Path) -> RunFile | None:
    """The daemon.json of ``state_dir``; None when there is none. Raises RunFileError."""
    path = path_in(state_dir)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunFileError(f"it cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise RunFileError(f"it is over {MAX_BYTES} bytes")
    return decode(raw)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except PermissionError:
        return True


def systemd_unit_of(pid: int) -> str | None:
    """The systemd unit ``pid`` runs in (from its cgroup path), if it is a ``.service``."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        last = line.rsplit("/", 1)[-1]
        if last.endswith(".service"):
            return last
    return None
