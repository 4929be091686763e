"""The ``t3d`` command: ``serve`` runs the daemon, ``ctl`` administers it, ``service``
installs it as systemd user units.

Exit status of ``serve``: 0 after a clean stop (SIGTERM, Ctrl-C, ``t3d ctl shutdown``),
1 when the daemon had to stop or could not start (the database writer died, the port is
taken, another daemon holds the state dir, the database cannot take writes at start:
systemd restarts it), 2 for bad settings or
usage (systemd does not restart it: ``RestartPreventExitStatus=2``).

Signals: SIGTERM stops the daemon and leaves the agents running for the next daemon on
the state dir; SIGINT from a terminal (Ctrl-C) stops the agents too. A SIGINT with no
terminal on stdin counts as SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import trio

import t3d
from t3d.api.auth import exposure_warning
from t3d.config import Settings, environment_help, load_settings
from t3d.errors import ConfigError, ServiceError, T3dError
from t3d.gc_tuning import tune_gc
from t3d.malloc_tuning import tune_malloc
from t3d.observe.logs import configure_logging
from t3d.service.notify import NotifyTarget, notify_target
from t3d.startup_checks import check_settings

# What systemd gives the daemon for notifications; not passed on to the processes it starts.
NOTIFY_ENVIRONMENT = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

SERVE_FLAGS = (
    ("--state-dir", "state_dir", "where the database and token live (T3D_STATE_DIR; default $XDG_STATE_HOME/t3d or ~/.local/state/t3d)"),
    ("--host", "host", "address to listen on (T3D_HOST; default 127.0.0.1)"),
    ("--port", "port", "port to listen on, 0 = any free port (T3D_PORT; default 3774)"),
    ("--sqlite-reader-pool", "sqlite_reader_pool", "SQLite reader threads, 1-32 (T3D_SQLITE_READER_POOL; default 4)"),
    ("--claude-bin", "claude_bin", "the claude CLI for the claude provider (T3D_CLAUDE_BIN; default claude)"),
    ("--codex-bin", "codex_bin", "the codex CLI for the codex provider, run as `codex app-server` (T3D_CODEX_BIN; default codex)"),
    ("--codex-retry-timeout", "codex_retry_timeout", "seconds a Codex turn may only retry (reconnecting) before t3d stops it and fails it with Codex's message, 0 = as long as Codex retries, at most 3600 (T3D_CODEX_RETRY_TIMEOUT; default 60)"),
    ("--replay-fixture", "replay_fixture", "transcript for the replay provider (T3D_REPLAY_FIXTURE; default: the bundled multi-turn one)"),
    ("--replay-codex-fixture", "replay_codex_fixture", "transcript for the replay-codex provider (T3D_REPLAY_CODEX_FIXTURE; default: the bundled multi-turn Codex one)"),
    ("--replay-speed", "replay_speed", "replay timing scale, 0 = no delays (T3D_REPLAY_SPEED; default 1)"),
    ("--interrupt-timeout", "interrupt_timeout", "seconds before an unanswered interrupt stops the provider (T3D_INTERRUPT_TIMEOUT; default 10)"),
    ("--provider-idle-timeout", "provider_idle_timeout", "seconds an idle provider process is kept before it is stopped, 0 = forever; the next turn resumes it (T3D_PROVIDER_IDLE_TIMEOUT; default 1800)"),
    ("--process-spawner", "process_spawner", "auto, required or off: start processes through the spawner sidecar (auto falls back to the daemon with a warning; off always uses the daemon) (T3D_PROCESS_SPAWNER; default auto)"),
    ("--spawner-git-pool", "spawner_git_pool", "git commands run at once, 1-256 (T3D_SPAWNER_GIT_POOL; default max(8, min(32, cpus // 4)))"),
    ("--spawner-forge-pool", "spawner_forge_pool", "gh/glab/tea commands run at once, 1-64 (T3D_SPAWNER_FORGE_POOL; default 4)"),
    ("--effect-admission-delay-ms", "effect_admission_delay_ms", "loop-lag p99 mark in ms at which new turn starts are held back, 0 = off, else 30-60000 (T3D_EFFECT_ADMISSION_DELAY_MS; default 40)"),
    ("--max-active-turns", "max_active_turns", "turns running at once, 0 = no cap; more wait as queued in FIFO order (T3D_MAX_ACTIVE_TURNS; default 0)"),
    ("--loop-monitor", "loop_monitor", "on or off: sample loop lag every 10 ms (off only to measure its cost; the gate then stays open) (T3D_LOOP_MONITOR; default on)"),
    ("--checkpoints", "checkpoints", "on or off: a git checkpoint of the thread's files before and after every turn (off only to measure their cost) (T3D_CHECKPOINTS; default on)"),
    ("--workspace-status", "workspace_status", "on or off: keep every thread's workspace status (branch, upstream, ahead/behind, changed files) and push it to subscribers (off only to measure its cost) (T3D_WORKSPACE_STATUS; default on)"),
    ("--workspace-status-interval", "workspace_status_interval", "seconds between looks at the files watched workspaces depend on, 0.1-60 (T3D_WORKSPACE_STATUS_INTERVAL; default 2)"),
    ("--pull-requests", "pull_requests", "on or off: show the pull request of a branch on GitHub, GitLab or Gitea, asked of gh, glab or tea at most every 30 s while watched (T3D_PULL_REQUESTS; default on)"),
    ("--live-encode-once", "live_encode_once", "true or false: project and encode each live event once for all subscribers and share fresh snapshots per wave (false only to measure against) (T3D_LIVE_ENCODE_ONCE; default true)"),
    ("--provider-commit-interval-ms", "provider_commit_interval_ms", "0-1000: under load, a transaction of provider updates commits at most this often, each update applied as it arrives and a client's command committing it at once; an update after a quiet spell commits at once; 0 commits only what is already queued together (T3D_PROVIDER_COMMIT_INTERVAL_MS; default 20)"),
    ("--provider-commit-batching", "provider_commit_batching", "true or false: provider updates already queued together share one transaction, up to 64 updates and 1 MiB (false commits each alone, only to measure against) (T3D_PROVIDER_COMMIT_BATCHING; default true)"),
    ("--sqlite-synchronous", "sqlite_synchronous", "full or normal: full syncs every commit to disk, so nothing committed is lost even to a power cut (one fsync per transaction, on the writer thread); normal syncs at checkpoints only, so a power cut can lose the last seconds of commits (T3D_SQLITE_SYNCHRONOUS; default full)"),
    ("--sqlite-busy-timeout-ms", "sqlite_busy_timeout_ms", "milliseconds a write waits for another process's lock on the database, 0-600000, before client writes fail with 'locked by another process' (the daemon's own writes retry) (T3D_SQLITE_BUSY_TIMEOUT_MS; default 5000)"),
    ("--psi-root", "psi_root", "root under which proc/pressure/memory and the agents' cgroup files are read (T3D_PSI_ROOT; default /)"),
    ("--pressure-interval", "pressure_interval", "seconds between memory-pressure readings while someone listens, 0.05-60 (T3D_PRESSURE_INTERVAL; default 5)"),
    ("--pressure-admission", "pressure_admission", "on or off: hold new turn starts as queued while memory pressure is severe, and admit them one per reading once it clears; each turn start takes one reading when nobody listens (T3D_PRESSURE_ADMISSION; default on)"),
    ("--agent-scopes", "agent_scopes", "auto or off: run providers in their own systemd scope under t3d-agents.slice where systemd works (T3D_AGENT_SCOPES; default auto)"),
    ("--force-stop-grace", "force_stop_grace", "seconds between SIGTERM and SIGKILL when a thread is force-stopped, 0.1-60 (T3D_FORCE_STOP_GRACE; default 5)"),
    ("--retention", "retention", "on or off: delete superseded events once they are older than the ages below, in short steps that other writes interleave with, and give the space back (off keeps them, only to measure against; a deleted thread's events go either way) (T3D_RETENTION; default on)"),
    ("--retention-item-snapshots-age", "retention_item_snapshots_age", "how long an item's superseded snapshots (item.updated) are kept, 0-30d, in seconds or with a unit: 90, 5m, 1h, 7d (T3D_RETENTION_ITEM_SNAPSHOTS_AGE; default 1h)"),
    ("--retention-state-events-age", "retention_state_events_age", "how long superseded thread, turn, request, session and checkpoint events (and done outbox rows) are kept, 0-365d (T3D_RETENTION_STATE_EVENTS_AGE; default 7d)"),
    ("--retention-interval", "retention_interval", "time between retention passes, 1s-1d (T3D_RETENTION_INTERVAL; default 1m)"),
    ("--retention-duty", "retention_duty", "the share of the database writer's time a retention pass may take, 0.05-1: it pauses between its steps so other writes go first; 1 clears a backlog soonest, for a quiet daemon (T3D_RETENTION_DUTY; default 0.25)"),
    ("--agent-reattach-window", "agent_reattach_window", "seconds agents keep running under the spawner after the daemon stops without stopping them (SIGTERM, a crash), for the next daemon on this state dir to reattach; 0 = agents stop with the daemon, 0-86400 (T3D_AGENT_REATTACH_WINDOW; default 300)"),
    ("--turn-silence-timeout", "turn_silence_timeout", "seconds a running turn's provider may send nothing (no approval pending) before the turn fails and the provider is stopped, 0 = never, 0-604800 (T3D_TURN_SILENCE_TIMEOUT; default 1800)"),
    ("--log-level", "log_level", "debug, info, warning or error (T3D_LOG_LEVEL; default info)"),
    ("--log-format", "log_format", "text or json: json writes one object per line with time, level, logger, message and the record's fields (T3D_LOG_FORMAT; default text)"),
    ("--loop-stall-threshold", "loop_stall_threshold", "seconds, 0.05-600: a loop stall this long logs one record with the slowest task steps, RSS, GC state and the writer queue (T3D_LOOP_STALL_THRESHOLD; default 1)"),
    ("--metrics-open", "metrics_open", "none or loopback: loopback lets scrapers on a loopback address read GET /metrics without the token (T3D_METRICS_OPEN; default none)"),
)


def build_parser(*, serve_only: bool = False) -> argparse.ArgumentParser:
    """The whole ``t3d`` parser; ``serve_only``: without the other commands' subparsers, for a
    command line that starts with ``serve`` (it parses and helps the same, and `t3d serve`
    does not import ``ctl`` and ``service`` to build parsers it never uses)."""
    parser = argparse.ArgumentParser(
        prog="t3d",
        description="t3d runs and supervises coding-agent sessions and streams them to local clients.",
        epilog=f"Settings: flags override environment variables ({environment_help()}), which override defaults.",
    )
    parser.add_argument("--version", action="version", version=f"t3d {t3d.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = commands.add_parser("serve", help="run the daemon in the foreground", description="Run the t3d daemon in the foreground until SIGTERM (agents keep running for the next daemon on the state dir), Ctrl-C (agents stop too) or `t3d ctl shutdown`.", epilog="exit status: 0 after a clean stop; 1 when it had to stop or could not start (port taken, another daemon holds the state dir, the database cannot take writes at start, the database writer died); 2 for an invalid setting")
    for flag, dest, text in SERVE_FLAGS:
        serve.add_argument(flag, dest=dest, default=None, help=text)
    if not serve_only:
        _add_other_commands(commands)
    _name_each_parser(parser)
    parser.set_defaults(root_parser=parser)  # `t3d ctl completion` walks the whole tree
    return parser


def _add_other_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from t3d.ctl import add_ctl_arguments
    from t3d.service.command import add_service_arguments

    ctl = commands.add_parser("ctl", help="administer a running daemon over its API", description="Administer a running t3d daemon over its API.")
    add_ctl_arguments(ctl)
    described = commands.add_parser(
        "schema",
        help="print the API's JSON Schema (or write it as files)",
        description="The JSON Schema (draft-07) of every JSON-RPC method's params and result and of the "
        "notifications, as GET /api/schema serves it. Printed on stdout, or with --out written to "
        "DIR: t3d_api.schemas.json (the whole) and one self-contained file per type.",
    )
    described.add_argument("--out", metavar="DIR", help="write the files into DIR (made if missing)")
    service = commands.add_parser(
        "service",
        help="install, remove or look at t3d as systemd user units",
        description="Install, remove or look at the t3d daemon and its spawner as systemd user units.",
    )
    add_service_arguments(service)


def _name_each_parser(parser: argparse.ArgumentParser) -> None:
    """Every (sub)command's parser sets ``usage_parser`` to itself when it is chosen, so an
    unknown argument is reported with the usage of the command it was given to."""
    parser.set_defaults(usage_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _name_each_parser(sub)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but ``t3d serve --bogus`` prints serve's usage, not t3d's
    (argparse leaves arguments no subcommand knows to the top-level parser)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        chosen: argparse.ArgumentParser = getattr(args, "usage_parser", parser)
        chosen.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


async def _serve(settings: Settings, notify: NotifyTarget | None, interactive: bool) -> None:
    from t3d.daemon import DaemonControl, DaemonInfo, run_daemon

    control = DaemonControl()
    log = logging.getLogger("t3d")
    async with trio.open_nursery() as nursery:

        async def stop_on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for sig in signals:
                    if sig == signal.SIGINT and interactive:
                        control.stop_agents = True
                        log.info("received SIGINT (Ctrl-C); shutting down and stopping every agent")
                    else:
                        log.info(
                            "received %s; shutting down, agents keep running for the next daemon on %s",
                            signal.Signals(sig).name,
                            settings.state_dir,
                        )
                    nursery.cancel_scope.cancel()
                    return

        async def daemon(task_status: trio.TaskStatus[DaemonInfo]) -> None:
            await run_daemon(settings, control=control, notify=notify, task_status=task_status)
            nursery.cancel_scope.cancel()  # it stopped by itself (server.shutdown)

        nursery.start_soon(stop_on_signal)
        info = await nursery.start(daemon)
        if settings.log_format == "text":  # json: the "serving" record says it, as a JSON line
            print(f"t3d serving on {info.url}", file=sys.stderr, flush=True)
            print(f"token: {info.token_path}", file=sys.stderr, flush=True)
            if info.sign_in_link is not None and sys.stderr.isatty():  # a person reads this, not a log
                print(f"web page: {info.sign_in_link()} (works once, for 60 s; `t3d ctl open` makes another)", file=sys.stderr, flush=True)


def serve(args: argparse.Namespace) -> int:
    try:
        settings = load_settings({dest: getattr(args, dest) for _, dest, _ in SERVE_FLAGS}, os.environ)
    except ConfigError as exc:
        print(f"t3d: invalid setting: {exc}", file=sys.stderr)
        return 2
    try:
        warnings = check_settings(settings, os.environ)
    except ConfigError as exc:
        print(f"t3d: invalid setting: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    if exposure := exposure_warning(settings.host):
        warnings = [exposure, *warnings]
    for warning in warnings:
        logging.getLogger("t3d").warning("%s", warning)
    # The daemon's modules are start-up's objects too: import them before the freeze, so
    # that no full collection scans them (about 18,000 objects).
    importlib.import_module("t3d.daemon")
    tune_gc()
    notify = notify_target(os.environ, os.getpid())
    for name in NOTIFY_ENVIRONMENT:
        os.environ.pop(name, None)
    tune_malloc()
    try:
        trio.run(_serve, settings, notify, _stdin_is_terminal())
    except BaseException as exc:
        return _exit_status(_leaf(exc))
    return 0


def _end_process(status: int) -> NoReturn:
    """End the process of a `t3d serve` that has stopped: flush the logs and the standard
    streams, then exit without the interpreter's teardown (freeing every module and object
    took 50-200 ms, part of a restart's down time). Nothing is left to finish by then: the
    store has committed every job and closed, and only idle daemon threads remain."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or its reader went away
            stream.flush()
    os._exit(status)


