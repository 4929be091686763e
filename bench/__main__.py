"""``python -m bench run ...``: run a load profile against fresh daemons and write a report.

    python -m bench run --profile primary --sessions 250 --window 300 --warmup 60 --out DIR
    python -m bench run --profile stress --sessions 50,150 --runs 3 --compare 'T3D_X=false'
    python -m bench report DIR [DIR ...] --out DIR   # one report over earlier summaries

``--sessions`` takes a comma-separated list (a sweep: one daemon per run, every session
count its own row and chart point). ``--compare 'ENV=VALUE ...'`` runs configuration A
(the default settings) and B (A plus these variables in the daemon's environment)
interleaved, A B A B, each run from the same starting database. ``--pin`` pins the daemon
(and everything it starts) to the first half of the CPUs and the driver to the rest.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from bench import charts, report
from bench.fixture import REPO, fixture_path, read_timings
from bench.profiles import PROFILES, Profile
from bench.runner import RunSpec, run_once


def parse_compare(text: str) -> dict[str, str]:
    """'A=1 B="x y"' -> {"A": "1", "B": "x y"}. Pure."""
    env = {}
    for word in shlex.split(text):
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise SystemExit(f"--compare takes ENV=VALUE words; {word!r} has no '='")
        env[name] = value
    return env


def parse_sessions(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(
            f"--sessions takes a number or a comma-separated list, not {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise SystemExit("--sessions must be at least 1")
    return values


def machine() -> dict[str, Any]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpus": os.cpu_count(), "cpu_model": model, "mem_gib": mem_kib / 1024 / 1024,
        "kernel": platform.release(), "python": platform.python_version(),
        "loadavg": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }  # fmt: skip


def code_version() -> str:
    """The commit the daemon ran from, and whether the work tree had changes on top."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "t3d", "spawner"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes in t3d/ or spawner/" if dirty else "")


def pin_sets(pin: bool) -> tuple[str | None, str | None]:
    if not pin:
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    half = len(cpus) // 2
    return ",".join(map(str, cpus[:half])), ",".join(map(str, cpus[half:]))


def plan_runs(args: argparse.Namespace, profile: Profile, out: Path) -> list[RunSpec]:
    configs = {"A": {}} if not args.compare else {"A": {}, "B": parse_compare(args.compare)}
    daemon_cpus, driver_cpus = pin_sets(args.pin)
    specs = []
    for n in parse_sessions(args.sessions) if args.sessions else [profile.sessions]:
        for k in range(args.runs):
            for name, env in configs.items():
                specs.append(RunSpec(
                    f"{profile.name}-{n}-{name}{k + 1}", name, env, profile, n,
                    args.window if args.window is not None else profile.window_s,
                    args.warmup if args.warmup is not None else profile.warmup_s,
                    out, Path(args.db) if args.db else None, daemon_cpus, driver_cpus, args.keep_state,
                ))  # fmt: skip
    return specs


async def run_all(specs: list[RunSpec]) -> list[dict[str, Any]]:
    results = []
    for spec in specs:
        print(
            f"[bench] {spec.label}: {spec.sessions} session(s), warm-up {spec.warmup_s:g} s, window {spec.window_s:g} s",
            file=sys.stderr,
            flush=True,
        )
        result = await run_once(spec)
        state = "valid" if result.valid else "INVALID: " + "; ".join(result.reasons)
        print(f"[bench] {spec.label}: {state}", file=sys.stderr, flush=True)
        results.append(attrs.asdict(result))
    return results


