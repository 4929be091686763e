"""The benchmark harness (bench/): its pure parts, its fixtures, and one smoke run end to end.

The smoke run starts a real daemon through ``python -m bench run --profile smoke`` and
checks that the harness works: a valid run, every figure measured or missing with a
reason, the CSVs, summary.json and report.md written, nothing left running. It never
asserts a speed: the machine may be busy.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from harness import REPO, new_thread, open_client, run_turn, start_daemon

from bench import codex_fixture, fixture, procfs, report
from bench.__main__ import configurations, daemon_code, parse_compare, parse_sessions
from bench.daemon import daemon_env, open_daemon, prepare_state
from bench.figures import BURST_FIGURES, STEADY_FIGURES
from bench.prober import lag_of
from bench.profiles import PROFILES, physical_limit, session_providers, start_offsets
from bench.stats import median_figures, percentile, ratio, validity

# --- statistics --------------------------------------------------------------------------


def test_percentiles_interpolate_between_ranks_and_are_none_for_no_values() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(range(1, 101), 99) == pytest.approx(99.01)
    assert percentile([5, 1, 3], 0) == 1 and percentile([5, 1, 3], 100) == 5
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_ratio_is_missing_rather_than_zero_or_infinite() -> None:
    assert ratio(3, 4) == 0.75
    assert ratio(None, 4) is None and ratio(3, None) is None and ratio(3, 0) is None


def test_the_physical_limit_is_sessions_times_window_over_think_plus_turn() -> None:
    assert physical_limit(250, 300, 60, 6) == pytest.approx(250 * 300 / 66)
    assert physical_limit(1, 300, 4, 6) == 30


def test_first_turns_spread_over_one_cycle_at_most_the_warmup() -> None:
    assert start_offsets(4, 60, 6, 60) == [0, 15, 30, 45]
    assert start_offsets(2, 1, 6, 60) == [0, 3.5]
    assert start_offsets(3, 1, 6, 0) == [0, 0, 0]


def test_a_run_is_valid_only_if_every_session_produced_output() -> None:
    assert validity({"sessions": 3, "sessions_with_output": 3}, burst=False) == []
    assert validity({"sessions": 3, "sessions_with_output": 2}, burst=False) == [
        "2 of 3 sessions produced output in the window"
    ]
    assert validity({"sessions": 3}, burst=False) == [
        "0 of 3 sessions produced output in the window"
    ]
    assert validity({"sessions": 2, "turns_completed": 1}, burst=True) == [
        "1 of 2 burst turns completed"
    ]
    broken = {
        "sessions": 1,
        "sessions_with_output": 1,
        "harness_errors": ["the load process failed"],
    }
    assert validity(broken, burst=False) == ["the load process failed"]


def test_medians_skip_missing_values_and_never_invent_one() -> None:
    runs: list[dict[str, Any]] = [{"a": 1.0, "b": None}, {"a": 3.0, "b": None}, {"a": 2.0}]
    assert median_figures(runs, ["a", "b"]) == {"a": 2.0, "b": None}


def test_ab_summaries_give_each_configuration_and_the_ratio() -> None:
    def run(label: str, config: str, turns: int, valid: bool = True) -> dict[str, Any]:
        return {
            "label": label,
            "config": config,
            "sessions": 5,
            "valid": valid,
            "figures": {"turns_completed": turns},
        }

    runs = [
        run("A1", "A", 10),
        run("B1", "B", 12),
        run("A2", "A", 20),
        run("B2", "B", 1, valid=False),
    ]
    (entry,) = report.summarize(runs, ["A", "B"], burst=False)
    assert entry["configs"]["A"]["median"]["turns_completed"] == 15
    assert entry["configs"]["B"] == {
        "runs": ["B1", "B2"],
        "valid_runs": 1,
        "median": entry["configs"]["B"]["median"],
    }
    assert entry["configs"]["B"]["median"]["turns_completed"] == 12
    assert entry["ratio"]["turns_completed"] == pytest.approx(0.8)


def test_env_sets_every_configuration_and_compare_adds_to_b() -> None:
    """``--env`` goes to A and B; ``--compare`` to B only, over it."""
    args = argparse.Namespace(env="T3D_RETENTION_ITEM_SNAPSHOTS_AGE=5m T3D_X=1", compare="T3D_X=2", slow_clients=None)
    assert configurations(args) == {
        "A": {"T3D_RETENTION_ITEM_SNAPSHOTS_AGE": "5m", "T3D_X": "1"},
        "B": {"T3D_RETENTION_ITEM_SNAPSHOTS_AGE": "5m", "T3D_X": "2"},
    }
    assert configurations(argparse.Namespace(env="T3D_X=1", compare=None, slow_clients=None)) == {"A": {"T3D_X": "1"}}


def test_database_growth_is_measured_per_third_of_the_window() -> None:
    """The database file's figures: its size at the start, the medians of the first and last
    thirds, and each third's growth in MiB per minute (a flat tail grows by 0)."""
    from bench.figures import _db_size
    from bench.sampler import Sample

    def at(t: float, mib: float) -> Sample:
        return Sample(t, None, None, None, None, None, None, 0, 0.0, None, 0.0, 0, 0, None, db_mib=mib, wal_mib=1.0)

    sizes = [10.0 + 2 * n for n in range(6)] + [22.0] * 6  # +2 MiB per sample, then flat
    fig: dict[str, object] = {}
    _db_size([at(60.0 * n, mib) for n, mib in enumerate(sizes)], fig)
    assert fig["db_mib_start"] == 10.0 and fig["db_mib_peak"] == 22.0 and fig["wal_mib_peak"] == 1.0
    assert fig["db_growth_first_third_mib_min"] == 2.0 and fig["db_growth_last_third_mib_min"] == 0.0
    assert (fig["db_mib_first_third"], fig["db_mib_last_third"]) == (13.0, 22.0)


