"""`python -m spawner --socket PATH`: run the t3d spawner sidecar.

Listens on the Unix socket PATH (mode 0600), or on the socket systemd passes
(socket activation: LISTEN_FDS/LISTEN_PID). Exit status: 0 on a stop signal
or after ``--idle-exit`` seconds with no daemon and no children; 2 on bad
arguments; 1 when the socket cannot be bound or another spawner answers there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

from spawner import log
from spawner.pools import FORGE_POOL, OTHER_POOL, Pool, available_cpus, default_git_pool
from spawner.relay import DEFAULT_REPLAY_BOUND, DEFAULT_REPLAY_BUDGET
from spawner.server import Spawner

SD_LISTEN_FDS_START = 3


USAGE = f"""usage: t3d-spawner --socket PATH [options]

Start processes for the t3d daemon.

  --socket PATH        Unix socket to listen on (ignored under socket activation)
  --git-pool N         git commands at once, 1-256 (default max(8, min(32, cpus // 4)))
  --forge-pool N       gh/glab/tea commands at once, 1-64 (default {FORGE_POOL})
  --other-pool N       other commands at once, 1-256 (default {OTHER_POOL})
  --orphan-grace S     seconds a child whose daemon went away waits to be adopted
                       before it is stopped, unless its spawn says otherwise (default 60)
  --replay-buffer N    bytes of one child's output kept until its daemon acks them,
                       1024-1073741824 (default {DEFAULT_REPLAY_BOUND})
  --replay-budget N    bytes of output kept for all children together,
                       65536-17179869184 (default {DEFAULT_REPLAY_BUDGET})
  --idle-exit S        exit after S seconds with no daemon and no children (default: never)
  --log-level LEVEL    {", ".join(log.LEVELS)} (default info)
"""

# option -> (parser, allowed range); argparse would cost the sidecar half a MiB of RSS.
_OPTIONS = {
    "--socket": (str, None),
    "--git-pool": (int, (1, 256)),
    "--forge-pool": (int, (1, 64)),
    "--other-pool": (int, (1, 256)),
    "--orphan-grace": (float, (0, 86400)),
    "--idle-exit": (float, (0, 86400)),
    "--replay-buffer": (int, (1024, 1 << 30)),
    "--replay-budget": (int, (65536, 1 << 34)),
    "--log-level": (str, None),
}


class UsageError(Exception):
    pass


class Options:
    socket = ""
    git_pool: int | None = None
    forge_pool = FORGE_POOL
    other_pool = OTHER_POOL
    orphan_grace = 60.0
    idle_exit: float | None = None
    replay_buffer = DEFAULT_REPLAY_BOUND
    replay_budget = DEFAULT_REPLAY_BUDGET
    log_level = "info"


def parse_args(argv: list[str]) -> Options:
    """``--name value`` pairs onto `Options` (``--git-pool`` sets ``git_pool``)."""
    if "-h" in argv or "--help" in argv:
        sys.stdout.write(USAGE)
        raise SystemExit(0)
    options = Options()
    if len(argv) % 2:
        raise UsageError(f"{argv[-1]} needs a value")
    for name, raw in zip(argv[::2], argv[1::2], strict=True):
        if name not in _OPTIONS:
            raise UsageError(f"unknown option {name}")
        kind, bounds = _OPTIONS[name]
        try:
            value = kind(raw)
        except ValueError:
            raise UsageError(f"{name} {raw!r} is not a {'whole number' if kind is int else 'number'}") from None
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            raise UsageError(f"{name} {raw} is out of range; use {bounds[0]} to {bounds[1]}")
        setattr(options, name[2:].replace("-", "_"), value)
    if not options.socket:
        raise UsageError("--socket is required")
    if options.log_level not in log.LEVELS:
        raise UsageError(f"--log-level must be one of {', '.join(log.LEVELS)}")
    return options


def activated_socket() -> socket.socket | None:
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or int(os.environ.get("LISTEN_FDS", "0") or 0) < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # children must not think the socket is theirs
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    sock.set_inheritable(False)
    return sock


def bind_socket(path: str) -> socket.socket:
    """Bind a 0600 listening socket at ``path``, replacing a stale one; refuse a live one."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    else:
        raise OSError(f"another spawner already answers on {path}")
    finally:
        probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    return sock


def main(argv: list[str] | None = None) -> int:
    # Variables the daemon set only to start us: our children must not inherit them.
    for name in os.environ.pop("T3D_SPAWNER_UNSET", "").split(","):
        os.environ.pop(name, None)
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        sys.stderr.write(f"t3d-spawner: {exc}\n{USAGE}")
        return 2
    log.set_level(args.log_level)
    socket_path = args.socket
    listener = activated_socket()
    owned_path = None
    if listener is None:
        try:
            listener = bind_socket(socket_path)
        except OSError as exc:
            log.error("cannot listen on %s: %s", socket_path, exc.strerror or exc)
            return 1
        owned_path = socket_path
    listener.listen(128)
    listener.setblocking(False)
    cpus = available_cpus()
    pools = {
        "git": Pool("git", args.git_pool or default_git_pool(cpus)),
        "forge": Pool("forge", args.forge_pool),
        "other": Pool("other", args.other_pool),
    }
    sizes = " ".join(f"{name}={pool.size}" for name, pool in pools.items())
    log.info("listening on %s; pools %s (%d cpus)", socket_path, sizes, cpus)
    try:
        Spawner(
            listener,
            pools,
            orphan_grace=args.orphan_grace,
            idle_exit=args.idle_exit,
            replay_bound=args.replay_buffer,
            replay_budget=args.replay_budget,
        ).serve_forever()
    finally:
        if owned_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(owned_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
