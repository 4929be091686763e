"""A benchmark stopped with SIGTERM stops the daemon it started (real processes).

`python -m bench prune` starts a ``t3d serve`` on a copy of a generated database; the
driver is sent SIGTERM while the daemon prunes, and no process of that state dir may be left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.procfs import processes_under

ROOT = Path(__file__).resolve().parent.parent


def processes_of(state: Path) -> list[int]:
    """The daemon and its spawner: processes whose command line names ``state``."""
    return processes_under(str(state))


def test_sigterm_to_a_bench_run_stops_its_daemon(tmp_path: Path) -> None:
    """SIGTERM to the driver mid-prune: the driver exits and within 20 s neither the daemon
    nor its spawner is running (before, both were left behind)."""
    db, out = tmp_path / "small.sqlite", tmp_path / "out"
    subprocess.run(
        [sys.executable, "-m", "bench", "gen-db", "--events", "20000", "--out", str(db)],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    driver = subprocess.Popen(
        [sys.executable, "-m", "bench", "prune", "--db", str(db), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (out / "daemon.log").is_file() or not processes_of(out / "state"):
            assert driver.poll() is None, "the prune ended before it could be stopped"
            assert time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # the daemon serves and the pass runs
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 20
        while processes_of(out / "state") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_of(out / "state") == []
    finally:
        driver.kill()
        for pid in processes_of(out / "state"):
            os.kill(pid, signal.SIGKILL)
