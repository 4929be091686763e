"""`t3d ctl requests|approve|deny`: see the permission prompts agents wait on, and answer them.

``requests`` lists what is pending (``GET /api/requests/pending``); with ``--wait`` it
long-polls (``GET /api/requests/wait``) until at least one is, so a script can block on
the next prompt. ``approve`` and ``deny`` answer one by id through ``request.respond``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import orjson

from t3d.ctl.client import (
    EXIT_OK,
    CtlError,
    Endpoint,
    JsonDict,
    RpcError,
    http_get_json,
    new_command_id,
    open_rpc,
    read_token,
)
from t3d.ctl.render import format_duration, one_line, summarize_input
from t3d.ctl.shell import resolve_thread
from t3d.ctl.terminal import out

# Each long-poll of --wait; below the client's own HTTP deadline (client.HTTP_TIMEOUT_S).
WAIT_S = 25
NOT_FOUND, CONFLICT = -32001, -32002


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    listing = commands.add_parser("requests", parents=[common], help="list the permission prompts agents wait on")
    listing.add_argument("--wait", action="store_true", help="if none is pending, wait until one is")
    listing.add_argument("--thread", metavar="THREAD", help="only this thread's requests (its id or a unique prefix of it)")
    listing.set_defaults(handler=_requests)
    approve = commands.add_parser("approve", parents=[common], help="allow a pending request")
    approve.add_argument("request", metavar="REQUEST", help="the request's id (t3d ctl requests lists them)")
    approve.add_argument("--session", action="store_true", help="Codex: allow the same for the rest of its session too (Claude Code: a plain allow)")
    approve.set_defaults(handler=_approve)
    deny = commands.add_parser("deny", parents=[common], help="deny a pending request")
    deny.add_argument("request", metavar="REQUEST", help="the request's id (t3d ctl requests lists them)")
    deny.add_argument("--message", metavar="M", help="what the agent is told")
    deny.set_defaults(handler=_deny)


async def _requests(args: argparse.Namespace, endpoint: Endpoint) -> int:
    token = read_token(endpoint.token_path)
    query = {"thread_id": await resolve_thread(endpoint, token, args.thread)} if args.thread else {}
    if args.wait:
        cursor = 0
        while True:  # after=0: whatever is pending comes back at once
            reply = await http_get_json(endpoint, "/api/requests/wait?" + urlencode({**query, "after": cursor, "timeout": WAIT_S}), token=token)
            requests, cursor = _requests_of(endpoint, reply), reply.get("cursor", cursor)
            if requests:
                break
    else:
        reply = await http_get_json(endpoint, "/api/requests/pending" + ("?" + urlencode(query) if query else ""), token=token)
        requests = _requests_of(endpoint, reply)
    if args.json:
        out(orjson.dumps(requests).decode() + "\n")
    else:
        out(format_requests_table(requests, now=time.time(), cwd=os.getcwd()))
    return EXIT_OK


def _requests_of(endpoint: Endpoint, reply: Any) -> list[JsonDict]:
    if not isinstance(reply, dict) or not isinstance(reply.get("requests"), list):
        raise CtlError(f"the daemon at {endpoint.url} answered without a list of requests; is it a different t3d version than this client?")
    return [r for r in reply["requests"] if isinstance(r, dict)]


async def _approve(args: argparse.Namespace, endpoint: Endpoint) -> int:
    decision = "allow_session" if args.session else "allow"
    return await _respond(args, endpoint, decision, None, "allowed for the session" if args.session else "allowed")


async def _deny(args: argparse.Namespace, endpoint: Endpoint) -> int:
    return await _respond(args, endpoint, "deny", args.message, "denied")


async def _respond(args: argparse.Namespace, endpoint: Endpoint, decision: str, message: str | None, done: str) -> int:
    params: JsonDict = {"request_id": args.request, "decision": decision, "command_id": new_command_id()}
    if message:
        params["message"] = message
    async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
        try:
            result = await rpc.call("request.respond", params)
        except RpcError as exc:
            if exc.code in (NOT_FOUND, CONFLICT):
                raise CtlError(f"request {args.request}: {exc.rpc_message}; `t3d ctl requests` lists the pending ones", exc.exit_code) from None
            raise
    if args.json:
        out(orjson.dumps(result).decode() + "\n")
    else:
        out(f"request {args.request} {done}\n")
    return EXIT_OK


def format_requests_table(requests: Sequence[Mapping[str, Any]], *, now: float, cwd: str | None = None) -> str:
    """`t3d ctl requests`: one aligned row per pending request, oldest first; paths under
    ``cwd`` are shown relative to it. Pure."""
    if not requests:
        return "no pending requests; `t3d ctl requests --wait` waits for the next one\n"
    rows = [("REQUEST", "THREAD", "AGE", "ASKS")]
    for request in requests:
        data = request.get("data") if isinstance(request.get("data"), Mapping) else {}
        assert isinstance(data, Mapping)
        tool = data.get("tool_name") or request.get("kind") or "?"
        target = summarize_input(data.get("input"), cwd=cwd, limit=80)
        created = request.get("created_at")
        age = format_duration(now - created) if isinstance(created, int | float) else "?"
        rows.append((str(request.get("id", "?")), str(request.get("thread_id", "?")), age, one_line(f"{tool} {target}".strip(), 100)))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = ["  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[3]]).rstrip() for row in rows]
    return "\n".join(lines) + "\n"
