"""Retention on a given database: ``python -m bench prune --db PATH``.

From a copy of ``--db`` (never changed), started as the daemon's own database with the
automatic pass a day away, it measures through the public API only (``db.*`` methods
over ``POST /api/dispatch``, jobs polled with ``db.job``):

- ``db.stats`` before (file size, events by kind);
- ``db.prune``: one retention pass with the default ages (everything in a generated
  database is older than them): superseded events deleted, every entity's newest event
  compacted (its payload dropped: its body is its row), incremental vacuum included; its
  time, and each phase's time on the writer (at ``--duty``, the daemon's
  ``--retention-duty``, the pass pauses (1 - duty) / duty times as long: 3 at 0.25);
- ``db.stats`` after, then ``db.vacuum --full`` (one VACUUM: what fragmentation the
  incremental vacuum leaves) and ``db.stats`` again, unless ``--no-full-vacuum``.

Sizes are of the database file (the WAL is truncated by each step). All results go to
``prune.json`` in ``--out``.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import trio

from bench.client import HttpClient
from bench.daemon import prepare_state, stop_daemon
from bench.startup import start_daemon_timed

POLL_S = 0.5


async def call(client: HttpClient, method: str, **params: Any) -> Any:
    reply = await client.request("POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']['message']}")
    return reply["result"]


async def run_job(client: HttpClient, method: str, **params: Any) -> dict[str, Any]:
    job = await call(client, method, **params)
    while job["state"] == "running":
        await trio.sleep(POLL_S)
        job = await call(client, "db.job", job_id=job["job_id"])
        print(f"\r[bench] {method}: {job['phase']} {job['done']:,}/{job['total']:,} {job['elapsed_s']:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    if job["state"] != "done":
        raise RuntimeError(f"{method} {job['state']}: {job['error']}")
    return job  # type: ignore[no-any-return]


def _sizes(stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "file_bytes": stats["file_bytes"],
        "wal_bytes": stats["wal_bytes"],
        "free_pages": stats["free_pages"],
        "events": stats["events"],
        "events_by_kind": {kind: v["total"] for kind, v in stats["events_by_kind"].items()},
    }


async def measure(db: Path, out: Path, full_vacuum: bool, duty: float) -> dict[str, Any]:
    state = prepare_state(out / "state", db)
    flags = ["--retention-interval", "1d", "--retention-duty", str(duty)]
    daemon, ready_s = await start_daemon_timed(state, out / "daemon.log", flags)
    client = HttpClient(daemon.port, daemon.token)
    try:
        result: dict[str, Any] = {"db": str(db), "start_s": ready_s, "duty": duty}
        result["before"] = _sizes(await call(client, "db.stats"))
        started = time.monotonic()
        prune = await run_job(client, "db.prune")
        result["prune"] = {"wall_s": time.monotonic() - started, **prune["result"]}
        result["after_prune"] = _sizes(await call(client, "db.stats"))
        if full_vacuum:
            vacuum = await run_job(client, "db.vacuum", full=True)
            result["full_vacuum"] = vacuum["result"]
            result["after_full_vacuum"] = _sizes(await call(client, "db.stats"))
        return result
    finally:
        await client.aclose()
        await stop_daemon(daemon)
        shutil.rmtree(state.root, ignore_errors=True)  # a copy of a database of gigabytes


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def command(args: Any) -> int:
    db = Path(args.db)
    if not db.is_file():
        print(f"prune: {db} is not a file; write one with python -m bench gen-db", file=sys.stderr)
        return 2
    out = Path(args.out or f"bench-out/prune-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = trio.run(measure, db, out, not args.no_full_vacuum, args.duty)
    (out / "prune.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    before, after = result["before"]["file_bytes"], result["after_prune"]["file_bytes"]
    prune = result["prune"]
    rows, compacted, compacted_bytes = prune["rows"], prune["compacted"], prune["compacted_bytes"]
    print(
        f"{db}: {_mib(before)}, {result['before']['events']:,} events; prune deleted "
        f"{rows.get('item snapshots', 0):,} item snapshots and {rows.get('thread-state events', 0):,} "
        f"thread-state events, compacted {compacted.get('item snapshots', 0):,} item snapshots and "
        f"{compacted.get('thread-state events', 0):,} thread-state events "
        f"({_mib(sum(compacted_bytes.values()))} of payload), in {prune['wall_s']:.0f} s "
        f"({prune['steps']:,} steps, duty {args.duty:g}): {_mib(after)} ({after / before:.0%}), {result['after_prune']['events']:,} events"
    )
    print("  on the writer: " + ", ".join(f"{phase} {s:.1f} s" for phase, s in prune["writer_s"].items()))
    if "full_vacuum" in result:
        full = result["after_full_vacuum"]["file_bytes"]
        print(f"after VACUUM ({result['full_vacuum']['elapsed_s']:.0f} s): {_mib(full)} ({full / before:.0%})")
    print(f"all figures: {out / 'prune.json'}")
    return 0
