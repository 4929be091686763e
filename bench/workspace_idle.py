"""``python -m bench workspace-idle --threads 250``: what watching idle workspaces costs.

A ``t3d serve`` (with the bench's git shim counting every git process) gets ``--threads``
threads, each in a repository of its own (copies of one small repository: making them
starts no git), and one shell subscription asking for workspaces, so every workspace is
watched. Once every workspace has been read (a ``workspace.updated`` with state ok for
each), nothing more happens for ``--seconds``: no turn, no edit. Reported: git processes
per minute in that window (the goal is about 0), how many looks the daemon took (each a
few stat calls per workspace), and the workspace.updated notifications sent.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.client import HttpClient, open_rpc
from bench.daemon import open_daemon, prepare_state
from bench.fixture import TURNS_NAME, fixture_path

READY_TIMEOUT_S = 600.0


def _git_calls(log: Path | None) -> int:
    return len(log.read_bytes()) // 2 if log is not None and log.exists() else 0


async def measure(threads: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="t3d-bench-idle-") as tmp:
        state = prepare_state(Path(tmp) / "state", None)
        if state.git_log is None:
            raise SystemExit("git is not installed here, so git processes cannot be counted")
        repos = [Path(tmp) / "repos" / f"r{n:04d}" for n in range(threads)]
        for repo in repos:
            shutil.copytree(state.project, repo, symlinks=True)
        async with open_daemon(state, fixture_path(TURNS_NAME), {}, Path(tmp) / "daemon.log") as daemon:
            ok: set[str] = set()
            updates = [0]
            all_read = trio.Event()

            def on_note(note: dict[str, Any], at: float) -> None:
                if note.get("kind") == "workspace.updated":
                    updates[0] += 1
                    if note["data"].get("state") == "ok":
                        ok.add(note["data"]["path"])
                        if len(ok) >= threads:
                            all_read.set()

            async with open_rpc(daemon.port, daemon.token, on_note) as rpc:
                for repo in repos:
                    project = await rpc.call("project.create", path=str(repo))
                    await rpc.call("thread.create", project_id=project["project_id"], provider="replay")
                started = time.monotonic()
                await rpc.call("subscribe.shell", workspace=True)
                with trio.fail_after(READY_TIMEOUT_S):
                    await all_read.wait()
                first_read_s = time.monotonic() - started
                http = HttpClient(daemon.port, daemon.token)
                try:
                    before = (await http.request("GET", "/api/health"))["workspace_status"]
                    git_before, updates_before = _git_calls(state.git_log), updates[0]
                    await trio.sleep(seconds)
                    git_after, updates_after = _git_calls(state.git_log), updates[0]
                    after = (await http.request("GET", "/api/health"))["workspace_status"]
                finally:
                    await http.aclose()
    return {
        "threads": threads,
        "window_s": seconds,
        "first_read_s": first_read_s,
        "git_processes_per_minute": (git_after - git_before) * 60.0 / seconds,
        "looks_per_minute": (after["checks"] - before["checks"]) * 60.0 / seconds,
        "workspace_updates": updates_after - updates_before,
        "watched": after["watched"],
    }


def command(args: argparse.Namespace) -> int:
    if args.threads < 1 or args.seconds <= 0:
        raise SystemExit("--threads must be at least 1 and --seconds above 0")
    result = trio.run(measure, args.threads, args.seconds)
    print(
        f"workspace-idle: {result['threads']} threads watched ({result['watched']} workspaces), first read of all "
        f"in {result['first_read_s']:.1f} s; then idle for {result['window_s']:g} s: "
        f"{result['git_processes_per_minute']:.1f} git processes/min, {result['looks_per_minute']:.0f} looks/min, "
        f"{result['workspace_updates']} workspace.updated sent"
    )
    return 0
