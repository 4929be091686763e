"""`Observer`: the daemon's figures for ``GET /metrics``, the stall record and ``server.agents``.

Theory of operation. Everything ``/metrics`` says is read at scrape time from what the
daemon already holds in memory (the statistics `/api/health` is built from, and the
histograms and counters kept here), so a scrape never touches the store and costs one
pass over a few hundred numbers on the loop (``t3d_metrics_scrape_seconds`` says how
long each took). What is counted as it happens is kept cheaply:

- per committed event, by `CommitTally.on_commit` (t3d/observe/tally.py);
- per loop-lag sample (every 10 ms), one histogram observation;
- per writer transaction, its jobs' latencies and its own time (`Store.time_writes`);
- per garbage collection, its pause (`GcPauses.on_pause`).

The spawner's pools live in the sidecar, so their figures are fetched from it
(`Spawner.describe`) every `SPAWNER_POLL_S` while someone scrapes (not at all once
nobody has for `SPAWNER_IDLE_S`) and the scrape serves the last answer; the first scrape
waits for one answer at most `SPAWNER_FIRST_WAIT_S`.

The exposition is the Prometheus text format 0.0.4 (t3d/observe/exposition.py, by hand,
so that a scrape costs a fraction of a millisecond), with the usual ``process_*``
figures read from /proc/self (``process_resident_memory_bytes``,
``process_cpu_seconds_total``, open fds...).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import trio

import t3d
from t3d.errors import SpawnerError
from t3d.gc_tuning import frozen_objects
from t3d.observe import agents as agent_procs
from t3d.observe import exposition as x
from t3d.observe.histogram import Histogram, Histograms
from t3d.observe.tally import CommitTally
from t3d.pressure.core import LEVELS

if TYPE_CHECKING:  # what it reads, by type only: nothing here imports the API or the sessions
    from t3d.admission.service import Admission
    from t3d.api.transport import TransportStats
    from t3d.gc_tuning import GcPauses
    from t3d.live.hub import Hub
    from t3d.live.waiters import RequestWaiters
    from t3d.loop_monitor import LoopMonitor
    from t3d.pressure.sampler import PressureSampler
    from t3d.sessions import Sessions
    from t3d.spawn.child import Spawner
    from t3d.store.store import Store

SPAWNER_POLL_S = 5.0
SPAWNER_IDLE_S = 120.0
SPAWNER_FIRST_WAIT_S = 1.0
SPAWNER_ASK_S = 2.0

LAG_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WRITER_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_JOBS = (1, 2, 4, 8, 16, 32, 64)
GC_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
SCRAPE_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
# Runtime requests: fine from 5 to 200 ms (the approval goal is 50 ms), coarse beyond.
REQUEST_SECONDS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1,
    0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
WAIT_VIAS = ("mcp", "rpc")


@attrs.define
class Sources:
    """What the observer reads; each is the daemon's own object (nothing is copied)."""

    store: Store
    monitor: LoopMonitor
    admission: Admission
    sessions: Sessions
    hub: Hub
    spawner: Spawner
    pressure: PressureSampler
    transport: TransportStats
    gc_pauses: GcPauses
    # What the open WebSocket connections hold (ApiApp.live_statistics); set once the app exists.
    websockets: Callable[[], dict[str, int]] = lambda: {}
    checkpoints: Callable[[], dict[str, Any]] = lambda: {}
    retention: Callable[[], dict[str, Any]] = lambda: {}  # Pruner.statistics


class SpawnerWatch:
    """The spawner's last `describe` answer, refreshed while someone scrapes."""

    def __init__(self, spawner: Spawner) -> None:
        self._spawner = spawner
        self.value: dict[str, Any] | None = None
        self.at = 0.0  # trio.current_time() of the answer
        self.problem: str | None = None
        self._wanted_at = -SPAWNER_IDLE_S
        self._wanted = trio.Event()
        self._answered = trio.Event()

    def want(self) -> None:
        self._wanted_at = trio.current_time()
        self._wanted.set()

    async def first_answer(self) -> None:
        """Wait (bounded) for an answer if there has never been one."""
        self.want()
        with trio.move_on_after(SPAWNER_FIRST_WAIT_S):
            await self._answered.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wanted.wait()
            while trio.current_time() - self._wanted_at < SPAWNER_IDLE_S:
                await self._ask()
                await trio.sleep(SPAWNER_POLL_S)
            self._wanted = trio.Event()

    async def _ask(self) -> None:
        with trio.move_on_after(SPAWNER_ASK_S):
            try:
                self.value, self.at, self.problem = await self._spawner.describe(), trio.current_time(), None
            except SpawnerError as exc:
                self.problem = str(exc)
        self._answered.set()