def test_daemon_cpu_adds_up_across_restarts() -> None:
    """A CPU counter that drops is a restarted daemon: the figure sums what each process used
    (it was last minus first, negative after a restart), and a steady counter is unchanged."""
    from bench.figures import _cpu
    from bench.sampler import Sample

    def at(t: float, cpu: float | None) -> Sample:
        return Sample(t, None, None, cpu, None, None, None, 0, 0.0, None, 0.0, 0, 0, None)

    restarted = [at(0, 10.0), at(1, 14.0), at(2, 1.0), at(3, 3.5), at(4, None), at(5, 4.0)]
    assert _cpu(restarted, "daemon_cpu") == 4.0 + 1.0 + 2.5 + 0.5
    assert _cpu([at(0, 10.0), at(1, 12.0), at(2, 15.0)], "daemon_cpu") == 5.0
    assert _cpu([at(0, 10.0)], "daemon_cpu") is None


def test_command_line_lists() -> None:
    assert parse_compare("T3D_A=false 'T3D_B=x y'") == {"T3D_A": "false", "T3D_B": "x y"}
    assert parse_sessions("50,100, 250") == [50, 100, 250]
    with pytest.raises(SystemExit):
        parse_compare("T3D_A")
    with pytest.raises(SystemExit):
        parse_sessions("0")


def test_the_daemon_gets_only_the_configured_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("T3D_PORT", "1234")
    state = prepare_state(tmp_path / "state", None)
    env = daemon_env(state, {"T3D_SQLITE_READER_POOL": "1"})
    assert env["T3D_SQLITE_READER_POOL"] == "1" and "T3D_PORT" not in env
    if state.git_log is not None:  # git processes are counted through a shim first on PATH
        assert env["PATH"].startswith(str(state.root / "bench-bin"))
        assert (state.project / ".git").is_dir()