def write_report(summary: dict[str, Any], out: Path, series_dirs: list[Path] | None = None) -> None:
    configs = list(summary["configs"])
    drawn, why_not = charts.draw(summary["results"], configs, out, summary["burst"])
    memory = (
        None
        if summary["burst"] or why_not
        else charts.draw_memory(out, summary["runs"], series_dirs or [out])
    )
    text = report.render(summary, drawn, memory)
    if why_not:
        text += f"\n{why_not}\n"
    (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    (out / "report.md").write_text(text)


def command_run(args: argparse.Namespace) -> int:
    profile = PROFILES[args.profile]
    out = Path(args.out or f"bench-out/{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    specs = plan_runs(args, profile, out)
    if specs[0].driver_cpus:  # the coordinator (it samples /proc) is part of the driver
        os.sched_setaffinity(0, {int(c) for c in specs[0].driver_cpus.split(",")})
    fixture = fixture_path(profile.fixture)
    timings = read_timings(fixture)
    summary: dict[str, Any] = {
        "profile": profile.name, "profile_description": profile.describe(), "burst": profile.burst,
        "command": shlex.join(["python", "-m", "bench", *sys.argv[1:]]),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(), "code": code_version(),
        "window_s": specs[0].window_s, "warmup_s": specs[0].warmup_s, "runs_per_config": args.runs,
        "configs": {"A": {}} if not args.compare else {"A": {}, "B": parse_compare(args.compare)},
        "fixture": {
            "name": fixture.name,
            "turn_s": sum(t.duration_ms for t in timings) / len(timings) / 1000,
            "first_item_ms": sum(t.first_item_ms or 0 for t in timings) / len(timings),
        },
    }  # fmt: skip
    runs = trio.run(run_all, specs)
    summary["runs"] = runs
    summary["results"] = report.summarize(runs, list(summary["configs"]), profile.burst)
    write_report(summary, out)
    valid = sum(1 for r in runs if r["valid"])
    print(
        f"[bench] {valid} of {len(runs)} run(s) valid; report: {out / 'report.md'}", file=sys.stderr
    )
    return 0 if valid else 1


def command_report(args: argparse.Namespace) -> int:
    """Merge earlier summaries of one profile and configuration set into one report."""
    summaries = [orjson.loads((Path(d) / "summary.json").read_bytes()) for d in args.dirs]
    merged = dict(summaries[0])
    merged["runs"] = [r for s in summaries for r in s["runs"]]
    merged["command"] = "; ".join(s["command"] for s in summaries)
    merged["started_at"] = "; ".join(s["started_at"] for s in summaries)
    merged["machine"] = {
        **merged["machine"],
        "loadavg": "; ".join(s["machine"]["loadavg"] for s in summaries),
    }
    merged["code"] = "; ".join(sorted({s.get("code", "unknown") for s in summaries}))
    merged["results"] = report.summarize(merged["runs"], list(merged["configs"]), merged["burst"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_report(merged, out, [Path(d) for d in args.dirs])
    print(out / "report.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a profile and write CSVs, summary.json and report.md")
    run.add_argument("--profile", choices=sorted(PROFILES), default="primary")
    run.add_argument(
        "--sessions", help="number of sessions, or a comma-separated list (default: the profile's)"
    )
    run.add_argument(
        "--window", type=float, help="measured window in seconds (default: the profile's)"
    )
    run.add_argument(
        "--warmup", type=float, help="warm-up in seconds before the window (default: the profile's)"
    )
    run.add_argument("--runs", type=int, default=1, help="runs per configuration and session count")
    run.add_argument("--out", help="output directory (default: bench-out/PROFILE-TIME)")
    run.add_argument("--db", help="start every run from a copy of this database file")
    run.add_argument("--compare", help="'ENV=VALUE ...': configuration B; runs A B A B interleaved")
    run.add_argument(
        "--pin", action="store_true", help="pin daemon and driver to separate CPUs (taskset)"
    )
    run.add_argument(
        "--keep-state", action="store_true", help="keep each run's state dir (database, logs)"
    )
    merge = sub.add_parser("report", help="one report over earlier runs' summary.json files")
    merge.add_argument("dirs", nargs="+")
    merge.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.runs < 1:
            parser.error("--runs must be at least 1")
        return command_run(args)
    return command_report(args)


if __name__ == "__main__":
    sys.exit(main())
