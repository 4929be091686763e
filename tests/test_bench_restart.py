"""The benchmark's restart driver (bench/restart.py): the recording's text per turn, and a
short run that restarts a real daemon on the same state dir and reports what it cost."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import trio

from bench import procfs
from bench import restart as r
from bench.figures import RESTART_FIGURES
from bench.fixture import fixture_path
from bench.profiles import CODEX_FIXTURES, TURNS_FIXTURE
from bench.report import LABELS

REPO = Path(__file__).resolve().parent.parent


def test_each_fixture_turn_has_its_final_text() -> None:
    """The bench fixture's five turns each end with an assistant text, and they differ (so a
    turn compared with the wrong turn of the recording does not pass)."""
    texts = r.fixture_final_texts(fixture_path(TURNS_FIXTURE))
    assert len(texts) == 5 and all(texts)
    assert len(set(texts)) == 5


def test_each_codex_fixture_turn_has_its_final_text() -> None:
    """The Codex bench fixture's five turns (one per turn/start) each end with a completed
    agentMessage, and they differ, so restarted Codex turns are checked against the recording."""
    texts = r.fixture_final_texts(fixture_path(CODEX_FIXTURES[TURNS_FIXTURE]))
    assert len(texts) == 5 and all(texts)
    assert len(set(texts)) == 5


def test_a_turn_is_ranked_within_the_provider_process_that_played_it() -> None:
    """A thread's turns are ranked per provider process (pid, possibly over several session
    rows): a process started again begins at the recording's first turn."""
    turns = {
        name: {"thread_id": "t", "started_at": at}
        for name, at in (("a", 1.0), ("b", 2.0), ("c", 5.0), ("d", 6.0), ("e", 7.0))
    }
    processes = {("t", 10): [0.5, 4.0], ("t", 11): [4.5, 6.5], ("t", 12): [6.8, float("inf")]}
    r._rank_by_process(turns, processes)
    assert [turns[n]["played"] for n in "abcde"] == [1, 2, 1, 2, 1]


def test_every_restart_figure_has_a_label() -> None:
    """The report names every restart figure."""
    assert all(name in LABELS for name in RESTART_FIGURES)


async def test_a_smoke_run_restarts_the_daemon_and_reports_each_restart(tmp_path: Path) -> None:
    """`python -m bench run --profile smoke --restart-every 5` restarts the daemon twice in a
    12 s window on the same state dir and port; the clients connect again, every session
    produces output, and the run reports each restart (exit status, time to serving again,
    agents noted) and a row per turn in flight at a restart; nothing it started is left."""
    out = tmp_path / "out"
    with trio.fail_after(150):
        done = await trio.run_process(
            [sys.executable, "-m", "bench", "run", "--profile", "smoke", "--restart-every", "5",
             "--restart-signal", "KILL", "--out", str(out)],
            cwd=REPO, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    (run,) = orjson.loads((out / "summary.json").read_bytes())["runs"]
    assert run["valid"], run["reasons"]
    fig = run["figures"]
    assert fig["restarts"] == 2
    assert fig["restart_serving_max_s"] is not None and fig["restart_serving_max_s"] > 0
    assert all(fig[name] is not None for name in RESTART_FIGURES)
    restarts = (out / f"{run['label']}.restarts.csv").read_text().splitlines()
    assert restarts[0].startswith("at_s,signal,exit_code") and len(restarts) == 3
    assert all(",KILL,-9," in line for line in restarts[1:])
    turns = (out / f"{run['label']}.restarted-turns.csv").read_text().splitlines()
    assert len(turns) == fig["restarted_turns"] + (1 if fig["restarted_turns"] else 0)
    assert sum("restart 1 (SIGKILL)" in n or "restart 2 (SIGKILL)" in n for n in run["notes"]) == 2
    assert not procfs.processes_under(str(out)), "a process the run started is still alive"
