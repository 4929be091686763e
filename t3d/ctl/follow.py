"""`t3d ctl attach THREAD` (follow it live) and `t3d ctl log THREAD` (print its history).

``attach`` subscribes to the thread and shows its open turn as it streams, then each
later turn (`ThreadFollower`); prompts are asked at the terminal (or answered by
``--approve``; without a terminal they are left for another client). Ctrl-C detaches:
nothing stops, and the exit status is 0. ``log`` reads the snapshot's pages backwards
with their ``before`` cursor until it has the turns asked for, and prints them oldest
first.
"""

from __future__ import annotations

import argparse
import time

import trio

from t3d.ctl.approver import Approver, watch_sigint
from t3d.ctl.client import (
    EXIT_FAILED,
    EXIT_OK,
    CtlError,
    Endpoint,
    JsonDict,
    RpcConnection,
    open_rpc,
    read_token,
)
from t3d.ctl.history import ThreadFollower, format_log, log_json_lines
from t3d.ctl.render import Rendered, one_line
from t3d.ctl.shell import fetch_shell, resolve_thread, thread_page
from t3d.ctl.terminal import err, out

# Turns asked for per page when `log` reads back through history.
LOG_PAGE_TURNS = 50
DEFAULT_LOG_TURNS = 10


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    attach = commands.add_parser(
        "attach",
        parents=[common],
        help="follow a thread live: its turns as they stream, prompts asked here; Ctrl-C detaches",
        description="Follow a thread live: its open turn's text and tool calls as they stream, then "
        "each later turn. Permission prompts are asked at the terminal (or answered by --approve; "
        "without a terminal they stay pending for another client). Ctrl-C detaches and stops nothing.",
    )
    attach.add_argument("thread", metavar="THREAD", help="the thread's id (or a unique prefix of it)")
    attach.add_argument(
        "--approve", choices=("all", "none"), help="answer its permission prompts automatically (default: ask at the terminal)"
    )
    attach.set_defaults(handler=_attach)
    log = commands.add_parser(
        "log",
        parents=[common],
        help="print a thread's history: each turn's prompt, what the agent did, how it ended",
    )
    log.add_argument("thread", metavar="THREAD", help="the thread's id (or a unique prefix of it)")
    log.add_argument(
        "--turns", metavar="N", type=_positive, default=DEFAULT_LOG_TURNS, help=f"its last N turns (default {DEFAULT_LOG_TURNS})"
    )
    log.add_argument("--all", action="store_true", help="every turn, from the first")
    log.set_defaults(handler=_log)


# -- attach ---------------------------------------------------------------------------


def _join_chunk(base: JsonDict | None, chunk: JsonDict) -> JsonDict:
    """Concatenate a snapshot's chunks: lists in order, other fields from the first."""
    joined = base if base is not None else {}
    for key, value in chunk.items():
        if isinstance(value, list):
            joined.setdefault(key, []).extend(value)
        else:
            joined.setdefault(key, value)
    return joined


class _Attach:
    def __init__(self, rpc: RpcConnection, follower: ThreadFollower, approve: str | None) -> None:
        self._rpc = rpc
        self._follower = follower
        self._approve = approve
        self._detached = False
        self._last_seq: int | None = None

    async def run(self) -> int:
        async with trio.open_nursery() as nursery:
            self._approver = Approver(
                self._rpc,
                nursery,
                mode=self._approve,
                to_stderr=self._follower.json_lines,
                command="attach",
                leave_without_terminal=True,
            )

            def detach() -> None:
                self._detached = True
                nursery.cancel_scope.cancel()

            await nursery.start(watch_sigint, detach)
            await self._stream()
            nursery.cancel_scope.cancel()
        if self._detached:
            self._emit(self._follower.finish())
            err(f"\ndetached; thread {self._follower.thread_id} goes on in the daemon\n")
            return EXIT_OK
        return EXIT_FAILED  # the thread was deleted

    async def _subscribe(self) -> str:
        params: JsonDict = {"thread_id": self._follower.thread_id, "turn_limit": 1}
        if self._last_seq is not None:
            params["after_sequence"] = self._last_seq  # replay the gap when it is small
        reply = await self._rpc.call("subscribe.thread", params)
        if not isinstance(reply, dict) or not reply.get("sub"):
            raise CtlError("the daemon's reply to subscribe.thread has no 'sub'; is it a different t3d version?")
        return str(reply["sub"])

    async def _stream(self) -> None:
        sub = await self._subscribe()
        base: JsonDict | None = None
        while not self._follower.gone:
            note = await self._rpc.receive_notification()
            kind, data, seq = note.get("kind"), note.get("data"), note.get("seq")
            if note.get("sub") is None and kind == "resync":
                # This client fell behind its own queue: subscribe again from where it was.
                await self._rpc.call("unsubscribe", {"sub": sub})
                sub, base = await self._subscribe(), None
                continue
            if note.get("sub") != sub:
                continue
            if isinstance(seq, int) and kind in ("event", "snapshot.end", "synced"):
                self._last_seq = seq
            if kind == "snapshot.chunk" and isinstance(data, dict):
                base = _join_chunk(base, data)
            elif kind == "snapshot.end":
                self._emit(self._follower.feed_thread((base or {}).get("thread")))  # its notes first
                self._emit(self._follower.feed_snapshot(base or {}, time.time()))
                base = None
            elif kind == "resync":
                base = None  # a fresh snapshot follows
            elif kind == "event" and isinstance(data, dict):
                self._emit(self._follower.feed_event(data, time.time()))

    def _emit(self, rendered: Rendered) -> None:
        out(rendered.out)
        err(rendered.err)
        for request_id in rendered.settled:
            self._approver.settle(request_id)
        for prompt in rendered.asks:
            self._approver.ask(prompt)


