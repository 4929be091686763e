"""The systemd user units of t3d, from one place. Pure.

`render_units(spec)` gives the three unit files: ``t3d.service`` (the daemon, ``Type=notify``
with a watchdog), and ``t3d-spawner.socket`` + ``t3d-spawner.service`` (the spawner,
socket-activated, in a unit and cgroup of its own, so that stopping or restarting
``t3d.service`` never reaches the agents). `DEFAULT_SPEC` is what the repository's
``systemd/`` directory holds (entry points in ``~/.local/bin``, as pipx and
``pip install --user`` put them); ``t3d service install`` renders them with the absolute
paths of the installation that runs it.

A `UnitSpec` holds words as they go into a unit file: `for_paths` escapes real paths
(``%`` and ``$`` are special to systemd), while `DEFAULT_SPEC` uses specifiers (``%h`` is
the home directory, ``%S`` ``$XDG_STATE_HOME`` or ``~/.local/state``).
"""

from __future__ import annotations

import re

import attrs

DAEMON_UNIT = "t3d.service"
SPAWNER_SOCKET = "t3d-spawner.socket"
SPAWNER_UNIT = "t3d-spawner.service"
# In the order they are enabled and started.
UNIT_NAMES = (SPAWNER_SOCKET, SPAWNER_UNIT, DAEMON_UNIT)
WATCHDOG_S = 30


@attrs.frozen
class UnitSpec:
    daemon: tuple[str, ...]  # the command that is `t3d` (before `serve`)
    spawner: tuple[str, ...]  # the command that is `t3d-spawner`
    state_dir: str
    env_file: str | None = None

    @classmethod
    def for_paths(
        cls, daemon: list[str], spawner: list[str], state_dir: str, env_file: str | None = None
    ) -> UnitSpec:
        return cls(
            tuple(map(quote, daemon)),
            tuple(map(quote, spawner)),
            escape(state_dir),
            None if env_file is None else escape(env_file),
        )


DEFAULT_SPEC = UnitSpec(("%h/.local/bin/t3d",), ("%h/.local/bin/t3d-spawner",), "%S/t3d")


def escape(value: str) -> str:
    """``value`` with systemd's specifier and variable characters made literal."""
    return value.replace("%", "%%").replace("$", "$$")


def quote(word: str) -> str:
    """One literal command-line word for ``ExecStart=``."""
    return _quoted(escape(word))


def _quoted(escaped: str) -> str:
    """An already escaped word, in double quotes when it holds a space or a quote."""
    if re.search(r'[\s"\'\\;]', escaped) or not escaped:
        return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped


HEADER = """\
# Written by `t3d service install` (t3d/service/units.py); the copy in the repository's
# systemd/ directory runs t3d from ~/.local/bin (pipx or `pip install --user`).
"""


def render_units(spec: UnitSpec) -> dict[str, str]:
    """File name -> content of every unit, for ``spec``."""
    socket_path = f"{spec.state_dir}/spawner.sock"
    daemon = " ".join((*spec.daemon, "serve", "--state-dir", _quoted(spec.state_dir)))
    spawner = " ".join((*spec.spawner, "--socket", _quoted(socket_path)))
    env_file = f"EnvironmentFile={spec.env_file}\n" if spec.env_file else ""
    return {
        SPAWNER_SOCKET: f"""{HEADER}# The spawner's socket: systemd starts t3d-spawner.service on the first connection.
# Its path is <t3d state dir>/spawner.sock.
[Unit]
Description=t3d spawner socket

[Socket]
ListenStream={socket_path}
SocketMode=0600
DirectoryMode=0700

[Install]
WantedBy=sockets.target
""",
        SPAWNER_UNIT: f"""{HEADER}# The spawner starts every git, forge and agent process for the daemon. It runs in a unit
# of its own, so restarting t3d.service leaves it and the agents running; stopping it
# stops the agents.
[Unit]
Description=t3d spawner (starts processes for the t3d daemon)
Requires={SPAWNER_SOCKET}
After={SPAWNER_SOCKET}

[Service]
ExecStart={spawner}
# Fewer malloc arenas keep the sidecar's resident memory small.
Environment=MALLOC_ARENA_MAX=2
Restart=on-failure
RestartSec=1
""",
        DAEMON_UNIT: f"""{HEADER}# The daemon. It tells systemd when it serves (Type=notify) and sends a watchdog ping
# from its event loop, so a stuck loop is restarted. Its agents run under
# t3d-spawner.service and keep running across a restart of this unit.
[Unit]
Description=t3d: runs and supervises coding-agent sessions
Wants={SPAWNER_SOCKET}
After={SPAWNER_SOCKET}
# A daemon that keeps failing is given up after 5 starts in 5 minutes.
StartLimitIntervalSec=300
StartLimitBurst=5

[Service]
Type=notify
NotifyAccess=main
ExecStart={daemon}
{env_file}Restart=on-failure
RestartSec=2
# Exit status 2 is a bad setting: restarting cannot fix it.
RestartPreventExitStatus=2
WatchdogSec={WATCHDOG_S}
TimeoutStartSec=120
TimeoutStopSec=30
# SIGTERM to the daemon alone; it leaves the agents (in the spawner's unit) running.
KillMode=mixed

[Install]
WantedBy=default.target
""",
    }


def state_dir_of(daemon_unit: str) -> str | None:
    """The ``--state-dir`` of a rendered ``t3d.service`` (specifiers left as they are)."""
    for line in daemon_unit.splitlines():
        if line.startswith("ExecStart="):
            match = re.search(r'--state-dir (?:"((?:[^"\\]|\\.)*)"|(\S+))', line)
            if match:
                raw = match.group(1) if match.group(1) is not None else match.group(2)
                raw = re.sub(r"\\(.)", r"\1", raw) if match.group(1) is not None else raw
                return raw.replace("$$", "$").replace("%%", "%")
    return None
