"""`t3d ctl top`: the daemon's state and every running agent, refreshed in the terminal.

Each refresh reads ``GET /api/health`` (loop lag, writer queue, memory pressure,
admission) and ``server.agents`` (each agent's thread, provider, turn, and its process
group's RSS and CPU time, read from /proc by the daemon). CPU % is the CPU time an
agent's group used between two refreshes over the time between them, so it shows from
the second refresh on. The screen is drawn with curses (standard library); ``q`` quits.
``--json`` prints one snapshot (both answers) and exits.

`render` is pure (answers in, lines out) so what the screen says is tested without a
terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import curses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import trio

from t3d.ctl.client import (
    EXIT_OK,
    EXIT_USAGE,
    CtlError,
    Endpoint,
    JsonDict,
    http_get_json,
    open_rpc,
    read_token,
)
from t3d.ctl.render import format_duration
from t3d.ctl.terminal import out

KEY_POLL_S = 0.05
COLUMNS = ("THREAD", "PROVIDER", "STATUS", "TURN", "PID", "PROCS", "RSS", "CPU")
ORDER = {"running": 0, "waiting": 1, "starting": 2, "idle": 3}


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    top = commands.add_parser(
        "top",
        parents=[common],
        help="watch the daemon and every running agent live (q quits)",
        description="A live view of the daemon (loop lag, writer queue, memory pressure, admission) and of "
        "every running agent: thread, provider, status, turn time, RSS and CPU of its processes. "
        "q quits; --json prints one snapshot and exits.",
    )
    top.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="seconds between refreshes, 0.2-60 (default 2)")
    top.set_defaults(handler=_top)


async def snapshot(endpoint: Endpoint, rpc: Any, token: str) -> tuple[JsonDict, JsonDict]:
    """(health, agents): health (the whole report, so with the token) says why when the
    daemon cannot give it."""
    try:
        health = await http_get_json(endpoint, "/api/health", token=token)
    except CtlError as exc:
        health = {"status": "unknown", "reasons": [exc.message]}
    agents = await rpc.call("server.agents")
    if not isinstance(agents, dict) or not isinstance(health, dict):
        raise CtlError(f"{endpoint.url} answered server.agents or /api/health with something else than an object; is this a t3d daemon?")
    return health, agents


async def _top(args: argparse.Namespace, endpoint: Endpoint) -> int:
    if not 0.2 <= args.interval <= 60:
        raise CtlError(f"--interval {args.interval:g} is out of range; use 0.2 to 60 seconds", EXIT_USAGE)
    token = read_token(endpoint.token_path)
    async with open_rpc(endpoint, token) as rpc:
        if args.json:
            health, agents = await snapshot(endpoint, rpc, token)
            out(orjson.dumps({"url": endpoint.url, "health": health, **agents}).decode() + "\n")
            return EXIT_OK
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise CtlError("t3d ctl top draws on a terminal; run it in one, or use --json for one snapshot", EXIT_USAGE)
        return await _watch(endpoint, rpc, token, args.interval)


async def _watch(endpoint: Endpoint, rpc: Any, token: str, interval: float) -> int:
    screen = curses.initscr()
    try:
        curses.noecho()
        curses.cbreak()
        screen.keypad(True)
        screen.nodelay(True)
        with contextlib.suppress(curses.error):  # a terminal that cannot hide the cursor
            curses.curs_set(0)
        previous: JsonDict | None = None
        lines: list[str] = []
        due = trio.current_time()
        while True:
            if trio.current_time() >= due:
                health, agents = await snapshot(endpoint, rpc, token)
                lines = render(endpoint.url, health, agents, previous)
                previous, due = agents, trio.current_time() + interval
                _draw(screen, lines)
            key = screen.getch()
            if key in (ord("q"), ord("Q")):
                return EXIT_OK
            if key == curses.KEY_RESIZE:
                _draw(screen, lines)
            await trio.sleep(KEY_POLL_S)
    finally:
        curses.nocbreak()
        screen.keypad(False)
        curses.echo()
        curses.endwin()


def _draw(screen: Any, lines: Sequence[str]) -> None:
    height, width = screen.getmaxyx()
    screen.erase()
    for row, line in enumerate(lines[: max(0, height - 1)]):
        with contextlib.suppress(curses.error):  # the last cell of a tiny window
            screen.addnstr(row, 0, line, max(0, width - 1))
    screen.refresh()


# --- what the screen says (pure) -------------------------------------------------------------


def _mib(size: object) -> str:
    return f"{size / 2**20:.1f} MiB" if isinstance(size, int | float) else "—"


def _cpu_pct(now: Mapping[str, Any], before: Mapping[str, Any] | None, seconds: float) -> str:
    if before is None or seconds <= 0:
        return "—"
    a, b = now.get("cpu_s"), before.get("cpu_s")
    if not isinstance(a, int | float) or not isinstance(b, int | float) or a < b:
        return "—"
    return f"{100 * (a - b) / seconds:.1f}%"


def _ms(value: object) -> str:
    return f"{value:.1f} ms" if isinstance(value, int | float) else "?"


def render(url: str, health: Mapping[str, Any], agents: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> list[str]:
    """The screen: three lines about the daemon, then one row per agent (busy ones first)."""
    seconds = float(agents.get("at", 0)) - float(previous.get("at", 0)) if previous else 0.0
    daemon = agents.get("daemon") or {}
    before_daemon = (previous or {}).get("daemon")
    uptime = health.get("uptime_s")
    up = f"up {format_duration(float(uptime))}" if isinstance(uptime, int | float) else "up ?"
    lag = health.get("loop_lag_ms") or {}
    writer = health.get("writer") or {}
    admission = health.get("admission") or {}
    memory = health.get("memory_pressure") or {}
    lines = [
        f"t3d {health.get('version', '?')} at {url}  {health.get('status', '?')}  {up}  "
        f"pid {daemon.get('pid', '?')}  RSS {_mib(daemon.get('rss_bytes'))}  CPU {_cpu_pct(daemon, before_daemon, seconds)}",
        f"loop lag p50 {_ms(lag.get('p50'))}  p99 {_ms(lag.get('p99'))}  max {_ms(lag.get('max'))}   "
        f"writer queue {writer.get('queue', '?')} (oldest {writer.get('oldest_job_s', 0):.2f} s)   "
        f"memory pressure {memory.get('level', '?')}",
        f"admission {admission.get('state', '?')}  active turns {admission.get('active_turns', '?')}  "
        f"held {admission.get('held_turns', '?')}  sessions {health.get('sessions', '?')}  "
        f"connections {health.get('connections', '?')}   q quits",
    ]
    lines += [f"  {reason}" for reason in health.get("reasons") or ()]
    rows = [a for a in agents.get("agents") or () if isinstance(a, Mapping)]
    rows.sort(key=lambda a: (ORDER.get(str(a.get("status")), 9), -(a.get("turn_s") or 0), str(a.get("thread_id"))))
    earlier = {a.get("pid"): a for a in (previous or {}).get("agents") or () if isinstance(a, Mapping)}
    lines += ["", f"{len(rows)} agent(s)", _row(COLUMNS)]
    for agent in rows:
        turn_s = agent.get("turn_s")
        lines.append(_row((
            str(agent.get("thread_id", "?")), str(agent.get("provider", "?")), str(agent.get("status", "?")),
            format_duration(float(turn_s)) if isinstance(turn_s, int | float) else "",
            str(agent.get("pid", "?")), str(agent.get("processes", "?")), _mib(agent.get("rss_bytes")),
            _cpu_pct(agent, earlier.get(agent.get("pid")), seconds),
        )))  # fmt: skip
    return lines


def _row(cells: Sequence[str]) -> str:
    widths = (32, 9, 9, 8, 8, 6, 11, 7)
    return " ".join(cell[:width].ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
