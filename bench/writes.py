"""``python -m bench writes``: provider write batching on vs off, on the real store.

A persistence benchmark in the shape of seed 001's: independent producers
("streams", one per provider session) write item updates on a fresh SQLite
file through a `WritePipeline`, as a session does (at most 64 in flight; a
turn's end waits for the updates before it). Producers send on absolute schedules (phase offsets and a
little jitter), so slower processing never lowers the offered rate. Setup is
outside the timing. Configurations A (batching on) and B (off) alternate,
A B A B, each repetition on a new database.

Figures per run: elapsed (first send to last commit), CPU seconds of this
process (the loop, the writer thread and the readers), publication latency
(send to the commit's publication on the loop) p50/p95, transactions of
updates (a turn's end commits on its own and is not counted), and whether
every update was stored.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from t3d.domain import commands as c
from t3d.domain.model import TurnItem
from t3d.providers.pipeline import WritePipeline
from t3d.store.commit import Committed
from t3d.store.store import Store, open_store


@attrs.frozen
class Workload:
    name: str
    streams: int
    updates: int  # per stream
    interval_s: float  # between one stream's sends; 0 = as fast as it can
    controls_every: int = 0  # a turn end and a new turn after this many updates (0 = none)
    # A burst is many items (tool calls, their output) of ~200 bytes each; a paced stream
    # is one message whose text grows, as streamed text does.
    burst: bool = False


WORKLOADS = (
    Workload("single paced stream", 1, 60, 0.010),
    Workload("ten paced streams", 10, 60, 0.010),
    Workload("hundred paced streams", 100, 12, 0.050),
    Workload("1,000-update burst, 100 streams x 10", 100, 10, 0.0, burst=True),
    Workload("1,000-update burst, 1 stream", 1, 1000, 0.0, burst=True),
    Workload("ten streams with controls", 10, 60, 0.010, controls_every=10),
)


def _lost(error: BaseException | None) -> None:
    raise SystemExit(f"the writer thread died: {error!r}")


async def _prepare(store: Store, streams: int) -> None:
    await store.execute(c.CreateProject("p", "/bench"))
    for n in range(streams):
        await store.execute(c.CreateThread(f"t{n}", "p", "replay"))
        await store.execute(c.StartTurn(f"t{n}", f"t{n}-u0", "go"))
        await store.execute(c.MarkTurnRunning(f"t{n}-u0"))


async def _produce(store: Store, w: Workload, n: int, t0: float, sent: dict[tuple[str, int], float], rng: random.Random) -> None:
    """One session's writes, through a `WritePipeline` as a session makes them."""
    pipeline = WritePipeline(store.send, store.record, _rejected)
    turn, text = f"t{n}-u0", ""
    offset = w.interval_s * n / max(1, w.streams)
    for k in range(w.updates):
        due = t0 + offset + k * w.interval_s + rng.uniform(0, w.interval_s / 10)
        if due > trio.current_time():  # a deadline already past costs trio a cancellation
            await trio.sleep_until(due)
        if w.burst:
            text = f"{k:05d} " + "lorem ipsum dolor sit amet " * 7
            item = TurnItem(f"{turn}-i{k}", f"t{n}", turn, 0, "command", "completed", "ls", text, None, 0.0)
        else:
            text += "lorem ipsum dolor sit amet " * 4
            item = TurnItem(f"{turn}-i", f"t{n}", turn, 0, "assistant_message", "streaming", None, text, None, 0.0)
        sent[(item.id, len(text))] = trio.current_time()
        await pipeline.write(c.RecordItems(turn, (item,)))
        if w.controls_every and (k + 1) % w.controls_every == 0:
            await pipeline.write(c.FinishTurn(turn, "completed"))
            turn, text = f"t{n}-u{k + 1}", ""
            await store.execute(c.StartTurn(f"t{n}", turn, "go"))
            await pipeline.write(c.MarkTurnRunning(turn))
    await pipeline.drain()


def _rejected(command: c.Command, error: Exception) -> None:
    raise SystemExit(f"the store rejected {type(command).__name__}: {error}")


async def run_one(w: Workload, *, batching: bool, seed: int, synchronous: str = "full") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="t3d-bench-writes-") as tmp:
        db = Path(tmp) / "db"
        async with open_store(db, batching=batching, synchronous=synchronous, on_writer_lost=_lost) as store:
            await _prepare(store, w.streams)
            sent: dict[tuple[str, int], float] = {}
            latencies: list[float] = []

            def published(done: Committed) -> None:
                now = trio.current_time()
                for event in done.events:
                    text = getattr(event.entity, "text", None)
                    at = sent.pop((event.entity.id, len(text)), None) if text is not None else None
                    if at is not None:
                        latencies.append(now - at)

            store.on_commit(published)
            rng = random.Random(seed)
            batches0 = store.statistics().writer_batches_done
            cpu0, t0 = time.process_time(), trio.current_time()
            async with trio.open_nursery() as nursery:
                for n in range(w.streams):
                    nursery.start_soon(_produce, store, w, n, t0, sent, rng)
            elapsed, cpu = trio.current_time() - t0, time.process_time() - cpu0
            stats = store.statistics()
            stored = await store.read(_count_updates, lambda n: n)
    latencies.sort()
    return {
        "elapsed_ms": elapsed * 1000,
        "cpu_ms": cpu * 1000,
        "publication_p50_ms": latencies[len(latencies) // 2] * 1000,
        "publication_p95_ms": latencies[int(len(latencies) * 0.95)] * 1000,
        "transactions": stats.writer_batches_done - batches0,
        "largest_batch": stats.writer_largest_batch,
        "updates": w.streams * w.updates,
        "published": len(latencies),
        "stored": stored,
    }


def _count_updates(conn: Any) -> int:
    return int(conn.execute("SELECT count(*) FROM events WHERE kind = 'item.updated' AND entity_id GLOB '*-i*'").get)


FIGURES = ("elapsed_ms", "cpu_ms", "publication_p95_ms", "transactions")


async def run_all(workloads: tuple[Workload, ...], reps: int, synchronous: str) -> list[dict[str, Any]]:
    rows = []
    for w in workloads:
        runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for rep in range(reps):
            for batching in (True, False):  # A B A B
                result = await run_one(w, batching=batching, seed=rep, synchronous=synchronous)
                if not result["stored"] == result["published"] == result["updates"]:
                    raise SystemExit(f"{w.name}: {result['stored']} stored, {result['published']} published of {result['updates']} updates")
                runs[batching].append(result)
        row: dict[str, Any] = {"workload": w.name}
        for figure in FIGURES:
            row[f"{figure} on"] = statistics.median(r[figure] for r in runs[True])
            row[f"{figure} off"] = statistics.median(r[figure] for r in runs[False])
        rows.append(row)
        print(_format_row(row), flush=True)
    return rows


def _format_row(row: dict[str, Any]) -> str:
    cells = [row["workload"]]
    for figure in FIGURES:
        on, off = row[f"{figure} on"], row[f"{figure} off"]
        cells.append(f"{off:,.1f} → {on:,.1f}" + (f" (x{on / off:.2f})" if off else ""))
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench writes", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per configuration (default 5)")
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full", help="the SQLite synchronous level of both (default full, as the daemon)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        raise SystemExit("--reps must be at least 1")
    print(f"medians of {args.reps} runs each, synchronous={args.synchronous}; batching off → on (xN = on / off)")
    print("| workload | " + " | ".join(FIGURES) + " |")
    print("| --- " * (len(FIGURES) + 1) + "|")
    trio.run(run_all, WORKLOADS, args.reps, args.synchronous)
    return 0
