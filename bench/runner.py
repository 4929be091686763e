"""The coordinator: one run is one daemon, one load process and one prober, watched.

``run_once`` reads top-down as a run: prepare the state dir, start the daemon, start the
sampler, start the load process and wait for its ``ready`` line, start the prober, read
the events sequence at the window's edges, wait for the load to finish, stop the
daemon, check that no process it started is left, then compute the figures and write
the run's CSV files. With ``restart_every_s`` the daemon is restarted during the window
(bench/restart.py) and the load's clients connect again. Everything the coordinator
started is stopped on every path (shielded, bounded); a failure of the harness itself
makes the run invalid with its reason, never a crash of the whole benchmark.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from bench import daemon as d
from bench import figures, procfs
from bench import restart as r
from bench.actors import trio_deadline
from bench.client import HttpClient, HttpError
from bench.fixture import fixture_path, mean_lines_per_turn, mean_turn_s
from bench.load import BURST_TIMEOUT_S
from bench.profiles import Profile, session_providers
from bench.sampler import Sampler
from bench.stats import validity

READY_TIMEOUT_S = 180.0  # set-up: one thread and connection per session
FINISH_GRACE_S = 60.0


@attrs.frozen
class RunSpec:
    label: str  # e.g. primary-250-A1
    config: str  # "A" or "B"
    env: Mapping[str, str]
    profile: Profile
    sessions: int
    window_s: float
    warmup_s: float
    out: Path
    db: Path | None = None
    daemon_cpus: str | None = None
    driver_cpus: str | None = None
    keep_state: bool = False
    slow_clients: int | None = None  # never-reading clients and probes (bench/slow.py)
    restart_every_s: float | None = None  # restart the daemon this often in the window
    restart_signal: str = "TERM"  # TERM or KILL
    pollers: str = "http"  # the approval pollers: "http" polling, or "mcp" long-polls
    provider: str = "claude"  # the sessions' agents: claude, codex or mix (bench.profiles)
    scrape_interval: float | None = None  # seconds between GET /metrics (bench/scraper.py); None: no scraper
    fixture: str | None = None  # the Claude sessions' fixture (--fixtures); None: the profile's
    snapshot_log_s: float | None = None  # seconds between readings of the snapshot log (--snapshot-log)

    @property
    def claude_fixture(self) -> str:
        return self.fixture or self.profile.fixture

    @property
    def scrapes_path(self) -> Path:
        return self.out / f"{self.label}.scrapes.json"


@attrs.define
class RunResult:
    label: str
    config: str
    sessions: int
    valid: bool
    reasons: list[str]
    figures: dict[str, Any]
    missing: dict[str, str]
    notes: list[str]


def fixture_turn_s(profile: Profile, provider: str, sessions: int, fixture: str | None = None) -> float:
    """The fixtures' own mean turn, weighted by how many sessions replay each (``fixture``:
    the Claude sessions' instead of the profile's, `RunSpec.fixture`)."""
    own = {"replay": mean_turn_s(fixture_path(fixture or profile.fixture)), "replay-codex": mean_turn_s(fixture_path(profile.codex_fixture))}
    providers = session_providers(provider, sessions)
    return sum(own[p] for p in providers) / len(providers)


def fixture_lines_per_turn(profile: Profile, provider: str, sessions: int, fixture: str | None = None) -> float:
    """The fixtures' mean stdout lines per turn, weighted like `fixture_turn_s`."""
    own = {
        "replay": mean_lines_per_turn(fixture_path(fixture or profile.fixture)),
        "replay-codex": mean_lines_per_turn(fixture_path(profile.codex_fixture)),
    }
    providers = session_providers(provider, sessions)
    return sum(own[p] for p in providers) / len(providers)


async def _read_ready(process: trio.Process) -> float:
    assert process.stdout is not None
    buffer = b""
    while b"\n" not in buffer:
        chunk = await process.stdout.receive_some(4096)
        if not chunk:
            raise d.DaemonFailed("the load process ended during set-up")
        buffer += chunk
    return float(orjson.loads(buffer.split(b"\n", 1)[0])["t0"])


async def _sequence(client: HttpClient) -> int | None:
    try:
        shell = await client.request("GET", "/api/shell")
    except (HttpError, OSError, trio.BrokenResourceError):
        return None
    value = shell.get("sequence") if isinstance(shell, dict) else None
    return value if isinstance(value, int) else None