class Observer:
    def __init__(self, sources: Sources, tally: CommitTally) -> None:
        self.sources = sources
        self.tally = tally
        self.started = time.monotonic()
        self.loop_lag = Histogram(LAG_SECONDS)
        self.writer_jobs = Histogram(WRITER_SECONDS)
        self.writer_transactions = Histogram(WRITER_SECONDS)
        self.batch_jobs = Histogram(BATCH_JOBS)
        self.gc_pauses = Histograms(GC_SECONDS, max_series=3)
        for generation in range(3):  # every series from the first scrape on
            self.gc_pauses.series[(str(generation),)] = Histogram(GC_SECONDS)
        self.scrapes = Histogram(SCRAPE_SECONDS)
        self.request_commits = Histogram(REQUEST_SECONDS)
        self.wait_replies = Histograms(REQUEST_SECONDS, max_series=len(WAIT_VIAS))
        for via in WAIT_VIAS:
            self.wait_replies.series[(via,)] = Histogram(REQUEST_SECONDS)
        self.spawner = SpawnerWatch(sources.spawner)
        sources.monitor.on_sample(self._on_lag_sample)
        sources.monitor.describe_stall = self.describe_stall
        sources.store.time_writes(self._on_writes)
        sources.gc_pauses.on_pause.append(self._on_gc)
        self._boot = agent_procs.boot_time()  # read once: the process start time is after it

    # --- counted as it happens --------------------------------------------------------------

    def _on_lag_sample(self, now: float) -> None:
        self.loop_lag.observe(self.sources.monitor.latest_lag_s)

    def _on_writes(self, job_seconds: list[float], transaction_seconds: float) -> None:
        for seconds in job_seconds:
            self.writer_jobs.observe(seconds)
        self.writer_transactions.observe(transaction_seconds)
        self.batch_jobs.observe(len(job_seconds))

    def _on_gc(self, generation: int, seconds: float) -> None:
        self.gc_pauses.observe((str(generation),), seconds)

    def watch_waiters(self, waiters: RequestWaiters) -> None:
        """Time the runtime requests the long-poll registry sees (t3d/live/waiters.py)."""
        waiters.on_committed = self.request_commits.observe
        waiters.on_replied = self._on_wait_reply

    def _on_wait_reply(self, via: str, seconds: float) -> None:
        self.wait_replies.observe((via,), seconds)

    # --- served ---------------------------------------------------------------------------

    async def exposition(self) -> bytes:
        """The ``/metrics`` body (Prometheus text format 0.0.4, t3d/observe/exposition.py)."""
        if self.spawner.value is None:
            await self.spawner.first_answer()
        else:
            self.spawner.want()
        started = time.perf_counter()
        body = x.render(self.collect())
        self.scrapes.observe(time.perf_counter() - started)
        return body

    def collect(self) -> Iterator[x.Family]:
        s = self.sources
        yield x.gauge("t3d_info", "this daemon's version", 1, (("version", t3d.__version__),))
        yield x.gauge("t3d_uptime_seconds", "seconds since the daemon started", time.monotonic() - self.started)
        yield from self._process()
        yield from self._loop(s)
        yield from self._store(s)
        yield from self._turns(s)
        yield from self._live(s)
        yield from self._spawner(s)
        yield from self._gc(s)
        yield x.histogram("t3d_metrics_scrape_seconds", "time to build the /metrics body (the scrapes before this one)", self.scrapes)

    def _process(self) -> Iterator[x.Family]:
        own = agent_procs.own_process()
        if own is None:
            return
        yield x.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", own.rss_bytes)
        yield x.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", own.virtual_bytes)
        yield x.counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", own.cpu_s)
        yield x.gauge("process_open_fds", "Number of open file descriptors.", own.open_fds)
        yield x.gauge("process_max_fds", "Maximum number of open file descriptors.", own.max_fds)
        if self._boot is not None:
            started = self._boot + own.start_ticks / agent_procs.CLOCK_TICKS
            yield x.gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", started)

    def _loop(self, s: Sources) -> Iterator[x.Family]:
        yield x.histogram("t3d_loop_lag_seconds", "how late the event loop woke, per 10 ms sample (100 ms while idle)", self.loop_lag)
        yield x.counter("t3d_loop_stalls_total", "loop stalls at or over --loop-stall-threshold (each one logged)", s.monitor.stalls)
        state = s.admission.statistics()["state"]
        gate = x.gauge("t3d_admission_gate", "the admission gate's state (1 for the current one)")
        for name in ("open", "saturated", "off"):
            gate.sample(int(state == name), (("state", name),))
        yield gate
        closed = s.admission.gate.closed_seconds(trio.current_time())
        yield x.counter("t3d_admission_closed_seconds_total", "seconds the gate has been saturated (closed to new turn starts)", closed)
        yield x.counter("t3d_admission_transitions_total", "times the gate closed or opened", s.admission.gate.transitions)
        held: dict[str, int] = {"loop_saturated": 0, "max_active_turns": 0, "memory_pressure": 0}
        for reason in s.admission.queue.held.values():
            held[reason] = held.get(reason, 0) + 1
        queued = x.gauge("t3d_turns_queued", "turns held back as queued by admission, by reason")
        for reason, count in held.items():
            queued.sample(count, (("reason", reason),))
        yield queued
        pressure = s.pressure.statistics()
        level = x.gauge("t3d_memory_pressure", "the memory-pressure level (1 for the current one; none while nothing samples it)")
        for name in LEVELS:
            level.sample(int(pressure["level"] == name), (("level", name),))
        yield level
        yield x.gauge("t3d_memory_pressure_sampling", "1 while the memory-pressure sampler runs", int(bool(pressure["sampling"])))

    def _store(self, s: Sources) -> Iterator[x.Family]:
        stats = s.store.statistics()
        yield x.gauge("t3d_writer_queue_jobs", "jobs sent to the database writer and not yet done", stats.writer_queue)
        yield x.gauge("t3d_writer_oldest_job_seconds", "how long the writer's oldest unfinished job has waited", stats.writer_oldest_job_s)
        yield x.counter("t3d_writer_jobs_total", "writer jobs done", self.writer_jobs.count)
        yield x.counter("t3d_writer_transactions_total", "writer transactions (a batch of provider updates is one)", self.writer_transactions.count)
        yield x.histogram("t3d_writer_job_seconds", "commit latency: a job's time from submission to its outcome on the loop", self.writer_jobs)
        yield x.histogram("t3d_writer_transaction_seconds", "the writer thread's time per transaction", self.writer_transactions)
        yield x.histogram("t3d_writer_batch_jobs", "jobs per writer transaction", self.batch_jobs)
        yield x.counter("t3d_wal_checkpoints_total", "WAL checkpoints the checkpointer thread ran (off the writer)", stats.wal_checkpoints)
        yield x.counter("t3d_wal_checkpoint_seconds_total", "the checkpointer thread's time in WAL checkpoints", stats.wal_checkpoint_s)
        yield x.counter("t3d_wal_checkpoint_failures_total", "WAL checkpoints that failed (the WAL grows until one succeeds)", stats.wal_checkpoint_failures)
        yield x.counter("t3d_wal_checkpoints_on_writer_total", "WAL checkpoints a commit ran on the writer: while they are quick (10 ms at most), or at the WAL's bound with the checkpointer behind or stopped", stats.wal_checkpoints_on_writer)
        yield x.counter("t3d_wal_checkpoint_on_writer_seconds_total", "commits' time in WAL checkpoints on the writer", stats.wal_checkpoint_on_writer_s)
        yield x.histogram("t3d_request_commit_seconds", "runtime requests opened: from the request's created_at (its command handed to the writer) to its commit applied on the loop", self.request_commits)
        replies = x.histogram("t3d_request_wait_reply_seconds", "per runtime request a requests.wait reply carries: from the request's commit applied on the loop to the reply built for the transport, by transport (mcp: /mcp wait_for_request; rpc: JSON-RPC and HTTP)")
        for (via,), h in sorted(self.wait_replies.series.items()):
            replies.histogram(h, (("via", via),))
        yield replies
        yield x.gauge("t3d_database_unavailable", "1 while the database cannot take writes (a full disk, another process's lock)", int(stats.unavailable is not None))
        yield x.gauge("t3d_database_unavailable_seconds", "how long the database has been unable to take writes (0 when it can)", stats.unavailable_s)
        yield x.gauge("t3d_writes_held", "provider updates held until the database takes writes again", stats.writes_held)
        yield x.counter("t3d_writes_failed_unavailable_total", "writes failed because the database could not take them", stats.writes_failed_unavailable)
        yield x.gauge("t3d_readers_busy", "SQLite reader threads busy", stats.readers_busy)
        waiting = x.gauge("t3d_reads_waiting", "reads waiting for a reader thread, by class")
        for name, count in (("small", stats.reads_waiting_small), ("page", stats.reads_waiting_page), ("history", stats.reads_waiting_history)):
            waiting.sample(count, (("class", name),))
        yield waiting
        events = x.counter("t3d_events_committed_total", "events committed, by kind")
        for kind, count in sorted(self.tally.events.items()):
            events.sample(count, (("kind", kind),))
        yield events

    def _turns(self, s: Sources) -> Iterator[x.Family]:
        tally = self.tally
        started = x.counter("t3d_turns_started_total", "turns that reached their provider, by provider")
        for provider, count in sorted(tally.turns_started.items()):
            started.sample(count, (("provider", provider),))
        yield started
        finished = x.counter("t3d_turns_finished_total", "turns that ended, by provider and outcome")
        for (provider, outcome), count in sorted(tally.turns_finished.items()):
            finished.sample(count, (("provider", provider), ("outcome", outcome)))
        yield finished
        durations = x.histogram("t3d_turn_duration_seconds", "finished turns' time from start to end, by provider and outcome")
        for (provider, outcome), h in sorted(tally.turn_seconds.series.items()):
            durations.histogram(h, (("provider", provider), ("outcome", outcome)))
        yield durations
        active = x.gauge("t3d_turns_active", "turns starting, running or waiting on a request, by status")
        for status, count in tally.active_by_status().items():
            active.sample(count, (("status", status),))
        yield active
        yield x.gauge("t3d_sessions", "live provider sessions (a thread with an agent, or one starting)", s.sessions.count)
        agents: dict[str, int] = {"starting": 0, "running": 0, "waiting": 0, "idle": 0}
        for agent in s.sessions.agents():
            turn = tally.active.get(agent.thread_id)
            status = "idle" if turn is None else turn.status
            agents[status] = agents.get(status, 0) + 1
        family = x.gauge("t3d_agents", "provider processes alive, by what their thread's turn is doing")
        for status, count in agents.items():
            family.sample(count, (("status", status),))
        yield family

    def _live(self, s: Sources) -> Iterator[x.Family]:
        hub = s.hub.statistics()
        subscriptions = x.gauge("t3d_live_subscriptions", "live subscriptions, by topic")
        subscriptions.sample(hub.thread_subscriptions, (("topic", "thread"),)).sample(hub.shell_subscriptions, (("topic", "shell"),))
        yield subscriptions
        yield x.gauge("t3d_live_buffered_frames", "frames buffered for subscribers", hub.buffered_frames)
        yield x.gauge("t3d_live_buffered_bytes", "bytes buffered for subscribers", hub.buffered_bytes)
        yield x.counter("t3d_live_resyncs_total", "subscriptions resynced (their buffer overflowed, or their connection's budget was full)", hub.resyncs)
        yield x.counter("t3d_live_events_published_total", "committed events the hub fanned out", hub.published)
        ws = s.websockets()
        yield x.gauge("t3d_websocket_connections", "open WebSocket connections", ws.get("websockets", 0))
        yield x.gauge("t3d_websocket_held_bytes", "bytes WebSocket connections hold until sent (bases, replies)", ws.get("held_bytes", 0))
        yield x.gauge("t3d_websocket_budget_bytes", "what the open connections' budgets allow in all", ws.get("budget_bytes", 0))
        transport = s.transport.statistics()
        yield x.gauge("t3d_http_connections", "open TCP connections (HTTP and WebSocket)", transport.open_connections)
        yield x.counter("t3d_http_connections_accepted_total", "connections accepted", transport.accepted_total)
        yield x.counter("t3d_http_connections_refused_total", "connections turned away at the connection limit", transport.refused_total)

    def _spawner(self, s: Sources) -> Iterator[x.Family]:
        stats = s.spawner.statistics()
        yield x.gauge("t3d_spawner_info", "how processes are started (mode sidecar or direct)", 1, (("mode", stats.mode),))
        yield x.gauge("t3d_spawner_connected", "1 while the spawner sidecar is connected (0 in direct mode)", int(stats.connected))
        yield x.counter("t3d_spawner_restarts_total", "times the spawner sidecar was restarted", stats.restarts)
        detail = self.spawner.value or {}
        pools = sorted((detail.get("pools") or {}).items())
        age = trio.current_time() - self.spawner.at if self.spawner.value is not None else math.nan
        yield x.gauge("t3d_spawner_stats_age_seconds", "age of the pool figures (the spawner is asked every 5 s while /metrics is scraped)", age)
        for name, field, help_text in (
            ("t3d_spawner_pool_slots", "size", "slots of each process pool"),
            ("t3d_spawner_pool_busy", "busy", "commands running in each pool (pool git: git processes running now)"),
            ("t3d_spawner_pool_queued", "queued", "commands waiting for a slot, per pool"),
        ):
            family = x.gauge(name, help_text)
            for pool, figures in pools:
                family.sample(figures.get(field, 0), (("pool", pool),))
            yield family
        commands = x.counter("t3d_spawner_pool_commands_total", "commands the spawner ran to completion, per pool (since the spawner started)")
        waits = x.gauge("t3d_spawner_pool_wait_seconds", "waits for a pool slot: p50 and p99 of each pool's last 1,024 commands, and the longest ever (stat max)")
        for pool, figures in pools:
            if "completed" in figures:
                commands.sample(figures["completed"], (("pool", pool),))
            wait = figures.get("wait_ms") or {}
            for stat in ("p50", "p99", "max"):
                if stat in wait:
                    waits.sample(wait[stat] / 1000, (("pool", pool), ("stat", stat)))
        yield commands
        yield waits
        if "children" in detail:
            yield x.gauge("t3d_spawner_children", "long-lived children of the spawner (agents)", detail["children"])
        if "rss_kib" in detail:
            yield x.gauge("t3d_spawner_resident_memory_bytes", "the spawner sidecar's RSS", detail["rss_kib"] * 1024)
        checkpoints = s.checkpoints()
        if checkpoints:
            yield x.counter("t3d_git_commands_total", "git commands the daemon ran (checkpoints, worktrees, diffs)", checkpoints.get("git_processes", 0))
            yield x.counter("t3d_checkpoints_captured_total", "checkpoints captured", checkpoints.get("captured", 0))
            yield x.counter("t3d_checkpoints_failed_total", "checkpoint captures that failed", checkpoints.get("failed", 0))
            yield x.gauge("t3d_checkpoints_pending", "checkpoint captures waiting or running", checkpoints.get("pending", 0))
        retention = s.retention()
        if retention:
            yield x.gauge("t3d_retention_running", "1 while a retention pass runs", int(bool(retention["running"])))
            yield x.counter("t3d_retention_passes_total", "retention passes finished", retention["passes"])
            yield x.counter("t3d_retention_steps_total", "retention steps run (each one short writer transaction)", retention["steps"])
            yield x.counter("t3d_retention_events_deleted_total", "superseded events (and deleted threads' events) retention deleted", retention["deleted"])
            yield x.counter("t3d_retention_events_compacted_total", "events retention compacted (payload dropped: the row holds it)", retention["compacted"])

    def _gc(self, s: Sources) -> Iterator[x.Family]:
        pauses = s.gc_pauses
        collections = x.counter("t3d_gc_collections_total", "garbage collections, by generation")
        longest = x.gauge("t3d_gc_pause_max_seconds", "the longest garbage-collection pause so far, by generation")
        pending = x.gauge(
            "t3d_gc_pending_allocations",
            "gc.get_count(): allocations (generation 0) or younger collections (1, 2) since the generation's last collection",
        )  # fmt: skip
        for generation, count in enumerate(gc.get_count()):
            labels = (("generation", str(generation)),)
            collections.sample(pauses.count[generation], labels)
            longest.sample(pauses.max_s[generation], labels)
            pending.sample(count, labels)
        yield collections
        paused = x.histogram("t3d_gc_pause_seconds", "garbage-collection pauses (the loop and every thread wait), by generation")
        for (name,), h in sorted(self.gc_pauses.series.items()):
            paused.histogram(h, (("generation", name),))
        yield paused
        yield longest
        yield pending
        yield x.gauge("t3d_gc_frozen_objects", "objects frozen at start-up (never scanned)", frozen_objects())

    # --- the stall record -------------------------------------------------------------------

    def describe_stall(self) -> tuple[str, dict[str, Any]]:
        """RSS, GC state and the writer queue right after a stall: (text, fields)."""
        rss = agent_procs.own_rss_bytes()
        pauses = self.sources.gc_pauses
        last = pauses.last
        gc_fields: dict[str, Any] = {"collections": list(pauses.count), "pending_allocations": list(gc.get_count())}
        gc_text = "GC collections " + "/".join(map(str, pauses.count))
        if last is not None:
            generation, took, ended = last
            ago = max(0.0, time.monotonic() - ended)
            gc_fields.update(last_generation=generation, last_pause_ms=round(took * 1000, 1), last_ended_s_ago=round(ago, 3))
            gc_text += f", last gen {generation} paused {took * 1000:.0f} ms, {ago:.2f} s ago"
        stats = self.sources.store.statistics()
        writer = {"queue": stats.writer_queue, "oldest_job_s": round(stats.writer_oldest_job_s, 3)}
        fields = {
            "rss_bytes": rss, "gc": gc_fields, "writer": writer,
            "allocated_blocks": sys.getallocatedblocks(), "threads": threading.active_count(),
        }  # fmt: skip
        rss_text = "RSS unknown" if rss is None else f"RSS {rss / 2**20:.0f} MiB"
        text = f"; {rss_text}; {gc_text}; writer queue {writer['queue']} (oldest job {writer['oldest_job_s']:.2f} s)"
        return text, fields

    # --- server.agents ---------------------------------------------------------------------

    async def agents(self) -> dict[str, Any]:
        """Every live agent with its thread's turn and its process group's RSS and CPU, and
        the daemon's own (read from /proc in a worker thread)."""
        live = self.sources.sessions.agents()
        usage = await trio.to_thread.run_sync(agent_procs.read_groups, [a.pid for a in live])
        own = await trio.to_thread.run_sync(agent_procs.read_process, os.getpid())
        now = time.time()
        rows = []
        for agent in live:
            row = {"thread_id": agent.thread_id, "pid": agent.pid, "scope": agent.scope, **self.tally.describe_thread(agent.thread_id)}
            started = row["turn_started_at"]
            row["turn_s"] = None if started is None else round(max(0.0, now - started), 3)
            group = usage.get(agent.pid)
            row.update(
                processes=0 if group is None else group.processes,
                rss_bytes=None if group is None else group.rss_bytes,
                cpu_s=None if group is None else round(group.cpu_s, 3),
            )  # fmt: skip
            rows.append(row)
        rows.sort(key=lambda r: (r["status"] == "idle", r["thread_id"]))
        return {
            "at": now,
            "agents": rows,
            "daemon": {
                "pid": os.getpid(),
                "rss_bytes": None if own is None else own.rss_bytes,
                "cpu_s": None if own is None else round(own.cpu_s, 3),
            },
        }
