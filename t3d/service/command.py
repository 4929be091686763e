"""`t3d service install|uninstall|status|logs`: t3d as systemd user units.

``install`` writes the units (`t3d.service.units`) with the absolute paths of the
installation that runs it into ``$XDG_CONFIG_HOME/systemd/user`` (default
``~/.config/systemd/user``), reloads the user manager and enables and starts the
spawner's socket and the daemon. ``uninstall`` disables, stops and removes them;
``status`` shows the units and the daemon's health; ``logs`` runs ``journalctl``.
Where systemd's user manager cannot be used, each says why and changes nothing.

Exit status: 0 done (status: the daemon is active and healthy); 1 systemd cannot be
used, a systemctl command failed, a daemon outside systemd holds the state dir, or
(status) the daemon is not active or not healthy; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from t3d.config import load_settings
from t3d.errors import ConfigError
from t3d.service import systemctl as sd
from t3d.service.runfile import systemd_unit_of
from t3d.service.statedir import holder_pid, lock_held, running_daemon
from t3d.service.units import (
    DAEMON_UNIT,
    SPAWNER_SOCKET,
    SPAWNER_UNIT,
    UNIT_NAMES,
    UnitSpec,
    render_units,
    state_dir_of,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
NOTHING_CHANGED = "nothing was changed"


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit status: 0 done; 1 systemd cannot be used here, a command failed, or (status) the "
        "daemon is not active and healthy; 2 bad arguments"
    )
    commands = parser.add_subparsers(dest="service_command", metavar="COMMAND", required=True)
    install = commands.add_parser(
        "install",
        help="write the user units, enable and start them",
        description="Write t3d.service, t3d-spawner.socket and t3d-spawner.service into "
        "$XDG_CONFIG_HOME/systemd/user with the paths of this installation, then "
        "`systemctl --user daemon-reload` and `enable --now`.",
    )
    install.add_argument("--state-dir", metavar="DIR", help="the daemon's state dir (default: as for `t3d serve`)")
    install.add_argument("--env-file", metavar="FILE", help="an EnvironmentFile= for the daemon (T3D_* settings, API keys)")
    install.add_argument("--dry-run", action="store_true", help="print the units and commands; change nothing")
    install.set_defaults(service_handler=_install)
    uninstall = commands.add_parser(
        "uninstall", help="disable, stop and remove the units (stops the agents)"
    )
    uninstall.add_argument("--dry-run", action="store_true", help="print what would be done; change nothing")
    uninstall.set_defaults(service_handler=_uninstall)
    status = commands.add_parser("status", help="the units' state and the daemon's health")
    status.set_defaults(service_handler=_status)
    logs = commands.add_parser("logs", help="the daemon's and the spawner's journal (journalctl --user)")
    logs.add_argument("-n", "--lines", type=int, default=50, help="lines of history first (default 50)")
    logs.add_argument("--no-follow", action="store_true", help="print and exit instead of following")
    logs.set_defaults(service_handler=_logs)


def run_service(args: argparse.Namespace) -> int:
    return int(args.service_handler(args))


def say(text: str) -> None:
    print(text, flush=True)


def complain(text: str) -> None:
    print(f"error: {text}", file=sys.stderr, flush=True)


def unit_dir(environ: dict[str, str] | os._Environ[str]) -> Path:
    """Where user units live: $XDG_CONFIG_HOME/systemd/user, else ~/.config/systemd/user."""
    config = environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else Path(environ.get("HOME") or os.path.expanduser("~")) / ".config"
    return base / "systemd" / "user"


def installed_commands() -> tuple[list[str], list[str]]:
    """The commands that are `t3d` and `t3d-spawner` in the installation running now: the
    entry points beside its interpreter, else the interpreter with ``-m``."""
    bindir = Path(os.path.abspath(sys.executable)).parent
    daemon, spawner = bindir / "t3d", bindir / "t3d-spawner"
    if os.access(daemon, os.X_OK) and os.access(spawner, os.X_OK):
        return [str(daemon)], [str(spawner)]
    return [os.path.abspath(sys.executable), "-m", "t3d"], [os.path.abspath(sys.executable), "-m", "spawner"]


def _state_dir(raw: str | None) -> Path:
    return load_settings({"state_dir": raw}, os.environ).state_dir


def _write_atomic(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _run(args: Sequence[str], *, timeout: float = sd.QUICK_TIMEOUT_S) -> bool:
    say("$ systemctl --user " + " ".join(args))
    done = sd.systemctl(args, timeout=timeout)
    if done.returncode != 0:
        complain(f"systemctl --user {' '.join(args)} failed (status {done.returncode}): {done.stderr.strip()}")
        return False
    return True


# --- install ---------------------------------------------------------------------------


def _install(args: argparse.Namespace) -> int:
    try:
        state_dir = _state_dir(args.state_dir)
    except ConfigError as exc:
        complain(str(exc))
        return EXIT_USAGE
    env_file = None
    if args.env_file is not None:
        env_path = Path(args.env_file).expanduser().absolute()
        if not env_path.is_file():
            complain(f"--env-file {args.env_file}: no such file; create it (one NAME=value per line) or leave the flag out")
            return EXIT_USAGE
        env_file = str(env_path)
    daemon, spawner = installed_commands()
    units = render_units(UnitSpec.for_paths(daemon, spawner, str(state_dir), env_file))
    where = unit_dir(os.environ)
    problem = sd.user_manager_problem()
    if args.dry_run:
        for name in UNIT_NAMES:
            say(f"--- would write {where / name}:\n{units[name]}")
        say("would run: systemctl --user daemon-reload")
        say(f"would run: systemctl --user enable --now {SPAWNER_SOCKET} {DAEMON_UNIT}")
        if problem:
            say(f"note: {problem}; an install here would change nothing")
        return EXIT_OK
    if problem:
        complain(f"{problem}; {NOTHING_CHANGED}. Run `t3d serve` under another supervisor instead")
        return EXIT_FAILED
    if lock_held(state_dir):
        pid = holder_pid(state_dir)
        if pid is None or systemd_unit_of(pid) != DAEMON_UNIT:
            complain(
                f"a t3d daemon (pid {pid or 'unknown'}) already runs on {state_dir} outside systemd; "
                f"stop it first (`t3d ctl shutdown --state-dir {state_dir}`), then install again; {NOTHING_CHANGED}"
            )
            return EXIT_FAILED
    was_active = sd.systemctl(["is-active", "--quiet", DAEMON_UNIT]).returncode == 0
    try:
        where.mkdir(parents=True, exist_ok=True)
        changed = _write_units(where, units)
    except OSError as exc:
        complain(f"cannot write the units into {where}: {exc}")
        return EXIT_FAILED
    if not _run(["daemon-reload"]) or not _run(["enable", "--now", SPAWNER_SOCKET, DAEMON_UNIT], timeout=sd.START_TIMEOUT_S):
        complain(
            f"the units are in {where}; fix the problem above (`t3d service logs` shows the daemon's log), "
            f"then run `systemctl --user enable --now {SPAWNER_SOCKET} {DAEMON_UNIT}`"
        )
        return EXIT_FAILED
    if changed and was_active:
        say(f"{DAEMON_UNIT} was already running: `systemctl --user restart {DAEMON_UNIT}` makes it use the new units")
    run, _ = running_daemon(state_dir)
    serving = f"serves on {run.url}" if run is not None else "is starting"
    say(f"t3d {serving} (state dir {state_dir}); `t3d service status` shows it, `t3d service logs` follows its log")
    _linger_hint()
    return EXIT_OK


def _write_units(where: Path, units: dict[str, str]) -> bool:
    changed = False
    for name in UNIT_NAMES:
        path = where / name
        try:
            same = path.read_text() == units[name]
        except FileNotFoundError:
            same = False
        if same:
            say(f"{path} is up to date")
        else:
            _write_atomic(path, units[name])
            say(f"wrote {path}")
            changed = True
    return changed


def _linger_hint() -> None:
    user = getpass.getuser()
    if sd.linger_enabled(user) is False:
        say(
            f"note: systemd stops your user units when you log out; to keep t3d running, "
            f"run `loginctl enable-linger {user}` (as root if it asks)"
        )


# --- uninstall -------------------------------------------------------------------------


def _uninstall(args: argparse.Namespace) -> int:
    where = unit_dir(os.environ)
    present = [name for name in UNIT_NAMES if (where / name).exists()]
    if not present:
        say(f"no t3d units in {where}; nothing to do")
        return EXIT_OK
    units = [DAEMON_UNIT, SPAWNER_SOCKET, SPAWNER_UNIT]
    if args.dry_run:
        say(f"would run: systemctl --user disable --now {' '.join(units)}")
        for name in present:
            say(f"would remove {where / name}")
        say("would run: systemctl --user daemon-reload")
        return EXIT_OK
    problem = sd.user_manager_problem()
    if problem:
        complain(f"{problem}; {NOTHING_CHANGED}")
        return EXIT_FAILED
    say(f"stopping {SPAWNER_UNIT} stops every agent it runs")
    if not _run(["disable", "--now", *units], timeout=sd.START_TIMEOUT_S):
        return EXIT_FAILED
    for name in present:
        (where / name).unlink(missing_ok=True)
        say(f"removed {where / name}")
    return EXIT_OK if _run(["daemon-reload"]) else EXIT_FAILED


# --- status and logs -------------------------------------------------------------------


def describe_unit(props: dict[str, str]) -> str:
    """One line for a unit from its ``systemctl show`` properties. Pure."""
    if props.get("LoadState") == "not-found":
        return f"{props.get('Id')}: not installed"
    words = [f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')})", props.get("UnitFileState") or "?"]
    if props.get("MainPID", "0") not in ("", "0"):
        words.append(f"main pid {props['MainPID']}")
    if props.get("NRestarts", "0") not in ("", "0"):
        words.append(f"{props['NRestarts']} restarts")
    if props.get("ActiveEnterTimestamp"):
        words.append(f"since {props['ActiveEnterTimestamp']}")
    line = f"{props.get('Id')}: " + ", ".join(words)
    if props.get("StatusText"):
        line += f"\n  {props['StatusText']}"
    return line


def _status(args: argparse.Namespace) -> int:
    problem = sd.user_manager_problem()
    if problem:
        complain(problem)
        return EXIT_FAILED
    shown = sd.show(list(UNIT_NAMES))
    for name in (DAEMON_UNIT, SPAWNER_SOCKET, SPAWNER_UNIT):
        say(describe_unit(shown.get(name, {"Id": name, "LoadState": "not-found"})))
    active = shown.get(DAEMON_UNIT, {}).get("ActiveState") == "active"
    healthy = _print_health(_installed_state_dir())
    return EXIT_OK if active and healthy else EXIT_FAILED


def _installed_state_dir() -> Path:
    """The state dir the installed t3d.service uses (as for `t3d serve` when unknown)."""
    try:
        raw = state_dir_of((unit_dir(os.environ) / DAEMON_UNIT).read_text())
    except OSError:
        raw = None
    return _state_dir(raw if raw and "%" not in raw else None)


def _print_health(state_dir: Path) -> bool:
    from t3d.ctl.client import CtlError, Endpoint, http_get_json

    settings = load_settings({"state_dir": str(state_dir)}, os.environ)
    try:
        endpoint = Endpoint.discover(settings, port_given="T3D_PORT" in os.environ, host_given="T3D_HOST" in os.environ)
        health: Any = trio.run(http_get_json, endpoint, "/api/health")
    except CtlError as exc:
        say(f"daemon: {exc.message}")
        return False
    if not isinstance(health, dict):
        say(f"daemon: {endpoint.url}/api/health answered something other than an object")
        return False
    reasons = "; ".join(str(r) for r in health.get("reasons") or [])
    say(
        f"daemon: {health.get('status')} at {endpoint.url}, t3d {health.get('version')}, "
        f"up {health.get('uptime_s', 0):.0f} s" + (f" ({reasons})" if reasons else "")
    )
    return health.get("status") == "ok"


def _logs(args: argparse.Namespace) -> int:
    journalctl = shutil.which("journalctl")
    if journalctl is None:
        complain("systemd's journal is not available here (no journalctl on PATH)")
        return EXIT_FAILED
    argv = [journalctl, "--user", "-u", DAEMON_UNIT, "-u", SPAWNER_UNIT, "-n", str(max(0, args.lines))]
    if not args.no_follow:
        argv.append("-f")
    sys.stdout.flush()
    os.execv(journalctl, argv)
    return EXIT_FAILED  # not reached
