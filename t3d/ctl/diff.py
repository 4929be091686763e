"""`t3d ctl diff THREAD [TURN | A..B]`: what a thread's turns changed, from its checkpoints.

``checkpoint.diff`` is read page by page (its ``next_offset``) into one text; on a
terminal it is coloured and shown through ``$PAGER`` (default ``less``, with ``LESS=FRX``
unless set), elsewhere written plain. Ctrl-C belongs to the pager while it runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys

import orjson
import trio

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
from t3d.ctl.listing import turns_seen
from t3d.ctl.render import color_diff
from t3d.ctl.shell import resolve_thread, thread_page
from t3d.ctl.terminal import err, out

# Pages read before the diff is given up on (git's output is capped at 8 MiB: 32 pages of 256 KiB).
MAX_PAGES = 64
_RANGE = re.compile(r"^(\d+)?\.\.(\d+)?$")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    diff = commands.add_parser(
        "diff",
        parents=[common],
        help="show what a thread's turns changed (paged and coloured on a terminal)",
        description="The unified diff between two of a thread's checkpoints. TURN: what that turn "
        "changed; A..B: from after turn A to after turn B (0: before the first turn); none: "
        "everything the thread's finished turns changed. On a terminal it is coloured and paged "
        "through $PAGER (default less).",
    )
    diff.add_argument("thread", metavar="THREAD", help="the thread's id (or a unique prefix of it)")
    diff.add_argument("turn", metavar="TURN", nargs="?", help="a turn's number, or A..B")
    diff.add_argument("--no-pager", action="store_true", help="write to stdout even on a terminal")
    diff.set_defaults(handler=_diff)


def parse_range(given: str | None, last_finished: int) -> tuple[int, int]:
    """(from, to) checkpoints for TURN, ``A..B`` (either end may be left out) or nothing."""
    if given is None:
        return 0, last_finished
    if given.isdigit():
        turn = int(given)
        if turn < 1:
            raise CtlError("TURN 0 changed nothing: it is the state before the first turn; give 1 or later, or A..B", EXIT_USAGE)
        return turn - 1, turn
    match = _RANGE.match(given)
    if match is None:
        raise CtlError(f"{given!r} is neither a turn's number nor A..B; e.g. `t3d ctl diff THREAD 3` or `2..5`", EXIT_USAGE)
    low, high = match.group(1), match.group(2)
    return int(low) if low else 0, int(high) if high else last_finished


async def _last_finished(endpoint: Endpoint, token: str, thread_id: str) -> int:
    """The last turn with its checkpoint taken: the last finished one."""
    page = await thread_page(endpoint, token, thread_id, turn_limit=1)
    seen = turns_seen(page.get("turns") or [])
    if seen.open is not None:
        return max(0, int(seen.open.get("ordinal") or 1) - 1)
    return int((seen.last or {}).get("ordinal") or 0)


async def read_diff(rpc: RpcConnection, thread_id: str, low: int, high: int) -> JsonDict:
    """The whole diff (its pages joined), with ``truncated`` from the daemon."""
    params: JsonDict = {"thread_id": thread_id, "from_ordinal": low, "to_ordinal": high}
    pages: list[str] = []
    reply: JsonDict = {}
    offset: int | None = 0
    for _ in range(MAX_PAGES):
        if offset is None:
            break
        got = await rpc.call("checkpoint.diff", {**params, "offset": offset})
        reply = got if isinstance(got, dict) else {}
        pages.append(str(reply.get("diff") or ""))
        next_offset = reply.get("next_offset")
        offset = next_offset if isinstance(next_offset, int) and next_offset > offset else None
    return {**params, "diff": "".join(pages), "total_chars": reply.get("total_chars"), "truncated": bool(reply.get("truncated"))}


async def _diff(args: argparse.Namespace, endpoint: Endpoint) -> int:
    token = read_token(endpoint.token_path)
    thread_id = await resolve_thread(endpoint, token, args.thread)
    needs_last = args.turn is None or args.turn.endswith("..")
    last = await _last_finished(endpoint, token, thread_id) if needs_last else 0
    low, high = parse_range(args.turn, last)
    if needs_last and high == 0:
        raise CtlError(f"thread {thread_id} has no finished turn yet, so nothing to diff; see it with `t3d ctl log {thread_id}`", EXIT_USAGE)
    async with open_rpc(endpoint, token) as rpc:
        diff = await read_diff(rpc, thread_id, low, high)
    if args.json:
        out(orjson.dumps(diff).decode() + "\n")
        return EXIT_OK
    what = f"turn {high}" if high == low + 1 else f"checkpoints {low}..{high}"
    if diff["truncated"]:
        err("note: the diff is cut where git's output passed 8 MiB\n")
    if not diff["diff"]:
        err(f"no changes in {what} of thread {thread_id}\n")
        return EXIT_OK
    text: str = diff["diff"]
    if sys.stdout.isatty():
        if os.environ.get("NO_COLOR", "") == "":
            text = color_diff(text)
        if not args.no_pager and await _page(text):
            return EXIT_OK
    out(text)
    return EXIT_OK


def _pager() -> tuple[str, dict[str, str]] | None:
    """The pager command and its environment, or None to write directly."""
    pager = os.environ.get("PAGER")
    env = dict(os.environ)
    if pager is None:
        if shutil.which("less") is None:
            return None
        pager = "less"
    if pager.strip() in ("", "cat"):
        return None
    env.setdefault("LESS", "FRX")  # one screen: no pager; keep colours; leave the screen as it was
    return pager, env


async def _page(text: str) -> bool:
    """Show ``text`` through the pager; False if there is none to run."""
    chosen = _pager()
    if chosen is None:
        return False
    pager, env = chosen
    with trio.open_signal_receiver(signal.SIGINT):  # Ctrl-C is the pager's (less uses it)
        try:
            await trio.run_process(pager, shell=True, stdin=text.encode(), env=env, check=False, stdout=None, stderr=None)
        except (BrokenPipeError, OSError):
            return True  # the pager was quit before it read everything
    return True
