"""The git benchmarks run end to end on small inputs: `bench git-large` measures every figure
on a generated repository it then reuses, and `bench workspace-idle` counts no git process
for watched idle workspaces."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import trio

from bench import git_large, workspace_idle


def test_git_large_measures_each_figure_and_reuses_its_repository(tmp_path: Path) -> None:
    """Both untracked-cache settings get a p50 of git status, the refresh, the steady look and
    both captures, and the captures the way they were before (add -A); an edit capture takes
    4 git processes and a steady one 1; the repository is generated once."""
    out = tmp_path / "git-large.json"
    args = argparse.Namespace(files=300, runs=2, dir=str(tmp_path / "large"), out=str(out))
    assert git_large.command(args) == 0
    report = orjson.loads(out.read_bytes())
    for name in ("off", "on"):
        config = report["configs"][name]
        assert set(config["p50_s"]) == {
            "git_status", "refresh", "steady_look", "capture", "steady_capture", "add_all_capture", "add_all_steady_capture",
        }  # fmt: skip
        assert all(value > 0 for value in config["p50_s"].values())
        assert config["refresh_vs_git_status"] > 0 and config["capture_vs_git_status"] > 0
        assert 4 in config["git_processes_per_capture"] and 1 in config["git_processes_per_capture"]
    ready = tmp_path / "large" / "ready"
    stamp = ready.stat().st_mtime_ns
    assert git_large.command(argparse.Namespace(files=300, runs=1, dir=str(tmp_path / "large"), out=None)) == 0
    assert ready.stat().st_mtime_ns == stamp, "the repository was generated again"


def test_workspace_idle_counts_no_git_process_for_idle_watched_workspaces() -> None:
    """Three threads in repositories of their own, watched through a shell subscription: once
    each was read, an idle second starts no git process and sends no workspace.updated."""
    result = trio.run(workspace_idle.measure, 3, 1.0)
    assert result["watched"] == 3
    assert result["git_processes_per_minute"] == 0
    assert result["workspace_updates"] == 0
