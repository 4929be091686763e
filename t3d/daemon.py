"""`run_daemon`: the supervision tree (docs/architecture.md, The supervision tree), read top-down.

Start order is the order below: the store (without recovery), the spawner, the
sessions, then restart recovery with the spawner's word on which agents are still
alive (`t3d/restart.py`), and only then effects and the API. Shutdown runs it
backwards: the API stops taking requests, effects stop, provider sessions are
stopped or detached (bounded; `DaemonControl.stop_agents`), and the store lets every
job already sent commit before it closes. A lost database writer cancels everything
and surfaces as `WriterLostError` (the CLI exits with status 1 so systemd restarts
the daemon); its agents are left running like at any stop that does not stop them.

Before all of it the state dir's lock is taken (`hold_state_dir`: one daemon per state
dir); once the API serves, ``daemon.json`` is written and, under systemd, READY=1 sent.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import trio

from t3d.admission.service import Admission
from t3d.api.app import ApiApp
from t3d.api.auth import load_or_create_token
from t3d.api.db_methods import DbJobs, DbMethods
from t3d.api.git_methods import GitMethods
from t3d.api.methods import Methods
from t3d.api.transport import TransportStats, serve_api_transport
from t3d.config import Settings
from t3d.domain.events import CaptureCheckpoint, Effect
from t3d.effects import EffectQueue, run_effects
from t3d.errors import WriterLostError
from t3d.gc_tuning import GcPauses
from t3d.git.service import Checkpoints
from t3d.git.workspaces import WorkspaceStatuses
from t3d.health import health_report
from t3d.live.hub import Hub
from t3d.loop_monitor import LoopMonitor
from t3d.observe.metrics import Observer, Sources
from t3d.observe.tally import CommitTally
from t3d.pressure.sampler import PressureSampler, run_pressure_sampler
from t3d.restart import recover_after_restart
from t3d.service.notify import Notifier, NotifyTarget, run_notify
from t3d.service.runfile import RunFile, started_at_now
from t3d.service.statedir import HeldStateDir, hold_state_dir
from t3d.sessions import open_sessions
from t3d.spawn.sidecar import open_spawner
from t3d.store.pruner import Pruner, run_pruner
from t3d.store.retention_plan import Policy
from t3d.store.store import open_store

log = logging.getLogger("t3d")

# server.shutdown replies first; the daemon starts stopping this long after.
SHUTDOWN_REPLY_GRACE_S = 0.2


@attrs.frozen
class DaemonInfo:
    url: str
    port: int
    token_path: str
    # A new one-time sign-in link to the web page, each call (t3d/api/web_page.py).
    sign_in_link: Callable[[], str] | None = attrs.field(default=None, eq=False)


@attrs.define
class DaemonControl:
    """How this daemon stops, decided while it runs (by `t3d serve`'s signal handling and by
    API calls that ask for a shutdown)."""

    # At shutdown, stop every agent too; otherwise (the default) agents keep running under
    # the spawner for the next daemon on this state dir to reattach, for at most
    # ``agent_reattach_window`` seconds (agents the daemon started itself, with
    # T3D_PROCESS_SPAWNER=off, always stop with it).
    stop_agents: bool = False


async def run_daemon(
    settings: Settings,
    *,
    control: DaemonControl | None = None,
    notify: NotifyTarget | None = None,
    task_status: trio.TaskStatus[DaemonInfo] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until cancelled (or asked to stop over the API). The state dir's lock
    is held first (another daemon there: ServiceError); ``notify``: tell systemd."""
    async with hold_state_dir(settings.state_dir, settings.db_path) as state:
        await _run_daemon(settings, control or DaemonControl(), notify, state, task_status=task_status)