def _stdin_is_terminal() -> bool:
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, ValueError, OSError):
        return False


def _leaf(exc: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (Trio nurseries wrap)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _exit_status(exc: BaseException) -> int:
    if isinstance(exc, ConfigError):
        print(f"t3d: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, ServiceError):
        print(f"t3d: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, T3dError):
        print(f"t3d: stopped: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, KeyboardInterrupt):
        return 0
    raise exc


def write_schema(out: str | None) -> int:
    """`t3d schema [--out DIR]`."""
    import orjson

    from t3d.api import schema

    if out is None:
        sys.stdout.write(orjson.dumps(schema.document(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    directory = Path(out)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, body in schema.files().items():
            (directory / name).write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as exc:
        print(f"t3d: could not write the schema into {directory}: {exc.strerror or exc}; give a writable --out", file=sys.stderr)
        return 1
    print(f"t3d: wrote {len(schema.files())} files into {directory}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(build_parser(serve_only=words[:1] == ["serve"]), words)
    if args.command == "serve":
        _end_process(serve(args))
    if args.command == "schema":
        return write_schema(args.out)
    if args.command == "service":
        from t3d.service.command import run_service

        return run_service(args)
    from t3d.ctl import run_ctl

    return run_ctl(args)


if __name__ == "__main__":
    sys.exit(main())
