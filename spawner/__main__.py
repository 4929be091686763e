"""`python -m spawner --socket PATH`: run the t3d spawner sidecar.

Listens on the Unix socket PATH (mode 0600), or on the socket systemd passes
(socket activation: LISTEN_FDS/LISTEN_PID). Exit status: 0 on a stop signal
or after ``--idle-exit`` seconds with no daemon and no children; 2 on bad
arguments; 1 when the socket cannot be bound or another spawner answers there.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys

from spawner.pools import FORGE_POOL, OTHER_POOL, Pool, available_cpus, default_git_pool
from spawner.server import Spawner

SD_LISTEN_FDS_START = 3


def _positive_int(low: int, high: int):  # type: ignore[no-untyped-def]
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range; use {low} to {high}")
        return value

    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="t3d-spawner", description="Start processes for the t3d daemon.")
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on (ignored under socket activation)")
    parser.add_argument("--git-pool", type=_positive_int(1, 256), default=None, help="git commands at once (default max(8, min(32, cpus // 4)))")
    parser.add_argument("--forge-pool", type=_positive_int(1, 64), default=FORGE_POOL, help=f"gh/glab/tea commands at once (default {FORGE_POOL})")
    parser.add_argument("--other-pool", type=_positive_int(1, 256), default=OTHER_POOL, help=f"other commands at once (default {OTHER_POOL})")
    parser.add_argument("--orphan-grace", type=float, default=60.0, help="seconds a child whose daemon went away waits to be adopted before it is stopped")
    parser.add_argument("--idle-exit", type=float, default=None, help="exit after this many seconds with no daemon connected and no children")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser.parse_args(argv)


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
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="t3d-spawner %(levelname)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("t3d-spawner")
    listener = activated_socket()
    owned_path = None
    if listener is None:
        try:
            listener = bind_socket(args.socket)
        except OSError as exc:
            log.error("cannot listen on %s: %s", args.socket, exc.strerror or exc)
            return 1
        owned_path = args.socket
    listener.listen(128)
    listener.setblocking(False)
    cpus = available_cpus()
    pools = {
        "git": Pool("git", args.git_pool or default_git_pool(cpus)),
        "forge": Pool("forge", args.forge_pool),
        "other": Pool("other", args.other_pool),
    }
    log.info("listening on %s; pools git=%d forge=%d other=%d (%d cpus)", args.socket, pools["git"].size, pools["forge"].size, pools["other"].size, cpus)
    try:
        Spawner(listener, pools, orphan_grace=args.orphan_grace, idle_exit=args.idle_exit).serve_forever()
    finally:
        if owned_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(owned_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