def test_a_pythonpath_in_the_settings_decides_which_t3d_the_daemon_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--compare 'PYTHONPATH=<worktree>'` compares two checkouts only if the bench's own
    directory (this checkout, where ``python -m`` would look first) does not shadow it:
    the report names the checkout each configuration ran, from where the daemon runs."""
    other = tmp_path / "worktree"
    (other / "t3d").mkdir(parents=True)
    (other / "t3d" / "__init__.py").write_text("")
    monkeypatch.chdir(REPO)
    assert daemon_code({}).startswith(f"{REPO} at ")
    assert daemon_code({"PYTHONPATH": str(other)}) == f"{other} at unknown (not a git checkout)"


async def test_the_bench_starts_the_daemon_in_its_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in the bench's directory: there ``python -m t3d`` would import this checkout's
    t3d (and the spawner this checkout's spawner) ahead of a PYTHONPATH naming another."""
    monkeypatch.chdir(REPO)
    state = prepare_state(tmp_path / "state", None)
    fixture_file = fixture.fixture_path("claude-2.1.197_bench_burst")
    with trio.fail_after(60):
        async with open_daemon(state, fixture_file, {}, tmp_path / "daemon.log") as daemon:
            assert os.readlink(f"/proc/{daemon.process.pid}/cwd") == str(state.root)


# --- /proc parsing ---------------------------------------------------------------------


def test_proc_parsers() -> None:
    stat = "42 (we (ird) name) S 7 " + " ".join(["0"] * 9) + " 250 150 0 0 0 0 0 0 99 0"
    ppid, cpu, start = procfs.parse_stat(stat)
    assert (ppid, start) == (7, 99) and cpu == pytest.approx(400 / procfs.CLOCK_TICKS)
    assert procfs.parse_stat_split(stat) == pytest.approx((250 / procfs.CLOCK_TICKS, 150 / procfs.CLOCK_TICKS))
    assert procfs.parse_status_kib("Name:\tx\nVmRSS:\t  2048 kB\n", "VmRSS") == 2048
    assert procfs.parse_status_kib("Name:\tx\n", "VmRSS") is None
    assert procfs.parse_statm_rss_bytes("100 25 3 1 0 5 0") == 25 * procfs.PAGE_BYTES
    assert procfs.parse_proc_stat_cpu("cpu  10 0 5 80 5 0 0 0 0 0\ncpu0 1\n") == (15, 100)


def test_the_spawner_is_recognized_by_module_and_socket() -> None:
    sock = "/s/spawner.sock"
    assert procfs.is_spawner(["python", "-m", "spawner", "--socket", sock], sock)
    assert procfs.is_spawner(["python", "-m", "spawner", f"--socket={sock}"], sock)
    assert not procfs.is_spawner(["python", "-m", "spawner", "--socket", "/other.sock"], sock)
    assert not procfs.is_spawner(["python", "-m", "t3d", "--socket", sock], sock)


def test_the_prober_reads_loop_lag_and_tolerates_its_absence() -> None:
    assert lag_of(b'{"loop_lag_ms": {"last": 1.5, "p99": 3, "max": 9}}') == (1.5, 3, 9)
    assert lag_of(b'{"status": "ok"}') == (None, None, None)
    assert lag_of(b"not json") == (None, None, None)


# --- fixtures ----------------------------------------------------------------------------


def _bench_timings() -> list[fixture.TurnTiming]:
    return fixture.read_timings(fixture.fixture_path(fixture.TURNS_NAME))


def test_the_checked_in_fixtures_are_what_the_builder_makes(tmp_path: Path) -> None:
    fixture.write(tmp_path)
    for built in sorted(tmp_path.iterdir()):
        assert built.read_bytes() == (fixture.OUT_DIR / built.name).read_bytes(), (
            f"run python -m bench.fixture ({built.name})"
        )


def test_the_bench_fixture_has_the_issue_shape() -> None:
    timings = _bench_timings()
    assert len(timings) == 5
    assert all(150 <= t.stdout_lines <= 300 for t in timings)
    assert all(1 <= t.tool_calls <= 3 for t in timings)
    assert sum(t.prompts for t in timings) == 1  # one turn in five asks
    assert all(5.5 <= t.duration_ms / 1000 <= 6.5 for t in timings)
    assert sum(t.duration_ms for t in timings) / 5 == pytest.approx(6000, abs=100)
    assert all(t.first_item_ms == pytest.approx(1700, abs=50) for t in timings)


def test_the_burst_fixture_streams_five_deltas_20_ms_apart() -> None:
    path = fixture.fixture_path(fixture.BURST_NAME)
    lines = path.read_text().splitlines()
    rows = [
        row.split("\t")
        for row in Path(str(path)[: -len(".jsonl")] + ".timing.tsv").read_text().splitlines()
    ]
    at = {int(index): int(ms) for ms, _, index in rows}
    deltas = [at[i] for i, line in enumerate(lines) if '"text_delta"' in line]
    assert len(deltas) == 5 and {b - a for a, b in itertools.pairwise(deltas)} == {20}
    assert '"type":"tool_use"' not in path.read_text()


def test_every_fixture_line_has_a_recorded_shape() -> None:
    def shape(raw: str) -> tuple[Any, ...]:
        host = raw.startswith(fixture.HOST)
        obj = orjson.loads(raw[len(fixture.HOST) :] if host else raw)
        event = obj.get("event") or {}
        return (
            host,
            obj.get("type"),
            obj.get("subtype"),
            event.get("type"),
            (event.get("delta") or {}).get("type"),
        )

    recorded = {shape(r) for r in fixture.RECORDING.read_text().splitlines() if r.strip()}
    for name in (fixture.TURNS_NAME, fixture.BURST_NAME):
        built = {shape(r) for r in fixture.fixture_path(name).read_text().splitlines()}
        assert built <= recorded, built - recorded


async def test_the_fake_cli_replays_the_bench_fixture_through_the_daemon(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery,
            tmp_path / "state",
            replay_fixture=str(fixture.fixture_path(fixture.TURNS_NAME)),
        )
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            for expected in _bench_timings():
                outcome = await run_turn(client, thread_id, "go")
                assert outcome.turn["status"] == "completed"
                assert len(outcome.of_kind("tool_call")) == expected.tool_calls
                assert [r["status"] for r in outcome.requests] == ["resolved"] * expected.prompts
                assert outcome.assistant_text and all(outcome.assistant_text)
        daemon.stop()


async def test_the_fake_cli_replays_the_burst_fixture_through_the_daemon(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    with trio.fail_after(20):
        daemon = await start_daemon(
            nursery,
            tmp_path / "state",
            replay_fixture=str(fixture.fixture_path(fixture.BURST_NAME)),
        )
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            outcome = await run_turn(client, thread_id, "go")
        assert outcome.turn["status"] == "completed"
        assert len(outcome.assistant_text) == 1 and not outcome.of_kind("tool_call")
        daemon.stop()


# --- the harness end to end --------------------------------------------------------------


@pytest.mark.parametrize("provider", ["claude", "mix"])
async def test_the_smoke_profile_runs_end_to_end_through_a_real_daemon(tmp_path: Path, provider: str) -> None:
    """A smoke run (with the fake claude, or half the sessions on the fake codex) is valid,
    measures or explains every figure, writes its files and leaves nothing running. The
    claude run also reads the snapshot log (--snapshot-log): item snapshots are in it."""
    out = tmp_path / "out"
    probe = ["--snapshot-log", "1"] if provider == "claude" else []
    with trio.fail_after(90):
        done = await trio.run_process(
            [sys.executable, "-m", "bench", "run", "--profile", "smoke", "--provider", provider, "--out", str(out), *probe],
            cwd=REPO, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    summary = orjson.loads((out / "summary.json").read_bytes())
    (run,) = summary["runs"]
    assert run["valid"], run["reasons"]
    for name in STEADY_FIGURES:
        value = run["figures"].get(name)
        assert value is not None or run["missing"].get(name), (
            f"{name} is neither measured nor explained"
        )
        assert value is None or (isinstance(value, (int, float)) and math.isfinite(value))
    assert (
        run["figures"]["sessions_with_output"]
        == run["figures"]["sessions"]
        == PROFILES["smoke"].sessions
    )
    label = run["label"]
    series = (out / f"{label}.csv").read_text().splitlines()
    assert series[0].startswith("t_s,daemon_rss_mib") and len(series) > 10
    # The database file and its WAL over time, and the snapshot log when read.
    assert series[0].endswith(",db_mib,wal_mib,snapshot_log_mib")
    assert sum(float(v or 0) for v in series[-1].split(",")[-3:-1]) > 0
    assert run["figures"]["db_mib_peak"] >= run["figures"]["db_mib_start"] >= 0
    assert run["figures"]["wal_mib_peak"] > 0
    assert (run["figures"]["snapshot_log_mib_peak"] or 0) > 0 if probe else run["missing"]["snapshot_log_mib_peak"]
    assert run["figures"]["retention_steps"] is not None  # read from /metrics (0: no pass in a smoke window)
    # The writer's commit latency in the window, from its /metrics histogram: turns committed.
    assert 0 < run["figures"]["writer_job_p50_ms"] <= run["figures"]["writer_job_p99_ms"] < 10_000
    # The WAL is checkpointed in the window: by commits while checkpoints are quick (the
    # small smoke database), by the checkpointer thread while they are slow.
    assert run["figures"]["wal_checkpoints"] + run["figures"]["wal_checkpoints_on_writer"] > 0
    # Every turn commits through the writer: at least its start, its items and its end, in
    # at least one transaction; a transaction holds one job or more.
    assert 0 < run["figures"]["writer_transactions_per_turn"] <= run["figures"]["writer_jobs_per_turn"]
    assert run["figures"]["writer_jobs_per_turn"] >= 3
    assert len((out / f"{label}.turns.csv").read_text().splitlines()) > 1
    # The daemon's CPU split: its loop's thread and its writer thread (found by their OS
    # names) are parts of it, and some of it is the kernel's.
    figures = run["figures"]
    assert figures["daemon_loop_cpu_ms_per_turn"] > 0 and figures["daemon_writer_cpu_ms_per_turn"] > 0
    threads_s = (figures["daemon_loop_cpu_ms_per_turn"] + figures["daemon_writer_cpu_ms_per_turn"]) * figures["turns_completed"] / 1000
    assert threads_s <= figures["daemon_cpu_s"] + 0.05  # read a moment apart: a few clock ticks
    assert 0 < figures["daemon_kernel_cpu_pct"] < 100
    # ... and set against the agents' CPU in the same window (the same work for every daemon).
    assert figures["daemon_cpu_per_provider_cpu"] == pytest.approx(figures["daemon_cpu_s"] / figures["providers_cpu_s"], rel=0.02)
    text = (out / "report.md").read_text()
    assert "turns ÷ limit" in text and label in text
    assert not list(out.glob("state-*")), "the run's state dir is removed"
    assert not procfs.processes_under(str(out)), "a process the run started is still alive"


def test_every_figure_has_a_label_in_the_report() -> None:
    assert all(n in report.LABELS for n in BURST_FIGURES + STEADY_FIGURES)


# --- the Codex fixtures ------------------------------------------------------------------


def _codex_timings(name: str) -> list[fixture.TurnTiming]:
    return fixture.read_timings(fixture.fixture_path(name))


def test_the_checked_in_codex_fixtures_are_what_the_builder_makes(tmp_path: Path) -> None:
    """replay_fixtures/bench/codex-* are exactly what `python -m bench.codex_fixture` writes."""
    codex_fixture.write(tmp_path)
    for built in sorted(tmp_path.iterdir()):
        assert built.read_bytes() == (fixture.OUT_DIR / built.name).read_bytes(), (
            f"run python -m bench.codex_fixture ({built.name})"
        )


def test_the_codex_bench_fixture_has_the_claude_fixtures_shape() -> None:
    """Turn for turn, the Codex fixture has the Claude fixture's stdout lines, tool calls,
    prompts, duration and first streamed item; the burst streams 5 deltas 20 ms apart."""
    claude = _bench_timings()
    codex = _codex_timings(codex_fixture.TURNS_NAME)
    assert [(t.stdout_lines, t.tool_calls, t.prompts, t.duration_ms, t.first_item_ms) for t in codex] == [
        (t.stdout_lines, t.tool_calls, t.prompts, t.duration_ms, t.first_item_ms) for t in claude
    ]
    path = fixture.fixture_path(codex_fixture.BURST_NAME)
    rows = [row.split("\t") for row in Path(str(path)[: -len(".jsonl")] + ".timing.tsv").read_text().splitlines()]
    at = {int(index): int(ms) for ms, _, index in rows}
    deltas = [at[i] for i, line in enumerate(path.read_text().splitlines()) if "item/agentMessage/delta" in line]
    assert len(deltas) == 5 and {b - a for a, b in itertools.pairwise(deltas)} == {20}
    assert "commandExecution" not in path.read_text()


def test_every_codex_fixture_line_has_a_recorded_shape() -> None:
    """Each line of the Codex fixtures is, by method, item type and envelope, a recorded line."""

    def shape(raw: str) -> tuple[Any, ...]:
        host = raw.startswith(fixture.HOST)
        obj = orjson.loads(raw[len(fixture.HOST) :] if host else raw)
        item = (obj.get("params") or {}).get("item") or {}
        result = obj.get("result")
        return (host, obj.get("method"), item.get("type"), "id" in obj, tuple(sorted(result)) if isinstance(result, dict) else None)

    recorded = {shape(r) for r in codex_fixture.RECORDING.read_text().splitlines() if r.strip()}
    for name in (codex_fixture.TURNS_NAME, codex_fixture.BURST_NAME):
        built = {shape(r) for r in fixture.fixture_path(name).read_text().splitlines()}
        assert built <= recorded, built - recorded


async def test_the_fake_codex_replays_the_bench_fixtures_through_the_daemon(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Every turn of the Codex fixture completes with its commands and approval, then the burst."""
    with trio.fail_after(60):
        daemon = await start_daemon(
            nursery, tmp_path / "state", replay_codex_fixture=str(fixture.fixture_path(codex_fixture.TURNS_NAME))
        )
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path, provider="replay-codex")
            for expected in _codex_timings(codex_fixture.TURNS_NAME):
                outcome = await run_turn(client, thread_id, "go")
                assert outcome.turn["status"] == "completed"
                assert len(outcome.of_kind("command")) == expected.tool_calls
                assert [r["status"] for r in outcome.requests] == ["resolved"] * expected.prompts
                assert len(outcome.assistant_text) == expected.tool_calls + 1 and all(outcome.assistant_text)
        daemon.stop()


def test_a_provider_mix_alternates_the_sessions_agents() -> None:
    """--provider claude and codex give every session one fake; mix alternates them."""
    assert session_providers("claude", 3) == ["replay"] * 3
    assert session_providers("codex", 2) == ["replay-codex"] * 2
    assert session_providers("mix", 4) == ["replay", "replay-codex", "replay", "replay-codex"]
