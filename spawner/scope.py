"""Transient systemd scopes for long-lived children (providers), where systemd really works.

A provider started with ``scope`` runs as
``systemd-run --user --scope --slice=t3d-agents.slice --unit=<scope> -- argv``:
systemd-run registers its own pid in a new scope and then execs the provider,
so the pid (and its process group) stay the ones the spawner started, while
the kernel accounts the agent's memory in the scope (``memory.current``) and
its pressure in the slice (``memory.pressure``).

Used only when it works: `systemd-run` on the PATH, a cgroup v2 mount, a user
bus, and one trial scope that exits 0. The answer is found once per spawner
(the trial is the only extra process) and kept.
"""

from __future__ import annotations

import os
import subprocess
import threading

AGENTS_SLICE = "t3d-agents.slice"
TRIAL_TIMEOUT_S = 5.0
_UNIT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.-")

_lock = threading.Lock()
_works: bool | None = None


def valid_unit(name: str) -> bool:
    return 0 < len(name) <= 200 and set(name) <= _UNIT_CHARS


def _which(name: str) -> str | None:
    # Not shutil.which: the spawner keeps its imports (and its RSS) small.
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def scopes_work() -> bool:
    """Whether transient user scopes can be created here (found once, then kept)."""
    global _works
    with _lock:
        if _works is None:
            _works = _try_scope()
        return _works


def _try_scope() -> bool:
    runner = _which("systemd-run")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runner is None or not runtime or not os.path.exists(os.path.join(runtime, "bus")):
        return False
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # no cgroup v2
        return False
    try:
        trial = subprocess.run(
            _in_scope(runner, ["true"], unit=None),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=TRIAL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return trial.returncode == 0


def scoped_argv(argv: list[str], unit: str) -> list[str]:
    """``argv`` wrapped to run in the transient scope ``unit`` (without ``.scope``)."""
    return _in_scope(_which("systemd-run") or "systemd-run", argv, unit=unit)


def _in_scope(runner: str, argv: list[str], *, unit: str | None) -> list[str]:
    named = [f"--unit={unit}"] if unit is not None else []
    return [runner, "--user", "--scope", "--quiet", "--collect", f"--slice={AGENTS_SLICE}", *named, "--", *argv]