async def _run_daemon(
    settings: Settings,
    control: DaemonControl,
    notify: NotifyTarget | None,
    state: HeldStateDir,
    *,
    task_status: trio.TaskStatus[DaemonInfo],
) -> None:
    started = time.monotonic()
    token, token_path = await trio.to_thread.run_sync(load_or_create_token, settings.state_dir)
    lost: list[BaseException | None] = []

    with trio.CancelScope() as daemon_scope, GcPauses().installed() as gc_pauses:

        def on_writer_lost(error: BaseException | None) -> None:
            log.critical("the database writer is gone; exiting so the service restarts")
            lost.append(error)
            daemon_scope.cancel()

        async with open_store(
            settings.db_path,
            readers=settings.sqlite_reader_pool,
            batching=settings.provider_commit_batching,
            commit_interval_s=settings.provider_commit_interval_ms / 1000,
            synchronous=settings.sqlite_synchronous,
            busy_timeout_ms=settings.sqlite_busy_timeout_ms,
            on_writer_lost=on_writer_lost,
            recover=False,
        ) as store:
            hub = Hub(encode_once=settings.live_encode_once)
            effects = EffectQueue()
            statuses: WorkspaceStatuses | None = None
            if settings.workspace_status == "on":
                statuses = WorkspaceStatuses(
                    store,
                    publish=hub.publish_workspace,
                    watchers=hub.watchers,
                    interval=settings.workspace_status_interval,
                    pull_requests=settings.pull_requests == "on",
                    files_follow_checkpoints=settings.checkpoints == "on",
                    forge_workers=settings.spawner_forge_pool or 4,
                )
                hub.workspaces = statuses
                store.on_commit(statuses.on_commit)  # before the hub: rows carry the new directory's status
            store.on_commit(hub.publish)
            store.on_commit(effects.on_commit)
            pruner = Pruner(
                store,
                Policy(
                    item_age_s=settings.retention_item_snapshots_age,
                    state_age_s=settings.retention_state_events_age,
                    duty=settings.retention_duty,
                ),
            )
            store.on_commit(pruner.on_commit)
            tally = CommitTally()  # counts and turn/agent log lines (t3d/observe/tally.py)
            store.on_commit(tally.on_commit)
            monitor = LoopMonitor(stall_threshold_s=settings.loop_stall_threshold)
            transport = TransportStats()
            bound: list[int] = [settings.port]

            # Read at shutdown. A reattach window of 0 means agents go with their daemon.
            stop_agents = lambda: control.stop_agents or settings.agent_reattach_window == 0  # noqa: E731
            async with (
                open_spawner(settings, stop_agents) as spawner,
                open_sessions(store, spawner, settings, stop_at_exit=stop_agents) as sessions,
                trio.open_nursery() as nursery,
            ):
                await recover_after_restart(store, spawner, sessions)

                pressure = PressureSampler(settings.psi_root, settings.pressure_interval, sessions.agents)
                checkpoints = Checkpoints(
                    nursery, store, spawner, settings.state_dir, saturated=lambda: admission.gate.saturated
                )
                if settings.checkpoints == "on":
                    sessions.before_turn = checkpoints.ensure_baseline
                if statuses is not None:
                    checkpoints.on_tree = statuses.files_seen

                async def route_effect(effect: Effect) -> None:
                    """Checkpoint captures to the git driver, everything else to the sessions."""
                    if isinstance(effect, CaptureCheckpoint):
                        if settings.checkpoints == "on":
                            await checkpoints.dispatch(effect)
                        else:
                            await store.finish_effect(effect)
                    else:
                        await sessions.dispatch(effect)

                admission = Admission(
                    store,
                    monitor,
                    route_effect,
                    mark_ms=settings.effect_admission_delay_ms if settings.loop_monitor == "on" else 0,
                    max_active=settings.max_active_turns,
                    pressure=pressure if settings.pressure_admission == "on" else None,
                )
                store.on_commit(admission.on_commit)
                observer = Observer(
                    Sources(store, monitor, admission, sessions, hub, spawner, pressure, transport, gc_pauses,
                            websockets=lambda: app.live_statistics(), checkpoints=checkpoints.statistics,
                            retention=pruner.statistics),
                    tally,
                )  # fmt: skip

                def health() -> dict[str, Any]:
                    lag = monitor.statistics()
                    stats = store.statistics()
                    report = health_report(
                        version=_version(),
                        uptime_s=time.monotonic() - started,
                        loop_lag_ms={"last": lag.last_ms, "p50": lag.p50_ms, "p99": lag.p99_ms, "max": lag.max_ms},
                        writer_queue=stats.writer_queue,
                        writer_oldest_job_s=stats.writer_oldest_job_s,
                        readers_busy=stats.readers_busy,
                        database_unavailable=stats.unavailable_headline,
                        database_unavailable_detail=stats.unavailable,
                        database_unavailable_s=stats.unavailable_s,
                        writes_held=stats.writes_held,
                        writes_failed_unavailable=stats.writes_failed_unavailable,
                        admission=admission.statistics(),
                        sessions=sessions.count,
                        connections=transport.statistics().open_connections,
                        spawner=attrs.asdict(spawner.statistics()),
                    )
                    report["checkpoints"] = checkpoints.statistics()
                    report["retention"] = pruner.statistics()
                    report["workspace_status"] = statuses.statistics() if statuses is not None else None
                    report["gc"] = gc_pauses.statistics()
                    report["live"] = app.live_statistics()
                    report["memory_pressure"] = memory = pressure.statistics()
                    if memory["level"] == "severe":
                        report["reasons"].append("memory pressure is severe: agents are stalled on memory")
                        report["status"] = "degraded" if report["status"] == "ok" else report["status"]
                    return report

                if settings.loop_monitor == "on":
                    await nursery.start(monitor.run)
                await nursery.start(admission.run)
                await nursery.start(run_pressure_sampler, pressure)
                await nursery.start(run_effects, store, effects, admission.dispatch)
                await nursery.start(observer.spawner.run)
                if statuses is not None:
                    await nursery.start(statuses.run, spawner)

                def request_shutdown(stop_agents: bool) -> dict[str, Any]:
                    """server.shutdown: reply, then stop as SIGTERM would (``stop_agents``: as Ctrl-C)."""
                    control.stop_agents = control.stop_agents or stop_agents
                    log.info(
                        "shutting down as asked over the API (%s)",
                        "stopping every agent" if control.stop_agents else "agents keep running for the next daemon",
                    )

                    async def stop_soon() -> None:
                        await trio.sleep(SHUTDOWN_REPLY_GRACE_S)
                        daemon_scope.cancel()

                    nursery.start_soon(stop_soon)
                    return {"stopping": True, "pid": os.getpid(), "stop_agents": control.stop_agents}

                await nursery.start(
                    partial(run_pruner, pruner, interval_s=settings.retention_interval, enabled=settings.retention == "on")
                )
                app = ApiApp(
                    Methods(
                        store,
                        force_stop=sessions.force_stop,
                        git=GitMethods(store, checkpoints, settings.state_dir, statuses=statuses),
                        shutdown=request_shutdown,
                        db=DbMethods(store, pruner, DbJobs(nursery)),
                        agents=observer.agents,
                    ),
                    hub,
                    token,
                    health=health,
                    spawner=spawner,
                    bound=lambda: (settings.host, bound[0]),
                    pressure=pressure,
                    metrics=observer.exposition,
                    metrics_open=settings.metrics_open,
                )
                observer.watch_waiters(app.methods.waiters)
                port = await nursery.start(partial(serve_api_transport, stats=transport), app, settings.host, settings.port)
                bound[0] = port
                url = attrs.evolve(settings, port=port).url
                run = RunFile(os.getpid(), url, settings.host, port, _version(), started_at_now(), str(token_path))
                await trio.to_thread.run_sync(state.publish, run)
                if notify is not None:
                    await nursery.start(run_notify, Notifier(notify), lambda: _status_line(url, sessions.count, admission))
                log.info(
                    "t3d %s serving on %s (token in %s)", _version(), url, token_path,
                    extra={"event": "serving", "url": url, "token_path": str(token_path)},
                )  # fmt: skip
                task_status.started(DaemonInfo(url, port, str(token_path), app.web.sign_in_url))
    if lost:
        raise WriterLostError("the database writer thread died") from lost[0]


def _status_line(url: str, sessions: int, admission: Admission) -> str:
    """What systemd shows as the daemon's status."""
    running = admission.statistics()["active_turns"]
    return f"serving on {url}; {sessions} session{'s' * (sessions != 1)}, {running} turn{'s' * (running != 1)} running"


def _version() -> str:
    import t3d

    return t3d.__version__
