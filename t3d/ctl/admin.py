"""`t3d ctl status|stop|memory`: look at the daemon and stop a thread's work."""

from __future__ import annotations

import argparse
import signal

import orjson
import trio

from t3d.ctl.client import (
    EXIT_OK,
    CtlError,
    Endpoint,
    JsonDict,
    RpcConnection,
    http_get_json,
    new_command_id,
    open_rpc,
    read_token,
)
from t3d.ctl.render import count_threads, format_memory, format_status
from t3d.ctl.shell import fetch_shell, resolve_thread
from t3d.ctl.terminal import out

# How long `status` waits for a memory-pressure reading.
MEMORY_WAIT_S = 3.0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    status = commands.add_parser(
        "status", parents=[common], help="is the daemon up: version, uptime, projects and threads"
    )
    status.set_defaults(handler=_status)
    stop = commands.add_parser(
        "stop", parents=[common], help="stop a thread's running turn (--force: kill its agent)"
    )
    stop.add_argument("thread", metavar="THREAD", help="the thread's id (or a unique prefix of it)")
    stop.add_argument(
        "--force",
        action="store_true",
        help="kill the agent's process group (TERM, a grace period, KILL); a running turn ends cancelled",
    )
    stop.set_defaults(handler=_stop)
    memory = commands.add_parser(
        "memory", parents=[common], help="watch memory pressure and the heaviest agents live"
    )
    memory.set_defaults(handler=_memory)


async def _status(args: argparse.Namespace, endpoint: Endpoint) -> int:
    try:
        token: str | None = read_token(endpoint.token_path)
    except CtlError:
        token = None  # health's public part still says whether the daemon is up; the shell read then names the token problem
    health = await http_get_json(endpoint, "/api/health", token=token)
    if not isinstance(health, dict):
        raise CtlError(
            f"{endpoint.url}/api/health answered {type(health).__name__}, not an object; is this a t3d daemon?"
        )
    projects, threads = await fetch_shell(endpoint, read_token(endpoint.token_path))
    counts = count_threads(threads)
    memory = await _memory_now(endpoint, health)
    if args.json:
        out(
            orjson.dumps(
                {"url": endpoint.url, "health": health, "projects": len(projects), **counts, "memory_pressure": memory}
            ).decode()
            + "\n"
        )
    else:
        out(format_status(endpoint.url, health, len(projects), counts) + format_memory(memory))
    return EXIT_OK if health.get("status") == "ok" else 1


async def _memory_now(endpoint: Endpoint, health: JsonDict) -> JsonDict:
    """The current memory-pressure value: health's while the daemon samples, else one
    reading through an opted-in subscription (which the daemon answers with the value)."""
    known = health.get("memory_pressure")
    if isinstance(known, dict) and known.get("sampling"):
        return known
    with trio.move_on_after(MEMORY_WAIT_S):
        try:
            async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
                return await _next_memory_value(rpc, await _subscribe_memory(rpc))
        except CtlError:
            pass  # the rest of the status still stands
    return known if isinstance(known, dict) else {"level": "none", "agents": [], "unavailable": "the daemon did not answer"}


async def _subscribe_memory(rpc: RpcConnection) -> str:
    reply = await rpc.call("subscribe.server", {"memory_pressure": True})
    if not isinstance(reply, dict) or not reply.get("memory_pressure"):
        raise CtlError("this daemon does not report memory pressure; is it an older t3d?")
    return str(reply.get("sub"))


async def _next_memory_value(rpc: RpcConnection, sub: str) -> JsonDict:
    while True:
        note = await rpc.receive_notification()
        if note.get("sub") == sub and note.get("kind") == "memory_pressure" and isinstance(note.get("data"), dict):
            return note["data"]  # type: ignore[no-any-return]


async def _memory(args: argparse.Namespace, endpoint: Endpoint) -> int:
    """`t3d ctl memory`: print the level and the heaviest agents at once and on every change."""
    async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
        sub = await _subscribe_memory(rpc)
        while True:
            value = await _next_memory_value(rpc, sub)
            out(orjson.dumps(value).decode() + "\n" if args.json else format_memory(value))


async def _stop(args: argparse.Namespace, endpoint: Endpoint) -> int:
    """`t3d ctl stop THREAD [--force]`: interrupt the running turn, or kill the agent."""
    token = read_token(endpoint.token_path)
    thread_id = await resolve_thread(endpoint, token, args.thread)
    async with open_rpc(endpoint, token) as rpc:
        if args.force:
            result = await rpc.call("thread.force_stop", {"thread_id": thread_id})
        else:
            result = await rpc.call(
                "turn.interrupt", {"thread_id": thread_id, "command_id": new_command_id()}
            )
    if args.json:
        out(orjson.dumps(result).decode() + "\n")
    else:
        out(f"thread {thread_id}: {stop_outcome(result if isinstance(result, dict) else {}, force=args.force)}\n")
    return EXIT_OK


def _how_it_ended(code: object) -> str:
    if not isinstance(code, int):
        return ""
    if code < 0:
        try:
            return f", ended by {signal.Signals(-code).name}"
        except ValueError:
            return f", ended by signal {-code}"
    return f", exit status {code}"


def stop_outcome(result: JsonDict, *, force: bool) -> str:
    """What `ctl stop` did, from the daemon's answer (thread.force_stop or turn.interrupt)."""
    turn = result.get("turn_id")
    if not force:
        if result.get("status") == "cancelled":
            return f"no turn was running; its queued turns were cancelled (the first was {turn})"
        return f"asked turn {turn} to stop; it ends interrupted"
    pid, code = result.get("pid"), result.get("exit_code")
    if pid is None:
        return f"turn {turn} was cancelled before its agent started (force_stop)"
    killed = f"killed its agent (process group {pid}{_how_it_ended(code)})"
    if turn is None:
        return f"{killed}; it was idle: no turn was running"
    return f"{killed}; turn {turn} ended cancelled (force_stop)"
