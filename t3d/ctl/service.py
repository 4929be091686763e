"""`t3d ctl shutdown [--stop-agents]`: ask the running daemon to stop, and wait until it has.

Without ``--stop-agents`` the agents keep running under the spawner for the next daemon
on the state dir (as with SIGTERM); with it, they are stopped too (as with Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import os

import orjson
import trio

from t3d.ctl.client import EXIT_FAILED, EXIT_OK, CtlError, Endpoint, open_rpc, read_token
from t3d.ctl.terminal import out

# How long to wait for the daemon to be gone (its own shutdown is bounded well below this).
STOP_WAIT_S = 60.0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    shutdown = commands.add_parser(
        "shutdown",
        parents=[common],
        help="stop the daemon (agents keep running for the next one unless --stop-agents)",
        description="Stop the running daemon and wait until it has stopped. Its agents keep "
        "running under the spawner for the next daemon on this state dir, unless --stop-agents.",
    )
    shutdown.add_argument(
        "--stop-agents", action="store_true", help="stop every agent too (their turns end)"
    )
    shutdown.set_defaults(handler=_shutdown)


async def _shutdown(args: argparse.Namespace, endpoint: Endpoint) -> int:
    async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
        reply = await rpc.call("server.shutdown", {"stop_agents": bool(args.stop_agents)})
    pid = reply.get("pid") if isinstance(reply, dict) else None
    agents = "stopping every agent" if args.stop_agents else "agents keep running for the next daemon"
    if not args.json:
        out(f"t3d daemon (pid {pid}) at {endpoint.url} is shutting down; {agents}\n")
    stopped = await _wait_gone(pid) if isinstance(pid, int) else None
    if args.json:
        out(orjson.dumps({**(reply if isinstance(reply, dict) else {}), "stopped": stopped}).decode() + "\n")
    elif stopped:
        out("stopped\n")
    if stopped is False:
        raise CtlError(
            f"the daemon (pid {pid}) did not stop within {STOP_WAIT_S:g} s; see its log, "
            "or stop it with SIGTERM",
            EXIT_FAILED,
        )
    return EXIT_OK


async def _wait_gone(pid: int) -> bool | None:
    """Whether ``pid`` ended within STOP_WAIT_S; None when it cannot be watched from here."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:
        return None  # another pid namespace, or too old a kernel
    try:
        with trio.move_on_after(STOP_WAIT_S):
            await trio.lowlevel.wait_readable(fd)
            return True
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
