"""`t3d ctl`: the parser of its subcommands and the one place they are run.

Each command module (``admin``, ``turn``...) adds its subcommands with
``register(commands, common)`` and names its coroutine with
``set_defaults(handler=...)``. :func:`run_ctl` resolves the same settings as
`t3d serve`, runs the chosen handler under ``trio.run`` and turns every
expected failure into one ``error: ...`` line on stderr and an exit status:

- 0: success (the turn completed; the daemon is healthy); `attach` and
  `threads --watch` also when Ctrl-C ends them (they only look on)
- 1: the turn failed, was interrupted or cancelled; the daemon rejected a
  call (JSON-RPC error: no such thread, a busy one...); the attached thread
  was deleted; health is not ``ok``
- 2: usage, settings, token or connection problems
- 130: Ctrl-C (during `run`: the second one; the first interrupts the turn)

The daemon's messages name API calls as the next step ("list threads with GET
/api/shell"); `ctl_hints` (t3d/ctl/hints.py) names the ctl command instead.
Commands marked ``offline`` (completion) run without looking for a daemon.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import trio

from t3d.config import load_settings
from t3d.ctl import (
    admin,
    completion,
    db,
    diff,
    follow,
    lifecycle,
    requests,
    service,
    threads,
    top,
    turn,
)
from t3d.ctl import open as open_page
from t3d.ctl.client import EXIT_OK, EXIT_SIGINT, EXIT_USAGE, CtlError, Endpoint, unwrap_group
from t3d.ctl.hints import ctl_hints
from t3d.ctl.terminal import err
from t3d.errors import ConfigError

COMMAND_MODULES = (admin, threads, turn, follow, lifecycle, diff, requests, service, db, top, open_page, completion)

EXIT_CODES_HELP = (
    "exit status: 0 success (attach and threads --watch: also when Ctrl-C ends them); 1 the "
    "turn failed, was interrupted or cancelled, the daemon refused a call (no such thread, a "
    "busy one...), the attached thread was deleted, or health is not ok; 2 usage, settings, "
    "token or connection problems; 130 Ctrl-C (run: the second one)"
)

# The names of the ctl commands this build has (filled by add_ctl_arguments): a hint is
# rewritten into a ctl command only when that command exists.
COMMANDS: set[str] = set()


def add_ctl_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ctl subcommands and the common flags to the ``ctl`` parser.

    The common flags are accepted before and after the subcommand
    (``t3d ctl --port 4000 status`` and ``t3d ctl status --port 4000``).
    """
    parser.epilog = EXIT_CODES_HELP
    _add_common_flags(parser, default=None)
    common = argparse.ArgumentParser(add_help=False)
    _add_common_flags(common, default=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="ctl_command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(commands, common)
    COMMANDS.update(commands.choices)
    for sub in commands.choices.values():
        sub.epilog = sub.epilog or EXIT_CODES_HELP


def _add_common_flags(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        default=default,
        help="state directory of the daemon (T3D_STATE_DIR)",
    )
    parser.add_argument("--host", default=default, help="address the daemon listens on (T3D_HOST)")
    parser.add_argument(
        "--port",
        default=default,
        help="port the daemon listens on (T3D_PORT; default: the one in <state dir>/daemon.json, else 3774)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if default is None else default,
        help="machine-readable output",
    )


def run_ctl(args: argparse.Namespace) -> int:
    """Run the chosen ctl subcommand; return the process exit status."""
    if getattr(args, "offline", False):
        try:
            return int(trio.run(args.handler, args, None))
        except BaseException as exc:
            return _exit_status(exc)
    try:
        settings = load_settings(
            {"state_dir": args.state_dir, "host": args.host, "port": args.port}, os.environ
        )
    except ConfigError as exc:
        err(f"error: {exc}\n")
        return EXIT_USAGE
    handler = getattr(args, "handler", None)
    if handler is None:
        err("error: name a command (see t3d ctl --help)\n")
        return EXIT_USAGE
    try:
        endpoint = Endpoint.discover(
            settings,
            port_given=args.port is not None or "T3D_PORT" in os.environ,
            host_given=args.host is not None or "T3D_HOST" in os.environ,
        )
        return int(trio.run(handler, args, endpoint))
    except BaseException as exc:
        return _exit_status(exc)


def _exit_status(exc: BaseException) -> int:
    """Map an expected failure to its exit status (with its message); re-raise anything else."""
    inner = unwrap_group(exc)
    if isinstance(inner, CtlError):
        err(f"error: {ctl_hints(inner.message, COMMANDS)}\n")
        return inner.exit_code
    if isinstance(inner, KeyboardInterrupt):
        err("\n")
        return EXIT_SIGINT
    if isinstance(inner, BrokenPipeError):
        return EXIT_OK  # the reader of our output went away (`| head`)
    raise exc
