"""``systemctl --user`` and friends, for ``t3d service``: run them, and read what they say.

`parse_show` is pure. `user_manager_problem` says why systemd's user manager cannot be
used here (no ``systemctl``, or ``systemctl --user`` cannot reach a manager), or None.
Every command has a deadline; none runs through a shell.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

SHOW_PROPERTIES = (
    "Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "MainPID", "NRestarts",
    "StatusText", "ActiveEnterTimestamp",
)  # fmt: skip
QUICK_TIMEOUT_S = 20.0
# `enable --now` of a Type=notify unit waits for READY=1 (TimeoutStartSec=120 in the unit).
START_TIMEOUT_S = 150.0


def user_manager_problem() -> str | None:
    """Why ``systemctl --user`` cannot be used here, or None when it can."""
    if shutil.which("systemctl") is None:
        return "systemd is not available here (no systemctl on PATH)"
    try:
        done = subprocess.run(
            ["systemctl", "--user", "show-environment"],
            capture_output=True,
            text=True,
            timeout=QUICK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"`systemctl --user` did not answer within {QUICK_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"systemctl cannot run ({exc.strerror})"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        return (
            f"`systemctl --user` cannot reach a systemd user manager ({why}); log in to a "
            "session that has one, or enable lingering as root with `loginctl enable-linger USER`"
        )
    return None


def systemctl(args: Sequence[str], *, timeout: float = QUICK_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``systemctl --user ARGS``; a timeout is reported as exit status 124."""
    argv = ["systemctl", "--user", *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"no answer within {timeout:g} s")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"cannot run systemctl ({exc.strerror})")


def show(units: Sequence[str]) -> dict[str, dict[str, str]]:
    """Unit name -> its `SHOW_PROPERTIES` (empty when systemctl failed)."""
    done = systemctl(["show", "--property=" + ",".join(SHOW_PROPERTIES), *units])
    return parse_show(done.stdout) if done.returncode == 0 else {}


def parse_show(text: str) -> dict[str, dict[str, str]]:
    """``systemctl show`` output (blocks of KEY=VALUE lines, one per unit) by unit Id. Pure."""
    units: dict[str, dict[str, str]] = {}
    for block in text.split("\n\n"):
        props = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key] = value
        if "Id" in props:
            units[props["Id"]] = props
    return units


def linger_enabled(user: str) -> bool | None:
    """Whether ``user``'s manager runs without a login session; None when unknown."""
    if shutil.which("loginctl") is None:
        return None
    try:
        done = subprocess.run(
            ["loginctl", "show-user", user, "--property=Linger", "--value"],
            capture_output=True,
            text=True,
            timeout=QUICK_TIMEOUT_S,
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    value = done.stdout.strip()
    return {"yes": True, "no": False}.get(value) if done.returncode == 0 else None
