"""The benchmark's live-delivery figures (bench/slow.py, ``--slow-clients``).

What it pins: ``--slow-clients`` parses one count (every configuration) or two (A and B
in place of --compare) and refuses anything else with a message; a smoke run with
never-reading clients reports the first-snapshot-chunk latency, the healthy probe's
event delay with no rename lost, and the never-reading connections it held open.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
import pytest
import trio

from bench.__main__ import described_configurations, slow_clients_of

REPO = Path(__file__).resolve().parents[1]


def args(slow: str | None, compare: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(slow_clients=slow, compare=compare)


def test_slow_clients_give_one_count_to_every_configuration_or_two_to_a_and_b() -> None:
    assert slow_clients_of(args(None)) == {}
    assert slow_clients_of(args("10")) == {"A": 10, "B": 10}
    assert slow_clients_of(args("0,10")) == {"A": 0, "B": 10}
    assert described_configurations(args("0,10")) == {
        "A": {"--slow-clients": "0"},
        "B": {"--slow-clients": "10"},
    }
    assert described_configurations(args("3", "T3D_X=1")) == {
        "A": {"--slow-clients": "3"},
        "B": {"T3D_X": "1", "--slow-clients": "3"},
    }
    for bad in ("ten", "1,2,3", "-1"):
        with pytest.raises(SystemExit, match="--slow-clients"):
            slow_clients_of(args(bad))
    with pytest.raises(SystemExit, match="drop --compare"):
        slow_clients_of(args("0,10", "T3D_X=1"))


async def test_a_smoke_run_with_never_reading_clients_reports_their_figures(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-m", "bench", "run", "--profile", "smoke", "--slow-clients", "2", "--out", str(out)],
            cwd=REPO, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    (run,) = orjson.loads((out / "summary.json").read_bytes())["runs"]
    assert run["valid"], run["reasons"]
    fig = run["figures"]
    assert fig["slow_clients"] == 2 and fig["slow_connects"] >= 2
    assert (
        fig["first_chunk_samples"] >= 3
        and fig["first_chunk_p95_ms"] >= fig["first_chunk_p50_ms"] > 0
    )
    assert fig["event_delay_p50_ms"] > 0 and fig["probe_events_missed"] <= 1
    assert fig["errors"] == 0
    assert "never-reading clients" in (out / "report.md").read_text()