async def _saturated_s(client: HttpClient) -> float | None:
    """Seconds the daemon's admission gate has been closed so far, if it says."""
    try:
        health = await client.request("GET", "/api/health")
    except (HttpError, OSError, trio.BrokenResourceError):
        return None
    admission = health.get("admission") if isinstance(health, dict) else None
    value = admission.get("saturated_s") if isinstance(admission, dict) else None
    return float(value) if isinstance(value, int | float) else None


async def _metrics(client: HttpClient) -> str | None:
    """The daemon's GET /metrics body (for its histograms' deltas over the window)."""
    try:
        body = await client.request("GET", "/metrics", decode=False)
    except (HttpError, OSError, trio.BrokenResourceError):
        return None
    return body.decode("utf-8", "replace") if isinstance(body, bytes) else None


async def _stop_process(process: trio.Process) -> None:
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with trio.move_on_after(5):
                await process.wait()
            if process.returncode is None:
                process.kill()
        await process.wait()


async def run_once(spec: RunSpec) -> RunResult:
    spec.out.mkdir(parents=True, exist_ok=True)
    state = d.prepare_state(spec.out / f"state-{spec.label}", spec.db)
    fixture = fixture_path(spec.claude_fixture)
    codex_fixture = fixture_path(spec.profile.codex_fixture)
    turn_s = fixture_turn_s(spec.profile, spec.provider, spec.sessions, spec.fixture)
    errors: list[str] = []
    notes: list[str] = []
    load_out = spec.out / f"{spec.label}.load.json"
    probe_out = spec.out / f"{spec.label}.health.json"
    t0 = time.monotonic()
    span: list[int | None] = [None, None]
    gate: list[float | None] = [None, None]
    scraped: list[str | None] = [None, None]  # GET /metrics at the window's start and end
    sampler: Sampler | None = None
    restarts: list[r.RestartRecord] = []
    try:
        async with d.open_daemon(
            state, fixture, spec.env, spec.out / f"{spec.label}.daemon.log", cpus=spec.daemon_cpus,
            codex_fixture=codex_fixture,
        ) as daemon:
            sampler = Sampler(
                daemon.process.pid,
                state.spawner_socket,
                str(state.git_log) if state.git_log else None,
                str(state.root / "t3d.sqlite"),
                spec.snapshot_log_s,
            )
            t0 = await _drive(spec, daemon, sampler, turn_s, load_out, probe_out, span, gate, scraped, errors, restarts)
            if restarts:
                await trio.to_thread.run_sync(r.settle, restarts[-1])
            errors.extend(
                f"restart at {record.at - t0:.0f} s: {record.error}" for record in restarts if record.serving_s is None
            )
            if daemon.process.returncode is not None:
                errors.append(
                    f"the daemon exited with status {daemon.process.returncode} during the run; see {daemon.log}"
                )
        notes.append(f"daemon stopped in {daemon.stop_s:.1f} s with status {daemon.exit_code}")
        if daemon.exit_code not in (0, None):
            notes.append(
                f"the daemon exited with status {daemon.exit_code} when stopped; last log line: {d.tail(daemon.log, 1)}"
            )
    except d.DaemonFailed as exc:
        errors.append(str(exc))
    left, spawner = _leftovers(state, sampler)
    if left:
        errors.append(f"{len(left)} process(es) outlived the daemon and were killed: {left[:5]}")
    if spawner is not None:
        # A restarted daemon uses the spawner the first one started and leaves it running.
        (notes if restarts else errors).append(
            f"the spawner (pid {spawner}) outlived the daemon and was killed"
        )
    result = _result(spec, turn_s, load_out, probe_out, sampler, span, gate, scraped, t0, errors, notes)
    if spec.restart_every_s is not None:
        await trio.to_thread.run_sync(_restart_result, spec, result, restarts, load_out, state, t0)
    else:
        r.no_restart_figures(result.figures, result.missing)
    if not spec.keep_state:
        _remove_state(state.root)
    return result


