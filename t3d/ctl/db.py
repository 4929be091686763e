"""`t3d ctl db stats|prune|vacuum|check|backup`: the database, through the running daemon.

Each long operation is a job on the daemon (t3d/api/db_methods.py): the command starts
it, polls ``db.job`` every `POLL_S` and, once the job has run for a second, draws its
progress on stderr (a bar, or a spinner when SQLite cannot tell how far it is) if stderr
is a terminal. Ctrl-C cancels the job (``db.cancel``; a full VACUUM cannot be stopped
and runs on). The result is printed as text, or as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import orjson
import trio

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
from t3d.ctl.db_render import (
    format_backup,
    format_check,
    format_prune,
    format_stats,
    format_vacuum,
    progress_line,
)
from t3d.ctl.terminal import err, out

POLL_S = 0.2
SHOW_AFTER_S = 1.0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    db = commands.add_parser(
        "db",
        parents=[common],
        help="the database: stats, prune, vacuum, check, backup",
        description="Look after the daemon's database while it runs (README: Data lifecycle).",
    )
    sub = db.add_subparsers(dest="db_command", metavar="COMMAND", required=True)
    stats = sub.add_parser("stats", parents=[common], help="size, free pages, events by kind and age, largest threads")
    stats.set_defaults(handler=_stats)
    prune = sub.add_parser("prune", parents=[common], help="delete superseded events now, with the configured ages")
    prune.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    prune.set_defaults(handler=_job("db.prune", lambda a: {"dry_run": a.dry_run}, format_prune))
    vacuum = sub.add_parser("vacuum", parents=[common], help="hand free pages back to the file system")
    vacuum.add_argument(
        "--full",
        action="store_true",
        help="rewrite the whole file (VACUUM): the most space back, but every write waits until it ends "
        "(a database from before incremental auto-vacuum always gets this, once)",
    )
    vacuum.set_defaults(handler=_job("db.vacuum", lambda a: {"full": a.full}, format_vacuum))
    check = sub.add_parser("check", parents=[common], help="integrity_check, foreign keys and the projections' invariants")
    check.set_defaults(handler=_job("db.check", lambda a: {}, format_check))
    backup = sub.add_parser("backup", parents=[common], help="an online, consistent copy of the database to FILE")
    backup.add_argument("file", metavar="FILE", help="the new file to write (never overwritten)")
    backup.set_defaults(handler=_job("db.backup", lambda a: {"path": os.path.abspath(a.file)}, format_backup))


async def _stats(args: argparse.Namespace, endpoint: Endpoint) -> int:
    async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
        stats = await rpc.call("db.stats")
    out(_json(stats) if args.json else format_stats(stats))
    return EXIT_OK


def _job(
    method: str, params: Callable[[argparse.Namespace], JsonDict], render: Callable[[JsonDict], str]
) -> Callable[[argparse.Namespace, Endpoint], Any]:
    async def handler(args: argparse.Namespace, endpoint: Endpoint) -> int:
        async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
            job = await rpc.call(method, params(args))
            job = await follow(rpc, job, show=not args.json and sys.stderr.isatty())
        if job["state"] != "done":
            raise CtlError(f"{method} {job['state']}: {job.get('error') or 'stopped before its end'}", EXIT_FAILED)
        result = job["result"]
        out(_json(result) if args.json else render(result))
        return EXIT_OK if result.get("ok", True) else EXIT_FAILED

    return handler


async def follow(rpc: RpcConnection, job: JsonDict, *, show: bool) -> JsonDict:
    """Poll the job until it ends, drawing its progress; Ctrl-C cancels it."""
    tick = 0
    drawn = False
    try:
        while job["state"] == "running":
            if show and float(job.get("elapsed_s") or 0) >= SHOW_AFTER_S:
                err("\r" + progress_line(job, tick) + "\x1b[K")
                drawn = True
            tick += 1
            await trio.sleep(POLL_S)
            job = await rpc.call("db.job", {"job_id": job["job_id"]})
    except KeyboardInterrupt:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await rpc.call("db.cancel", {"job_id": job["job_id"]})
            err(f"\ncancelled job {job['job_id']}\n")
        raise
    finally:
        if drawn:
            err("\r\x1b[K")
    return job


def _json(value: Any) -> str:
    return orjson.dumps(value).decode() + "\n"
