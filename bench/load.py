"""The load process: ``python -m bench.load CONFIG.json`` drives a running daemon.

It runs apart from the daemon and from the coordinator (``bench.runner``) and talks to the
daemon only through the public API. Protocol with the coordinator: after set-up (the project,
one thread and one connection per session) it prints one JSON line on stdout,
``{"ready": true, "t0": <monotonic>}``; the warm-up starts at ``t0``. When the window ends
(for a burst: when every turn is done or the timeout passes) it writes its records to the
config's ``results`` path and exits 0. Any other exit is a harness failure.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from bench import actors, slow
from bench.client import RpcConnection, open_rpc
from bench.profiles import PROFILES, Profile, start_offsets

SETUP_PARALLEL = 32
BURST_TIMEOUT_S = 120.0
BURST_LEAD_S = 0.5


@attrs.frozen
class LoadConfig:
    port: int
    token: str
    project: str
    profile: str
    sessions: int
    warmup_s: float
    window_s: float
    turn_s: float  # the fixture's own mean turn, to spread the sessions' first turns
    results: str
    # Never-reading clients to add (bench/slow.py); None: neither they nor the probes run.
    slow_clients: int | None = None
    # The daemon is restarted during the run: sessions and subscribers connect again.
    reconnect: bool = False
    # The approval pollers: "http" (GET /api/requests/pending and the shell every poll_s)
    # or "mcp" (a long-poll on /mcp's wait_for_request for the bot's own threads).
    pollers: str = "http"
    # Each session's provider (replay, replay-codex); None: every session replays Claude.
    providers: list[str] | None = None


async def run_load(config: LoadConfig) -> dict[str, Any]:
    profile = PROFILES[config.profile]
    errors = actors.Errors()
    answer_in_session = profile.sessions_per_poller == 0
    async with open_rpc(config.port, config.token) as rpc:
        project_id = (await rpc.call("project.create", path=config.project, title="bench"))[
            "project_id"
        ]
        probe_thread = None
        if config.slow_clients is not None:  # a thread of the rename probe's own
            created = await rpc.call("thread.create", project_id=project_id, provider="replay", title="probe")
            probe_thread = created["thread_id"]
    providers = config.providers or ["replay"] * config.sessions
    sessions = [
        actors.Session(
            i, actors.Window(0, 0, 0), errors, answer_prompts=answer_in_session, reconnect=config.reconnect,
            provider=providers[i],
        )
        for i in range(config.sessions)
    ]
    async with trio.open_nursery() as nursery:
        limiter = trio.Semaphore(SETUP_PARALLEL)

        async def open_one(session: actors.Session) -> RpcConnection:
            async with limiter:
                return await nursery.start(session.open, config.port, config.token, project_id)  # type: ignore[no-any-return]

        connections: list[RpcConnection | None] = [None] * len(sessions)

        async def open_at(i: int) -> None:
            connections[i] = await open_one(sessions[i])

        async with trio.open_nursery() as setup:
            for i in range(len(sessions)):
                setup.start_soon(open_at, i)
        t0 = time.monotonic() + 0.2
        window = actors.Window(t0, t0 + config.warmup_s, t0 + config.warmup_s + config.window_s)
        for session in sessions:
            session.window = window
        print(orjson.dumps({"ready": True, "t0": t0}).decode(), flush=True)
        if profile.burst:
            result = await _burst(sessions, connections, window)
        else:
            result = await _steady(config, profile, sessions, connections, window, errors, probe_thread)
        nursery.cancel_scope.cancel()
    result.update(
        t0=t0,
        window=[window.start, window.end],
        threads=[s.thread_id for s in sessions],
        turns=[attrs.astuple(t) for s in sessions for t in s.turns],
        turn_fields=[f.name for f in attrs.fields(actors.TurnRecord)],
        sessions_with_output=sum(1 for s in sessions if s.outputs_in_window > 0),
        session_resyncs=sum(s.resyncs for s in sessions),
        session_reconnects=sum(s.reconnects for s in sessions),
        broken_sessions=sum(1 for s in sessions if s.broken),
        errors={"counts": dict(errors.counts), "first": errors.first},
    )
    return result


async def _steady(
    config: LoadConfig, profile: Profile, sessions: list[actors.Session],
    connections: list[Any], window: actors.Window, errors: actors.Errors, probe_thread: str | None,
) -> dict[str, Any]:  # fmt: skip
    threads = [s.thread_id for s in sessions]
    slow_stats, rename_stats, switch_stats = slow.SlowStats(), slow.ProbeStats(), actors.SubscriberStats()
    n = len(sessions)
    subscribers = [actors.SubscriberStats() for _ in range(profile.subscribers(n))]
    pollers = [actors.PollerStats() for _ in range(profile.pollers(n))]
    snapshot = actors.SnapshotStats()
    lag: list[float] = []
    offsets = start_offsets(n, profile.think_s, config.turn_s, config.warmup_s)
    with trio.move_on_at(actors.trio_deadline(window.end)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actors.run_lag_monitor, window, lag)
            for i, session in enumerate(sessions):
                nursery.start_soon(
                    session.run, connections[i], window.t0 + offsets[i], profile.think_s
                )
            per = profile.sessions_per_subscriber
            for j, stats in enumerate(subscribers):
                phase = profile.switch_s * (j + 0.5) / max(1, len(subscribers))
                nursery.start_soon(
                    actors.run_subscriber,
                    config.port,
                    config.token,
                    threads,
                    j * per,
                    profile.switch_s,
                    phase,
                    window,
                    stats,
                    errors,
                    config.reconnect,
                )
            for j, pstats in enumerate(pollers):
                mine = frozenset(
                    threads[j * profile.sessions_per_poller : (j + 1) * profile.sessions_per_poller]
                )
                phase = profile.poll_s * j / max(1, len(pollers))
                if config.pollers == "mcp":
                    nursery.start_soon(
                        actors.run_mcp_poller, config.port, config.token, mine, phase, window, pstats, errors
                    )
                else:
                    nursery.start_soon(
                        actors.run_poller,
                        config.port,
                        config.token,
                        mine,
                        profile.poll_s,
                        phase,
                        window,
                        pstats,
                        errors,
                    )
            if probe_thread is not None:
                every = [*threads, probe_thread]
                for _ in range(config.slow_clients or 0):
                    nursery.start_soon(slow.run_slow_client, config.port, config.token, every, slow_stats, errors)
                nursery.start_soon(slow.run_rename_probe, config.port, config.token, probe_thread, window, rename_stats, errors)
                nursery.start_soon(slow.run_switch_probe, config.port, config.token, threads, window, switch_stats, errors)
            if profile.snapshot_poll_s:
                nursery.start_soon(
                    actors.run_snapshot_poller,
                    config.port,
                    config.token,
                    profile.snapshot_poll_s,
                    window,
                    snapshot,
                    errors,
                )
    return {
        "subscribers": {
            "count": len(subscribers),
            "events": sum(s.events for s in subscribers),
            "resyncs": sum(s.resyncs for s in subscribers),
            "switches": sum(s.switches for s in subscribers),
            "subscribe_ms": [x for s in subscribers for x in s.subscribe_ms],
            "first_chunk_ms": [x for s in subscribers for x in s.first_chunk_ms],
        },
        "slow": None if probe_thread is None else {
            "clients": config.slow_clients,
            "connects": slow_stats.connects,
            "subscriptions": slow_stats.subscriptions,
            "renames": rename_stats.renames,
            "event_delay_ms": rename_stats.delays_ms,
            "switches": switch_stats.switches,
            "first_chunk_ms": switch_stats.first_chunk_ms,
        },
        "pollers": {
            "kind": config.pollers,
            "count": len(pollers),
            "polls": sum(p.polls for p in pollers),
            "calls": sum(p.calls for p in pollers),
            "approvals": sum(p.approvals for p in pollers),
            "pending_ms": [x for p in pollers for x in p.pending_ms],
            "shell_ms": [x for p in pollers for x in p.shell_ms],
            "seen_ms": [x for p in pollers for x in p.seen_ms],
            "answered_ms": [x for p in pollers for x in p.answered_ms],
        },
        "snapshot": {
            "polls": snapshot.polls,
            "snapshot_ms": snapshot.snapshot_ms,
            "largest_items": snapshot.largest_items,
        },
        "driver_lag_ms": lag,
    }


async def _burst(
    sessions: list[actors.Session], connections: list[Any], window: actors.Window
) -> dict[str, Any]:
    """Every thread starts one turn at the same moment; wait until all are done."""
    lag: list[float] = []
    # The burst moment is t0 + warm-up (the coordinator places its memory window there).
    with trio.move_on_after(BURST_TIMEOUT_S + BURST_LEAD_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                actors.run_lag_monitor,
                actors.Window(window.t0, window.t0, window.t0 + BURST_TIMEOUT_S),
                lag,
            )
            async with trio.open_nursery() as turns:
                for i, session in enumerate(sessions):
                    turns.start_soon(_one_burst_turn, session, connections[i], window.start)
            nursery.cancel_scope.cancel()
    return {"burst_at": window.start, "driver_lag_ms": lag}


async def _one_burst_turn(session: actors.Session, rpc: Any, at: float) -> None:
    await actors.sleep_until(at)
    session.window = actors.Window(at, at, at + BURST_TIMEOUT_S)
    await session.turn(rpc)


def main(argv: list[str]) -> int:
    raw = orjson.loads(Path(argv[0]).read_bytes())
    config = LoadConfig(**raw)
    result = trio.run(run_load, config)
    Path(config.results).write_bytes(orjson.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