async def _drive(
    spec: RunSpec, daemon: d.RunningDaemon, sampler: Sampler, turn_s: float,
    load_out: Path, probe_out: Path, span: list[int | None], gate: list[float | None],
    scraped: list[str | None], errors: list[str], restarts: list[r.RestartRecord],
) -> float:  # fmt: skip
    config = {
        "port": daemon.port, "token": daemon.token, "project": str(daemon.state.project),
        "profile": spec.profile.name, "sessions": spec.sessions, "warmup_s": spec.warmup_s,
        "window_s": spec.window_s, "turn_s": turn_s, "results": str(load_out),
        "slow_clients": spec.slow_clients, "reconnect": spec.restart_every_s is not None, "pollers": spec.pollers,
        "providers": session_providers(spec.provider, spec.sessions),
    }  # fmt: skip
    config_path = spec.out / f"{spec.label}.load-config.json"
    config_path.write_bytes(orjson.dumps(config))
    pin = d.pin_prefix(spec.driver_cpus)
    t0 = time.monotonic()
    with (spec.out / f"{spec.label}.load.log").open("wb") as load_log:
        load = await trio.lowlevel.open_process(
            [*pin, sys.executable, "-m", "bench.load", str(config_path)],
            stdout=subprocess.PIPE,
            stderr=load_log,
        )
    prober: trio.Process | None = None
    scraper: trio.Process | None = None
    client = HttpClient(daemon.port, daemon.token)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler.run, spec.profile.sample_s)
            with trio.fail_after(READY_TIMEOUT_S):
                t0 = await _read_ready(load)
            start, end = t0 + spec.warmup_s, t0 + spec.warmup_s + spec.window_s
            sampler.driver_pids = [load.pid]
            if not spec.profile.burst:  # a burst has no window to probe
                prober = await trio.lowlevel.open_process(
                    [
                        *pin,
                        sys.executable,
                        "-m",
                        "bench.prober",
                        str(daemon.port),
                        str(end),
                        str(probe_out),
                        str(daemon.state.token_path),
                    ]
                )
                sampler.driver_pids.append(prober.pid)
                if spec.scrape_interval:  # a Prometheus-like scraper of GET /metrics
                    scrape_config = spec.out / f"{spec.label}.scrape-config.json"
                    scrape_config.write_bytes(orjson.dumps({
                        "port": daemon.port, "token": daemon.token, "interval": spec.scrape_interval,
                        "until": end, "out": str(spec.scrapes_path),
                    }))  # fmt: skip
                    scraper = await trio.lowlevel.open_process([*pin, sys.executable, "-m", "bench.scraper", str(scrape_config)])
                    sampler.driver_pids.append(scraper.pid)
                if spec.restart_every_s is not None:
                    nursery.start_soon(
                        r.run_restarts, daemon, sampler, spec.restart_every_s, spec.restart_signal, start, end, restarts
                    )
                await trio.sleep(max(0.0, start - time.monotonic()))
                span[0], gate[0], scraped[0] = await _sequence(client), await _saturated_s(client), await _metrics(client)
                await trio.sleep(max(0.0, end - time.monotonic()))
                span[1], gate[1], scraped[1] = await _sequence(client), await _saturated_s(client), await _metrics(client)
            with trio.move_on_at(
                trio_deadline(end + (BURST_TIMEOUT_S if spec.profile.burst else 0) + FINISH_GRACE_S)
            ):
                await load.wait()
                for process in (prober, scraper):
                    if process is not None:
                        await process.wait()
            nursery.cancel_scope.cancel()
    except d.DaemonFailed as exc:
        errors.append(str(exc))
    except trio.TooSlowError:
        errors.append(
            f"the load process was not ready within {READY_TIMEOUT_S:g} s; see {spec.label}.load.log"
        )
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
        for name, process in (("the load process", load), ("the prober", prober), ("the scraper", scraper)):
            if process is not None and process.returncode is None:
                errors.append(f"{name} did not finish in time and was stopped")
                await _stop_process(process)
    if load.returncode not in (0, None):
        errors.append(
            f"the load process failed (status {load.returncode}); see {spec.label}.load.log:\n{d.tail(spec.out / f'{spec.label}.load.log', 8)}"
        )
    return t0


def _leftovers(state: d.StateDir, sampler: Sampler | None) -> tuple[list[int], int | None]:
    """Processes the daemon started that are still alive after it stopped, and the spawner
    if it is; they are killed."""
    left = {p.pid for p in (sampler.providers_seen if sampler else set()) if p.alive()}
    spawner = procfs.find_spawner(state.spawner_socket)
    left.update(procfs.processes_under(str(state.root)))
    if spawner is not None:
        left.discard(spawner)
    for pid in [*left, *([spawner] if spawner is not None else [])]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return sorted(left), spawner


