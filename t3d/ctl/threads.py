"""`t3d ctl threads [filters] [--watch]` and `t3d ctl projects`.

The rows come from the shell; each shown thread's last finished and open turn from its
snapshot (`shell.last_turns_of`). ``--watch`` follows ``subscribe.shell`` and draws again
at most once a second: in place on a terminal (the ages tick), and off one only when a
row changed. Ctrl-C ends the watch (exit 0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import trio

from t3d.ctl.approver import watch_sigint
from t3d.ctl.client import (
    EXIT_OK,
    EXIT_USAGE,
    CtlError,
    Endpoint,
    JsonDict,
    RpcConnection,
    open_rpc,
    read_token,
)
from t3d.ctl.listing import (
    THREAD_STATUSES,
    ShellState,
    ThreadFilter,
    TurnsSeen,
    format_projects,
    format_threads,
    no_threads_note,
    project_matches,
    project_rows,
    thread_rows,
)
from t3d.ctl.shell import fetch_shell, last_turns_of
from t3d.ctl.terminal import out

WATCH_INTERVAL_S = 1.0  # at most one redraw a second
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    threads = commands.add_parser(
        "threads",
        parents=[common],
        help="list threads: project, provider, status, last turn, running time",
        description="List threads, oldest first: project, provider, status (and why a queued one waits), "
        "how long its open turn has run, its last finished turn and how long ago, and its title. "
        "IDs are shown by their shortest unique prefix; every command takes such a prefix.",
    )
    threads.add_argument("--all", action="store_true", help="include archived threads")
    threads.add_argument(
        "--project", metavar="P", action="append", help="only this project's threads: its id (or a prefix), path or name (repeatable)"
    )
    threads.add_argument(
        "--status", action="append", choices=THREAD_STATUSES, help="only threads with this status (repeatable)"
    )
    threads.add_argument("--provider", metavar="NAME", action="append", help="only threads of this provider (repeatable)")
    threads.add_argument(
        "--waiting", action="store_true", help="only threads that wait on someone: an answer to a prompt, or the daemon (queued)"
    )
    threads.add_argument(
        "--watch", action="store_true", help="keep the list current (redrawn in place on a terminal, at most once a second)"
    )
    threads.add_argument("-q", "--quiet", action="store_true", help="print only the full ids, one per line")
    threads.set_defaults(handler=_threads)
    projects = commands.add_parser("projects", parents=[common], help="list projects with their thread counts")
    projects.set_defaults(handler=_projects)


def thread_filter(args: argparse.Namespace, projects: Sequence[Mapping[str, Any]], *, strict: bool = True) -> ThreadFilter:
    """The filter the flags ask for. A --project that names no project is a usage error,
    unless not ``strict`` (a watch: the project may come): then it matches nothing yet."""
    chosen: set[str] = set()
    cwd = os.getcwd()
    for given in args.project or ():
        found = {str(p.get("id")) for p in projects if project_matches(given, p, cwd)}
        if not found and strict:
            raise CtlError(f"no project matches --project {given!r}; list them with `t3d ctl projects`", EXIT_USAGE)
        chosen |= found or {"\0none"}
    return ThreadFilter(
        projects=frozenset(chosen),
        statuses=frozenset(args.status or ()),
        providers=frozenset(args.provider or ()),
        waiting=args.waiting,
        archived=args.all,
    )


def _width() -> int | None:
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def render_threads(
    args: argparse.Namespace,
    projects: Mapping[str, JsonDict],
    threads: Sequence[JsonDict],
    shown: Sequence[JsonDict],
    seen: Mapping[str, TurnsSeen],
) -> str:
    now = time.time()
    if args.json:
        return orjson.dumps(thread_rows(shown, projects, seen, now)).decode() + "\n"
    table = format_threads(shown, projects, seen, now, all_ids=[str(t.get("id")) for t in threads], width=_width())
    return table or no_threads_note(len(threads), args.all or "archived" in (args.status or ()))


async def _threads(args: argparse.Namespace, endpoint: Endpoint) -> int:
    token = read_token(endpoint.token_path)
    if args.watch and args.quiet:
        raise CtlError("--quiet prints the ids once; leave out --watch or --quiet", EXIT_USAGE)
    if args.watch:
        return await _watch(args, endpoint, token)
    projects, threads = await fetch_shell(endpoint, token)
    keep = thread_filter(args, projects)
    shown = [t for t in threads if keep(t)]
    if args.quiet:
        out("".join(f"{t['id']}\n" for t in sorted(shown, key=lambda t: t.get("created_at") or 0)))
        return EXIT_OK
    seen = await last_turns_of(endpoint, token, [str(t["id"]) for t in shown if t.get("turn_count")])
    out(render_threads(args, {str(p.get("id")): p for p in projects}, threads, shown, seen))
    return EXIT_OK


async def _projects(args: argparse.Namespace, endpoint: Endpoint) -> int:
    projects, threads = await fetch_shell(endpoint, read_token(endpoint.token_path))
    rows = project_rows(projects, threads)
    out(orjson.dumps(rows).decode() + "\n" if args.json else format_projects(rows))
    return EXIT_OK


class _Watch:
    """One `threads --watch`: the shell followed, turns read again for changed rows."""

    def __init__(self, args: argparse.Namespace, endpoint: Endpoint, token: str) -> None:
        self.args = args
        self.endpoint = endpoint
        self.token = token
        self.state = ShellState()
        self.seen: dict[str, TurnsSeen] = {}
        self.moved = trio.Event()
        self.terminal = sys.stdout.isatty() and not args.json
        self.last_drawn = ""

    async def follow(self, rpc: RpcConnection) -> None:
        sub = await self._subscribe(rpc)
        while True:
            note = await rpc.receive_notification()
            if note.get("sub") is None and note.get("kind") == "resync":
                # This client fell behind its own queue: start again on a fresh subscription.
                await rpc.call("unsubscribe", {"sub": sub})
                self.state = ShellState()
                sub = await self._subscribe(rpc)
            elif note.get("sub") == sub and self.state.feed(note.get("kind"), note.get("data")) and self.state.based:
                self.moved.set()

    async def _subscribe(self, rpc: RpcConnection) -> str:
        reply = await rpc.call("subscribe.shell", {})
        if not isinstance(reply, dict) or not reply.get("sub"):
            raise CtlError("the daemon's reply to subscribe.shell has no 'sub'; is it a different t3d version?")
        return str(reply["sub"])

    async def draw_loop(self) -> None:
        while True:
            with trio.move_on_after(WATCH_INTERVAL_S if self.terminal else float("inf")):
                await self.moved.wait()
            if not self.state.based:
                continue
            self.moved = trio.Event()
            await self._draw()
            await trio.sleep(WATCH_INTERVAL_S)

    async def _draw(self) -> None:
        state, args = self.state, self.args
        threads = list(state.threads.values())
        keep = thread_filter(args, list(state.projects.values()), strict=False)
        shown = [t for t in threads if keep(t)]
        stale = [str(t["id"]) for t in shown if t.get("turn_count") and (str(t["id"]) in state.changed or str(t["id"]) not in self.seen)]
        state.changed.clear()
        self.seen.update(await last_turns_of(self.endpoint, self.token, stale))
        text = render_threads(args, state.projects, threads, shown, self.seen)
        if self.terminal:
            out(CLEAR + _fit_screen(f"t3d ctl threads at {self.endpoint.url}, {time.strftime('%H:%M:%S')} (Ctrl-C quits)\n\n" + text))
        elif text != self.last_drawn:
            out(text if args.json else ("\n" if self.last_drawn else "") + text)
        self.last_drawn = text


def _fit_screen(text: str) -> str:
    """``text`` cut to the terminal's height, saying how many lines are left out."""
    rows = shutil.get_terminal_size().lines
    lines = text.splitlines()
    if len(lines) < rows:
        return text
    kept = max(rows - 2, 1)
    return "\n".join([*lines[:kept], f"… {len(lines) - kept} more lines (narrow the list with --project, --status, --waiting)"]) + "\n"


async def _watch(args: argparse.Namespace, endpoint: Endpoint, token: str) -> int:
    watch = _Watch(args, endpoint, token)
    async with open_rpc(endpoint, token) as rpc, trio.open_nursery() as nursery:
        await nursery.start(watch_sigint, nursery.cancel_scope.cancel)
        nursery.start_soon(watch.follow, rpc)
        nursery.start_soon(watch.draw_loop)
    return EXIT_OK
