"""``python -m bench git-large --files 100000``: workspace status and checkpoints on a large repository.

The repository (``--files`` one-line files, 100 per directory, all committed, plus three
untracked files) is generated once under ``--dir`` (default
``/tmp/t3d-bench-git-large/<files>``; a ``ready`` file there marks it whole) and reused.
For each untracked-cache setting of the repository ("off": the index has none, as
``git init`` leaves it; "on": ``core.untrackedCache=true`` and an index holding one, as
``feature.manyFiles`` sets), ``--runs`` rounds, each after one more file was edited:

- ``git status``, as a user runs it (its own process, the repository's settings);
- t3d's status refresh: what `WorkspaceStatuses` runs after a turn that changed files:
  ``status.look`` on a worker thread, ``git status --porcelain=v2`` through the
  spawner's git pool (no optional locks), parsed;
- t3d's look when nothing changed (the steady case: stat calls on a worker thread, no
  process);
- a checkpoint capture (``Checkpoints.capture``: ``git status`` on the checkpoint index,
  ``update-index`` of the paths it names and ``write-tree``, the commit and ref written
  in-process, ``git diff --numstat``), and a steady one right after it (nothing changed
  since: the turn that edited nothing);
- the same capture the way it was before (A/B in the same rounds): ``git add -A -- .``
  and ``write-tree`` on an index of its own (not split, no untracked cache), then the
  numstat; and its steady one.

The order of the timed steps alternates between rounds (status and refresh; the two
captures). Reported: the p50 of each, and the refresh and the captures as multiples of
``git status``'s p50 (the goal is at most 1.5x). With ``--out FILE`` the samples are
written as JSON too.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import trio

from bench.stats import percentile, ratio
from t3d.config import Settings
from t3d.domain.events import CaptureCheckpoint
from t3d.git import checkpoints as plan
from t3d.git import status as st
from t3d.git.refs import GitRunner
from t3d.git.service import Checkpoints
from t3d.spawn.sidecar import open_spawner
from t3d.store.store import open_store

PER_DIR = 100
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost",
}  # fmt: skip


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


def _file(repo: Path, n: int) -> Path:
    d = n // PER_DIR
    return repo / "src" / f"m{d // 100:03d}" / f"d{d:05d}" / f"f{n % PER_DIR:03d}.txt"


def generate(root: Path, files: int) -> Path:
    """The repository of ``files`` files under ``root`` (made once; reused while ``ready`` exists)."""
    repo = root / "repo"
    if (root / "ready").exists():
        return repo
    shutil.rmtree(root, ignore_errors=True)
    repo.mkdir(parents=True)
    print(f"[git-large] generating {files} files in {repo} (once)", file=sys.stderr, flush=True)
    started = time.monotonic()
    _git(repo, "init", "-q", "-b", "main")
    for n in range(files):
        path = _file(repo, n)
        if n % PER_DIR == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {n}\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"{files} files")
    for name in ("untracked-a.txt", "untracked-b.txt", "src/untracked-c.txt"):
        (repo / name).write_text("untracked\n")
    (root / "ready").write_text(f"{files}\n")
    print(f"[git-large] generated in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return repo


def _drop_checkpoint_refs(repo: Path) -> None:
    refs = _git(repo, "for-each-ref", "--format=delete %(refname)", "refs/t3d/")
    if refs:
        subprocess.run(["git", "update-ref", "--stdin"], cwd=repo, env=GIT_ENV, input=refs, text=True, check=True)


def set_untracked_cache(repo: Path, on: bool) -> None:
    """Start a configuration from the committed files, with or without the untracked cache,
    and no checkpoint refs (each capture then writes its own)."""
    _git(repo, "reset", "-q", "--hard")
    _drop_checkpoint_refs(repo)
    for shared in (repo / ".git").glob("sharedindex.*"):  # the last run's checkpoint indexes'
        shared.unlink()
    if on:
        _git(repo, "config", "core.untrackedCache", "true")
        _git(repo, "update-index", "--untracked-cache")
    else:
        subprocess.run(["git", "config", "--unset", "core.untrackedCache"], cwd=repo, env=GIT_ENV, check=False)
        _git(repo, "update-index", "--no-untracked-cache")
    _git(repo, "status", "--porcelain")  # as a user would have, once: the index's stat data is fresh


def _plain_status(repo: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["git", "status"], cwd=repo, env=GIT_ENV, check=True, capture_output=True)
    return time.perf_counter() - started


async def measure(repo: Path, runs: int, state_dir: Path) -> dict[str, Any]:
    samples: dict[str, list[float]] = {
        "git_status": [], "refresh": [], "steady_look": [], "capture": [], "steady_capture": [],
        "add_all_capture": [], "add_all_steady_capture": [],
    }  # fmt: skip
    capture_git: list[int] = []
    settings = Settings(state_dir=state_dir)

    def lost(error: BaseException | None) -> None:
        raise SystemExit(f"the bench's database writer died: {error!r}")

    async with (
        open_store(state_dir / "t3d.sqlite", on_writer_lost=lost) as store,
        open_spawner(settings) as spawner,
        trio.open_nursery() as nursery,
    ):
        checkpoints = Checkpoints(nursery, store, spawner, state_dir)
        runner = GitRunner(spawner)

        async def plain_status() -> float:
            return await trio.to_thread.run_sync(_plain_status, repo)

        def edit(path: Path) -> None:
            path.write_text(path.read_text() + "edited\n")

        async def refresh() -> float:
            started = time.perf_counter()
            look = await trio.to_thread.run_sync(st.look, str(repo))
            out = await runner.run(st.STATUS_ARGV, cwd=str(repo), read_only=True, output_cap=st.STATUS_CAP)
            counts = st.parse_status(out.stdout, truncated=out.truncated)
            assert look.info is not None and counts.unstaged >= 0
            return time.perf_counter() - started

        async def capture(ordinal: int) -> float:
            before = checkpoints.git.processes
            started = time.perf_counter()
            done = await checkpoints.capture(CaptureCheckpoint("bench", f"turn-{ordinal}", ordinal, str(repo)))
            took = time.perf_counter() - started
            if done.status != "ok":
                raise SystemExit(f"checkpoint capture failed: {done.error}")
            capture_git.append(checkpoints.git.processes - before)
            return took

        add_all_index = str(state_dir / "add-all-index")
        shutil.copyfile(repo / ".git" / "index", add_all_index)
        add_all_tree = ""

        async def add_all_capture() -> float:
            """The capture before status named the paths: add -A, write-tree, the numstat."""
            nonlocal add_all_tree
            started = time.perf_counter()
            await runner.run(("git", "add", "-A", "--", "."), cwd=str(repo), index_file=add_all_index)
            out = await runner.run(("git", "write-tree"), cwd=str(repo), index_file=add_all_index)
            tree = out.stdout.decode().strip()
            if add_all_tree and tree != add_all_tree:
                await runner.run(plan.numstat_argv(add_all_tree, tree), cwd=str(repo), read_only=True)
            add_all_tree = tree
            return time.perf_counter() - started

        await capture(0)  # the first capture seeds the checkpoint index from the repository's
        await add_all_capture()
        await refresh()
        for n in range(runs):
            path = _file(repo, n * 7919 % max(1, _count(repo)))
            await trio.to_thread.run_sync(edit, path)
            steps = [("git_status", plain_status), ("refresh", refresh)]
            for name, step in steps if n % 2 == 0 else reversed(steps):
                samples[name].append(await step())
            captures: list[tuple[str, Callable[[], Awaitable[float]]]] = [
                ("capture", functools.partial(capture, 2 * n + 1)),
                ("add_all_capture", add_all_capture),
            ]
            for name, take in captures if n % 2 == 0 else reversed(captures):
                samples[name].append(await take())
            samples["steady_capture"].append(await capture(2 * n + 2))
            samples["add_all_steady_capture"].append(await add_all_capture())
            look = await trio.to_thread.run_sync(st.look, str(repo))
            started = time.perf_counter()
            assert await trio.to_thread.run_sync(st.unchanged, look)
            samples["steady_look"].append(time.perf_counter() - started)
        nursery.cancel_scope.cancel()
    p50 = {name: percentile(values, 50) for name, values in samples.items()}
    return {
        "p50_s": p50,
        "refresh_vs_git_status": ratio(p50["refresh"], p50["git_status"]),
        "capture_vs_git_status": ratio(p50["capture"], p50["git_status"]),
        "steady_capture_vs_git_status": ratio(p50["steady_capture"], p50["git_status"]),
        "add_all_capture_vs_git_status": ratio(p50["add_all_capture"], p50["git_status"]),
        "add_all_steady_capture_vs_git_status": ratio(p50["add_all_steady_capture"], p50["git_status"]),
        "git_processes_per_capture": capture_git,
        "samples_s": samples,
    }


def _count(repo: Path) -> int:
    return int((repo.parent / "ready").read_text())


def command(args: argparse.Namespace) -> int:
    root = Path(args.dir or f"/tmp/t3d-bench-git-large/{args.files}")
    repo = generate(root, args.files)
    version = _git(repo, "--version").strip()
    report: dict[str, Any] = {"files": args.files, "repository": str(repo), "git": version, "runs": args.runs, "configs": {}}
    print(f"git-large: {args.files} files in {repo}, {version}, {args.runs} rounds per configuration")
    for name in ("off", "on"):
        set_untracked_cache(repo, name == "on")
        state_dir = root / f"state-{name}"
        shutil.rmtree(state_dir, ignore_errors=True)
        state_dir.mkdir()
        result = trio.run(measure, repo, args.runs, state_dir)
        report["configs"][name] = result
        p50 = result["p50_s"]
        print(
            f"  untracked cache {name:>3}: git status p50 {p50['git_status']:.3f} s | "
            f"t3d status refresh p50 {p50['refresh']:.3f} s ({result['refresh_vs_git_status']:.2f}x) | "
            f"checkpoint capture p50 {p50['capture']:.3f} s ({result['capture_vs_git_status']:.2f}x, "
            f"{max(result['git_processes_per_capture'])} git processes), steady {p50['steady_capture']:.3f} s "
            f"({result['steady_capture_vs_git_status']:.2f}x, {min(result['git_processes_per_capture'])}) | "
            f"before (add -A): capture {p50['add_all_capture']:.3f} s ({result['add_all_capture_vs_git_status']:.2f}x), "
            f"steady {p50['add_all_steady_capture']:.3f} s ({result['add_all_steady_capture_vs_git_status']:.2f}x) | "
            f"steady look p50 {p50['steady_look'] * 1e6:.0f} us, no process"
        )
    _git(repo, "reset", "-q", "--hard")
    _drop_checkpoint_refs(repo)
    if args.out:
        Path(args.out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return 0
