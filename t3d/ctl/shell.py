"""What most ctl commands read first: the shell, a thread named by a prefix of its id, a
thread's snapshot (paged with ``before``), and what its turns say.

Reads go over plain HTTP GETs (``/api/shell``, ``/api/threads/{id}``), one connection
each: a snapshot reply is one bounded body there, where over the WebSocket it would come
as notifications that share the connection's queue with a subscription's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from urllib.parse import quote, urlencode

import trio

from t3d.ctl.client import EXIT_USAGE, CtlError, Endpoint, JsonDict, RpcError, http_get_json
from t3d.ctl.listing import TurnsSeen, match_id, turns_seen

# Snapshot reads `t3d ctl threads` runs at once to learn each thread's last turn.
TURN_READS_AT_ONCE = 8
# A full id (what the daemon mints: 32 hex digits) is used as given, without a shell read.
FULL_ID_CHARS = 32
# Pages `last_turns` reads back through open turns before it gives up on a finished one.
OPEN_TURN_PAGES = 3
NOT_FOUND = -32001  # the JSON-RPC code of a thread that does not exist


async def fetch_shell(endpoint: Endpoint, token: str) -> tuple[list[JsonDict], list[JsonDict]]:
    """Every project and every thread's shell row."""
    shell = await http_get_json(endpoint, "/api/shell", token=token)
    if not isinstance(shell, dict):
        raise CtlError(
            f"{endpoint.url}/api/shell answered {type(shell).__name__}, not an object; is this a t3d daemon?"
        )
    projects = [row for row in shell.get("projects") or [] if isinstance(row, dict)]
    threads = [row for row in shell.get("threads") or [] if isinstance(row, dict)]
    return projects, threads


def pick_thread(given: str, threads: Iterable[JsonDict]) -> str:
    """The id ``given`` names among ``threads``: itself, or the one id it is a prefix of;
    several matches are a usage error naming them; none leaves ``given`` for the daemon to
    refuse."""
    found, candidates = match_id(given, (str(t.get("id")) for t in threads))
    if found is not None:
        return found
    if candidates:
        shown = ", ".join(candidates[:5]) + (f" and {len(candidates) - 5} more" if len(candidates) > 5 else "")
        raise CtlError(f"{given!r} is the start of several thread ids ({shown}); give more of it", EXIT_USAGE)
    return given


async def resolve_thread(endpoint: Endpoint, token: str, given: str) -> str:
    """The thread id ``given`` names: a full id as it is, else an id it is a prefix of."""
    if len(given) >= FULL_ID_CHARS:
        return given
    _, threads = await fetch_shell(endpoint, token)
    return pick_thread(given, threads)


async def thread_page(
    endpoint: Endpoint, token: str, thread_id: str, *, turn_limit: int, before: int | None = None
) -> JsonDict:
    """One page of ``thread.snapshot``: the last ``turn_limit`` turns (and every open one),
    or with ``before`` the ``turn_limit`` turns before that ordinal."""
    query: dict[str, int] = {"turn_limit": turn_limit}
    if before is not None:
        query["before"] = before
    page = await http_get_json(endpoint, f"/api/threads/{quote(thread_id, safe='')}?{urlencode(query)}", token=token)
    if not isinstance(page, dict) or not isinstance(page.get("thread"), dict):
        raise CtlError(f"the daemon's snapshot of thread {thread_id} has no thread; is it a different t3d version?")
    return page


async def last_turns(endpoint: Endpoint, token: str, thread_id: str) -> TurnsSeen:
    """The thread's last finished turn and its open turn: the last turn's page, and while
    that holds only open turns, the pages before it (at most OPEN_TURN_PAGES)."""
    page = await thread_page(endpoint, token, thread_id, turn_limit=1)
    seen = turns_seen(page.get("turns") or [])
    for _ in range(OPEN_TURN_PAGES):
        if seen.last is not None or page.get("before") is None:
            break
        page = await thread_page(endpoint, token, thread_id, turn_limit=1, before=int(page["before"]))
        older = turns_seen(page.get("turns") or [])
        seen = TurnsSeen(older.last, seen.open or older.open)
    return seen


async def last_turns_of(endpoint: Endpoint, token: str, thread_ids: Iterable[str]) -> dict[str, TurnsSeen]:
    """`last_turns` of each thread, TURN_READS_AT_ONCE at a time; a thread deleted meanwhile
    is left out."""
    found: dict[str, TurnsSeen] = {}
    limiter = trio.CapacityLimiter(TURN_READS_AT_ONCE)

    async def one(thread_id: str) -> None:
        async with limiter:
            try:
                found[thread_id] = await last_turns(endpoint, token, thread_id)
            except RpcError as exc:
                if exc.code != NOT_FOUND:
                    raise

    async with trio.open_nursery() as nursery:
        for thread_id in thread_ids:
            nursery.start_soon(one, thread_id)
    return found


def project_dir(given: str | None) -> tuple[str, bool]:
    """The project directory made absolute (not resolved: the daemon keys projects by path),
    and whether it is a directory."""
    path = os.path.abspath(os.path.expanduser(given or os.getcwd()))
    return path, os.path.isdir(path)