async def _attach(args: argparse.Namespace, endpoint: Endpoint) -> int:
    token = read_token(endpoint.token_path)
    thread_id = await resolve_thread(endpoint, token, args.thread)
    async with open_rpc(endpoint, token) as rpc:
        listed = await rpc.call("project.list", {})
        projects = listed.get("projects") if isinstance(listed, dict) else None
        dirs = {str(p.get("id")): str(p.get("path")) for p in projects or () if isinstance(p, dict)}
        follower = ThreadFollower(thread_id, json_lines=args.json, project_dirs=dirs)
        if not args.json:
            err(f"attached to thread {thread_id} (Ctrl-C detaches; the thread goes on)\n")
        return await _Attach(rpc, follower, args.approve).run()


# -- log ------------------------------------------------------------------------------


async def read_history(
    endpoint: Endpoint, token: str, thread_id: str, want: int | None, *, page_turns: int = LOG_PAGE_TURNS
) -> tuple[JsonDict, bool]:
    """The thread's last ``want`` turns (every one for None) with their items, and whether
    older turns were left out: pages of ``page_turns`` read backwards with their ``before``
    cursor."""
    page = await thread_page(endpoint, token, thread_id, turn_limit=min(want or page_turns, page_turns))
    history: JsonDict = {"thread": page["thread"], "turns": [], "items": [], "requests": page.get("requests") or []}
    while True:
        history["turns"][:0] = page.get("turns") or []
        history["items"][:0] = page.get("items") or []
        before = page.get("before")
        left = None if want is None else want - len(history["turns"])
        if before is None or (left is not None and left <= 0):
            break
        page = await thread_page(
            endpoint, token, thread_id, turn_limit=min(left or page_turns, page_turns), before=int(before)
        )
    turns = sorted(history["turns"], key=lambda t: t.get("ordinal") or 0)
    more = bool(turns) and (turns[0].get("ordinal") or 1) > 1
    if want is not None and len(turns) > want:
        turns, more = turns[-want:], True
    kept = {t.get("id") for t in turns}
    history["turns"] = turns
    history["items"] = [item for item in history["items"] if item.get("turn_id") in kept]
    return history, more


async def _log(args: argparse.Namespace, endpoint: Endpoint) -> int:
    token = read_token(endpoint.token_path)
    thread_id = await resolve_thread(endpoint, token, args.thread)
    history, more = await read_history(endpoint, token, thread_id, None if args.all else args.turns)
    if args.json:
        out(log_json_lines(history["turns"], history["items"]))
        return EXIT_OK
    thread: JsonDict = history["thread"]
    projects, _ = await fetch_shell(endpoint, token)
    paths = {str(p.get("id")): str(p.get("path")) for p in projects}
    cwd = thread.get("worktree_path") or paths.get(str(thread.get("project_id")))
    where = f"{cwd} ({thread['branch']})" if thread.get("branch") else cwd
    out(f"thread {thread_id}: {one_line(str(thread.get('title') or ''), 80)}\n{thread.get('provider')} in {where}\n\n")
    if not history["turns"]:
        err(f'thread {thread_id} has no turns yet; start one with `t3d ctl run --thread {thread_id} "..."`\n')
        return EXIT_OK
    if more:
        shown = len(history["turns"])
        out(f"(older turns left out; --turns {shown * 2} or --all shows more)\n\n")
    out(format_log(thread, history["turns"], history["items"], history["requests"], time.time(), cwd=cwd))
    return EXIT_OK
