"""Start-up time and read times on a given database: ``python -m bench startup --db PATH``.

Measured, from copies of ``--db`` (the copy is fresh in the page cache, so every figure
is a warm start):
- the daemon: from starting ``t3d serve`` to the first 200 from ``GET /api/health``
  (polled every 5 ms over fresh connections); the first start on a fresh copy (restart
  recovery closes what the database left open), then ``--runs`` restarts on that copy;
- over HTTP on the running daemon: ``GET /api/shell`` and ``GET /api/threads/{id}`` of
  the thread with the most items (its bounded snapshot: the last 10 turns), ``--reads``
  times each;
- in process (this part imports t3d): ``open_store`` alone on a fresh copy and again on
  that copy, then ``Store.shell()`` and ``Store.snapshot()`` of the same thread.
Each figure is reported as its median (all samples in the JSON written to ``--out``).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import trio

from bench.client import HttpClient, http_get_once
from bench.daemon import (
    RunningDaemon,
    StateDir,
    compile_bytecode,
    daemon_env,
    free_port,
    prepare_state,
    stop_daemon,
)
from bench.fixture import TURNS_NAME, fixture_path

READY_TIMEOUT_S = 120.0


async def start_daemon_timed(
    state: StateDir, log: Path, flags: list[str] | None = None
) -> tuple[RunningDaemon, float]:
    """Start ``t3d serve`` on ``state`` (with ``flags``); seconds until /api/health first
    answers 200."""
    port = free_port()
    compile_bytecode()  # timed as an installed daemon (bench/daemon.py)
    argv = [
        sys.executable,
        "-m",
        "t3d",
        "serve",
        "--state-dir",
        str(state.root),
        "--port",
        str(port),
        "--replay-fixture",
        str(fixture_path(TURNS_NAME)),
        "--log-level",
        "warning",
        *(flags or []),
    ]
    started = time.monotonic()
    with log.open("ab") as log_file:
        process = await trio.lowlevel.open_process(
            argv, stdout=log_file, stderr=subprocess.STDOUT, env=daemon_env(state, {})
        )
    daemon = RunningDaemon(process, port, "", state, log)
    while time.monotonic() - started < READY_TIMEOUT_S:
        if process.returncode is not None:
            raise RuntimeError(
                f"t3d serve exited with status {process.returncode} at start; see {log}"
            )
        try:
            status, _ = await http_get_once(port, "/api/health")
            if status == 200:
                ready = time.monotonic() - started
                daemon.token = state.token_path.read_text().strip()
                return daemon, ready
        except OSError:
            pass
        await trio.sleep(0.005)
    await stop_daemon(daemon)
    raise RuntimeError(
        f"t3d serve did not answer /api/health within {READY_TIMEOUT_S:g} s; see {log}"
    )


async def timed(times: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


async def http_reads(daemon: RunningDaemon, reads: int) -> dict[str, Any]:
    """Shell and largest-thread snapshot over HTTP on a running daemon."""
    client = HttpClient(daemon.port, daemon.token)
    try:
        shell = await client.request("GET", "/api/shell")
        largest = max(shell["threads"], key=lambda t: t.get("item_count") or 0)
        path = f"/api/threads/{largest['id']}"
        return {
            "threads": len(shell["threads"]),
            "largest_thread": {"id": largest["id"], "items": largest["item_count"]},
            "http_shell_s": await timed(reads, partial(client.request, "GET", "/api/shell")),
            "http_snapshot_s": await timed(reads, partial(client.request, "GET", path)),
        }
    finally:
        await client.aclose()


async def measure_daemon(db: Path, out: Path, runs: int, reads: int) -> dict[str, Any]:
    state = prepare_state(out / "state-daemon", db)
    log = out / "daemon.log"
    starts: list[float] = []
    figures: dict[str, Any] = {}
    for run in range(runs + 1):
        daemon, ready = await start_daemon_timed(state, log)
        starts.append(ready)
        try:
            if run == 0:
                figures.update(await http_reads(daemon, reads))
        finally:
            await stop_daemon(daemon)
    figures["first_start_s"] = starts[0]
    figures["restart_s"] = starts[1:]
    return figures


async def measure_store(db: Path, out: Path, reads: int) -> dict[str, Any]:
    from t3d.store.store import open_store

    def lost(error: BaseException | None) -> None:
        raise RuntimeError(f"the database writer was lost: {error!r}")

    state = prepare_state(out / "state-store", db)
    path = state.root / "t3d.sqlite"
    figures: dict[str, Any] = {"open_store_s": []}
    for again in (False, True):
        started = time.perf_counter()
        async with open_store(path, on_writer_lost=lost) as store:
            figures["open_store_s"].append(time.perf_counter() - started)
            if not again:
                shell = await store.shell()
                largest = max(shell["threads"], key=lambda t: t["item_count"])
                figures["store_shell_s"] = await timed(reads, store.shell)
                figures["store_snapshot_s"] = await timed(
                    reads, partial(store.snapshot, largest["id"])
                )
    return figures


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:,.1f} ms"


def command(args: Any) -> int:
    db = Path(args.db)
    if not db.is_file():
        print(
            f"startup: {db} is not a file; write one with python -m bench gen-db", file=sys.stderr
        )
        return 2
    out = Path(args.out or f"bench-out/startup-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    daemon = trio.run(measure_daemon, db, out, args.runs, args.reads)
    store = trio.run(measure_store, db, out, args.reads)
    result = {"db": str(db), "db_bytes": db.stat().st_size, "daemon": daemon, "store": store}
    (out / "startup.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(
        f"{db} ({db.stat().st_size / 2**20:,.0f} MiB, {daemon['threads']:,} threads, "
        f"largest thread {daemon['largest_thread']['items']:,} items)"
    )
    print(
        f"daemon start to /api/health 200: first {daemon['first_start_s'] * 1000:,.0f} ms, restart {_ms(daemon['restart_s'])} (median of {args.runs})"
    )
    print(
        f"open_store: first {store['open_store_s'][0] * 1000:,.1f} ms, again {store['open_store_s'][1] * 1000:,.1f} ms"
    )
    print(
        f"shell read: HTTP {_ms(daemon['http_shell_s'])}, Store.shell {_ms(store['store_shell_s'])} (median of {args.reads})"
    )
    print(
        f"bounded snapshot of the largest thread: HTTP {_ms(daemon['http_snapshot_s'])}, Store.snapshot {_ms(store['store_snapshot_s'])}"
    )
    print(f"all samples: {out / 'startup.json'}")
    return 0