def _restart_result(
    spec: RunSpec, result: RunResult, records: list[r.RestartRecord], load_out: Path,
    state: d.StateDir, t0: float,
) -> None:  # fmt: skip
    """The restart figures, notes and CSVs of a run with --restart-every."""
    load = orjson.loads(load_out.read_bytes()) if load_out.exists() else None
    turns = figures.turns_of(load) if load else []
    fixtures = {"replay": fixture_path(spec.claude_fixture), "replay-codex": fixture_path(spec.profile.codex_fixture)}
    fig, rows = r.restart_figures(records, turns, state.root / "t3d.sqlite", fixtures)
    result.figures.update(fig)
    result.notes.extend(r.note(record, i + 1) for i, record in enumerate(records))
    if len(records) == 0:
        result.notes.append("no restart happened in the window (is --restart-every longer than --window?)")
    origin = load["window"][0] if load else t0
    _write_csv(spec.out / f"{spec.label}.restarts.csv", [record.row(origin) for record in records])
    for row in rows:
        row["restart_at"] = round(row["restart_at"] - origin, 3)
    _write_csv(spec.out / f"{spec.label}.restarted-turns.csv", rows)


def _remove_state(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def _result(
    spec: RunSpec, turn_s: float, load_out: Path, probe_out: Path, sampler: Sampler | None,
    span: list[int | None], gate: list[float | None], scraped: list[str | None], t0: float,
    errors: list[str], notes: list[str],
) -> RunResult:  # fmt: skip
    for held in ("load-config", "scrape-config"):  # they hold the daemon's token
        (spec.out / f"{spec.label}.{held}.json").unlink(missing_ok=True)
    load = orjson.loads(load_out.read_bytes()) if load_out.exists() else None
    probes = orjson.loads(probe_out.read_bytes()) if probe_out.exists() else []
    if load is None:
        errors.append("the load process wrote no results")
        fig: dict[str, Any] = {"sessions": spec.sessions, "harness_errors": errors}
        return RunResult(
            spec.label,
            spec.config,
            spec.sessions,
            False,
            validity(fig, burst=spec.profile.burst),
            fig,
            {},
            notes,
        )
    inputs = figures.Inputs(
        spec.profile, spec.sessions, spec.window_s, turn_s, load, probes,
        sampler.samples if sampler else [],
        (span[0], span[1]) if span[0] is not None and span[1] is not None else None,
        sampler.spawner_seen if sampler else False,
        (gate[0], gate[1]) if gate[0] is not None and gate[1] is not None else None,
        len(sampler.daemon_children_seen) if sampler else None,
        orjson.loads(spec.scrapes_path.read_bytes()) if spec.scrapes_path.exists() else None,
        fixture_lines_per_turn(spec.profile, spec.provider, spec.sessions, spec.fixture),
        (scraped[0], scraped[1]) if scraped[0] is not None and scraped[1] is not None else None,
    )  # fmt: skip
    fig, missing = (figures.burst_figures if spec.profile.burst else figures.steady_figures)(inputs)
    fig["harness_errors"] = errors
    reasons = validity(fig, burst=spec.profile.burst)
    _write_csvs(spec, load, probes, sampler, t0)
    if load["errors"]["first"]:
        notes.append("client errors: " + "; ".join(load["errors"]["first"][:5]))
    return RunResult(
        spec.label, spec.config, spec.sessions, not reasons, reasons, fig, missing, notes
    )


def _write_csvs(
    spec: RunSpec, load: dict[str, Any], probes: list[Any], sampler: Sampler | None, t0: float
) -> None:
    origin = load["window"][0]
    turns = figures.turns_of(load)
    rows = figures.series_rows(
        sampler.samples if sampler else [], probes, turns, origin, spec.profile.sample_s
    )
    _write_csv(spec.out / f"{spec.label}.csv", rows)
    turn_rows = [
        {
            "session": t["session"], "start_s": round(t["start"] - origin, 4),
            "dispatch_ms": t["dispatch_ms"] and round(t["dispatch_ms"], 3),
            "first_item_ms": None if t["first_item"] is None else round((t["first_item"] - t["start"]) * 1000, 2),
            "reply_done_s": None if t["reply_done"] is None else round(t["reply_done"] - t["start"], 4),
            "duration_s": None if t["end"] is None else round(t["end"] - t["start"], 4),
            "status": t["status"], "prompted": t["prompted"],
        }
        for t in turns
    ]  # fmt: skip
    _write_csv(spec.out / f"{spec.label}.turns.csv", turn_rows)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as handle:
        if not rows:
            handle.write("")
            return
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
