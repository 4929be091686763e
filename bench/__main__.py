"""``python -m bench run ...``: run a load profile against fresh daemons and write a report.

    python -m bench run --profile primary --sessions 250 --window 300 --warmup 60 --out DIR
    python -m bench run --profile stress --sessions 50,150 --runs 3 --compare 'T3D_X=false'
    python -m bench run --profile primary --sessions 250 --provider codex   # or mix
    python -m bench run --profile primary --sessions 250 --fixtures plain,subagents
    python -m bench report DIR [DIR ...] --out DIR   # one report over earlier summaries
    python -m bench prune --db PATH                  # retention on a database: sizes and time
    python -m bench git-large --files 100000         # status and checkpoints on a large repo
    python -m bench workspace-idle --threads 250     # git processes of watched idle threads
    python -m bench flood --connections 1000 --seconds 60   # health under a connection flood

``--sessions`` takes a comma-separated list (a sweep: one daemon per run, every session
count its own row and chart point). ``--compare 'ENV=VALUE ...'`` runs configuration A
(the default settings) and B (A plus these variables in the daemon's environment)
interleaved, A B A B, each run from the same starting database; ``--env 'ENV=VALUE ...'``
sets variables for every configuration. ``--pin`` pins the daemon
(and everything it starts) to the first half of the CPUs and the driver to the rest.
``--slow-clients 0,10`` compares in the same way, A with no never-reading client and B
with 10 (see bench/slow.py). ``--pollers http,mcp`` too: A's approval pollers poll over HTTP
every poll_s, B's long-poll MCP's wait_for_request (``--pollers mcp``: every run so).
``--scrape-interval 0,1`` too: A with no scraper, B with a Prometheus-like client scraping
``GET /metrics`` every second (bench/scraper.py); the daemon CPU of each is the cost.
``--fixtures plain,subagents`` too: A's Claude sessions replay the plain bench turns, B's the
same turns with two foreground subagents each (bench/subagent_fixture.py; same lines per turn
and duration), so each configuration's daemon CPU per turn shows what child threads cost
(``--fixtures subagents``: every run so; Claude sessions and a profile with turns only).
``--restart-every 60 --restart-signal TERM|KILL`` restarts the
daemon on the same state dir every 60 s of the window and reports what the restarts cost
(see bench/restart.py):

    python -m bench run --profile primary --sessions 100 --window 600 --restart-every 60 --restart-signal KILL
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from bench import charts, report
from bench import restart as r
from bench.fixture import REPO, fixture_path, read_timings
from bench.profiles import FIXTURE_KINDS, PROFILES, PROVIDER_MIXES, Profile
from bench.runner import RunSpec, fixture_turn_s, run_once


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


def code_version(root: Path = REPO) -> str:
    """The commit of the checkout at ``root``, and whether its work tree had changes on top."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "t3d", "spawner"],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes in t3d/ or spawner/" if dirty else "")


def daemon_code(env: dict[str, str]) -> str:
    """Which ``t3d`` a daemon started with ``env`` (``--env``/``--compare``, e.g. a
    PYTHONPATH naming a worktree) runs: its checkout and commit. The daemon runs from its
    state dir, so the bench's own directory never shadows a PYTHONPATH."""
    probe = subprocess.run(
        [sys.executable, "-c", "import os, t3d; print(os.path.dirname(os.path.dirname(os.path.abspath(t3d.__file__))))"],
        capture_output=True, text=True, cwd="/", env={**os.environ, **env},
    )  # fmt: skip
    if probe.returncode != 0:
        raise SystemExit(f"the daemon could not import t3d with {env}: {probe.stderr.strip()}")
    root = Path(probe.stdout.strip())
    return f"{root} at {code_version(root)}"


def pin_sets(pin: bool) -> tuple[str | None, str | None]:
    if not pin:
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    half = len(cpus) // 2
    return ",".join(map(str, cpus[:half])), ",".join(map(str, cpus[half:]))


def slow_clients_of(args: argparse.Namespace) -> dict[str, int]:
    """Never-reading clients per configuration: ``--slow-clients K`` gives every configuration
    K; ``--slow-clients K1,K2`` makes A run with K1 and B with K2 (instead of --compare)."""
    text = getattr(args, "slow_clients", None)
    if text is None:
        return {}
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"--slow-clients takes a number or two, comma-separated, not {text!r}") from None
    if not 1 <= len(counts) <= 2 or min(counts) < 0:
        raise SystemExit("--slow-clients takes one or two counts of at least 0, such as 10 or 0,10")
    if len(counts) == 2 and args.compare:
        raise SystemExit("--slow-clients K1,K2 compares two counts as configurations A and B; drop --compare, or give one count")
    return {"A": counts[0], "B": counts[-1]}


POLLERS = ("http", "mcp")


def pollers_of(args: argparse.Namespace) -> dict[str, str]:
    """The approval pollers per configuration: ``--pollers K`` for every one; ``K1,K2``: A with
    K1, B with K2 (instead of --compare or two --slow-clients counts)."""
    text = getattr(args, "pollers", None) or "http"
    kinds = text.split(",")
    if not 1 <= len(kinds) <= 2 or any(k not in POLLERS for k in kinds):
        raise SystemExit(f"--pollers takes http, mcp or http,mcp, not {text!r}")
    if len(kinds) == 2 and (args.compare or "," in (getattr(args, "slow_clients", None) or "")):
        raise SystemExit("--pollers K1,K2 compares two kinds of pollers as configurations A and B; drop --compare (or the second --slow-clients count), or give one kind")
    return {"A": kinds[0], "B": kinds[-1]}


def snapshot_log_period(text: str) -> float:
    """``--snapshot-log S``: 0 (off) or 1-3600 seconds."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes seconds, not {text!r}") from None
    if seconds != 0 and not 1 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"takes 0 (off) or 1-3600 seconds, not {text}")
    return seconds


def scrape_intervals_of(args: argparse.Namespace) -> dict[str, float]:
    """Seconds between scrapes of GET /metrics per configuration (0: no scraper):
    ``--scrape-interval S`` for every configuration; ``S1,S2``: A with S1, B with S2."""
    text = getattr(args, "scrape_interval", None)
    if text is None:
        return {}
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"--scrape-interval takes seconds, or two comma-separated, not {text!r}") from None
    if not 1 <= len(values) <= 2 or any(v != 0 and not 0.1 <= v <= 60 for v in values):
        raise SystemExit("--scrape-interval takes one or two intervals of 0 (no scraper) or 0.1-60 s, such as 1 or 0,1")
    others = [getattr(args, name, None) or "" for name in ("slow_clients", "pollers")]
    if len(values) == 2 and (args.compare or any("," in other for other in others)):
        raise SystemExit("--scrape-interval S1,S2 compares two intervals as configurations A and B; drop --compare (and the other A/B lists), or give one interval")
    return {"A": values[0], "B": values[-1]}


def fixtures_of(args: argparse.Namespace) -> dict[str, str | None]:
    """The Claude sessions' fixture per configuration (None: the profile's own):
    ``--fixtures K`` for every one; ``K1,K2``: A with K1, B with K2 (instead of the other
    A/B options)."""
    text = getattr(args, "fixtures", None) or "plain"
    kinds = text.split(",")
    if not 1 <= len(kinds) <= 2 or any(k not in FIXTURE_KINDS for k in kinds):
        raise SystemExit(f"--fixtures takes plain, subagents or plain,subagents, not {text!r}")
    profile = PROFILES.get(getattr(args, "profile", None) or "primary")
    provider = getattr(args, "provider", None) or "claude"
    if "subagents" in kinds and (provider != "claude" or (profile is not None and profile.burst)):
        raise SystemExit("--fixtures subagents replays the Claude turns with two subagents each: it needs --provider claude and a profile with turns (not burst)")
    others = [getattr(args, name, None) or "" for name in ("slow_clients", "pollers", "scrape_interval")]
    if len(kinds) == 2 and (args.compare or any("," in other for other in others)):
        raise SystemExit("--fixtures K1,K2 compares two fixtures as configurations A and B; drop --compare (and the other A/B lists), or give one fixture")
    return {"A": FIXTURE_KINDS[kinds[0]], "B": FIXTURE_KINDS[kinds[-1]]}


def configurations(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Each configuration's environment for the daemon (``--env`` under every one)."""
    base = parse_compare(args.env) if getattr(args, "env", None) else {}
    if args.compare:
        return {"A": base, "B": {**base, **parse_compare(args.compare)}}
    two = any("," in (getattr(args, name, None) or "") for name in ("slow_clients", "pollers", "scrape_interval", "fixtures"))
    return {"A": base, "B": dict(base)} if two else {"A": base}


def described_configurations(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """What the report shows for each configuration: its environment, its slow clients, its
    pollers, its scraper and its fixture."""
    slow, pollers, scrape = slow_clients_of(args), pollers_of(args), scrape_intervals_of(args)
    kinds = (getattr(args, "fixtures", None) or "").split(",")
    return {
        name: {
            **env,
            **({"--slow-clients": str(slow[name])} if slow else {}),
            **({"--pollers": pollers[name]} if getattr(args, "pollers", None) else {}),
            **({"--scrape-interval": f"{scrape[name]:g}"} if scrape else {}),
            **({"--fixtures": kinds[0 if name == "A" else -1]} if getattr(args, "fixtures", None) else {}),
        }
        for name, env in configurations(args).items()
    }


def plan_runs(args: argparse.Namespace, profile: Profile, out: Path) -> list[RunSpec]:
    configs = configurations(args)
    slow, pollers, scrape = slow_clients_of(args), pollers_of(args), scrape_intervals_of(args)
    fixtures = fixtures_of(args)
    daemon_cpus, driver_cpus = pin_sets(args.pin)
    specs = []
    for n in parse_sessions(args.sessions) if args.sessions else [profile.sessions]:
        for k in range(args.runs):
            for name, env in configs.items():
                provider = getattr(args, "provider", "claude")
                tag = "" if provider == "claude" else f"{provider}-"
                specs.append(RunSpec(
                    f"{profile.name}-{tag}{n}-{name}{k + 1}", name, env, profile, n,
                    args.window if args.window is not None else profile.window_s,
                    args.warmup if args.warmup is not None else profile.warmup_s,
                    out, Path(args.db) if args.db else None, daemon_cpus, driver_cpus, args.keep_state,
                    slow.get(name), args.restart_every, args.restart_signal, pollers[name], provider,
                    scrape.get(name) or None, fixtures[name], getattr(args, "snapshot_log", 0) or None,
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
    provider = args.provider
    claude = list(dict.fromkeys(spec.claude_fixture for spec in specs))  # A's, then B's if another
    used = [name for p in PROVIDER_MIXES[provider] for name in (claude if p == "replay" else [profile.codex_fixture])]
    sessions = parse_sessions(args.sessions)[0] if args.sessions else profile.sessions
    timings = [t for name in used for t in read_timings(fixture_path(name))]
    turn_s = [fixture_turn_s(profile, provider, sessions, spec.fixture) for spec in specs]
    summary: dict[str, Any] = {
        "profile": profile.name, "profile_description": profile.describe(), "burst": profile.burst,
        "command": shlex.join(["python", "-m", "bench", *sys.argv[1:]]),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(), "code": code_version(),
        "window_s": specs[0].window_s, "warmup_s": specs[0].warmup_s, "runs_per_config": args.runs,
        "configs": {
            name: {**shown, "t3d": daemon_code(env)}
            for (name, shown), env in zip(described_configurations(args).items(), configurations(args).values(), strict=True)
        },
        "restart": None if args.restart_every is None else {"every_s": args.restart_every, "signal": args.restart_signal},
        "provider": provider,
        "fixture": {
            "name": " + ".join(f"{name}.jsonl" for name in used),
            "turn_s": sum(turn_s) / len(turn_s),
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


def _interrupt(signum: int, frame: object) -> None:
    signal.raise_signal(signal.SIGINT)


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
    run.add_argument(
        "--provider", choices=sorted(PROVIDER_MIXES), default="claude",
        help="the sessions' agents: claude (the fake claude), codex (the fake codex) or mix (alternately)",
    )  # fmt: skip
    run.add_argument("--out", help="output directory (default: bench-out/PROFILE-TIME)")
    run.add_argument("--db", help="start every run from a copy of this database file")
    run.add_argument("--compare", help="'ENV=VALUE ...': configuration B; runs A B A B interleaved")
    run.add_argument(
        "--env", help="'ENV=VALUE ...': settings for the daemon in every configuration (A and B)"
    )
    run.add_argument(
        "--pin", action="store_true", help="pin daemon and driver to separate CPUs (taskset)"
    )
    run.add_argument(
        "--keep-state", action="store_true", help="keep each run's state dir (database, logs)"
    )
    run.add_argument(
        "--snapshot-log", type=snapshot_log_period, default=0, metavar="S",
        help="every S seconds, read how many MiB of item snapshots the database's log still holds "
        "(the driver scans the events table read-only; for retention runs, not for multi-GB --db files)",
    )
    run.add_argument(
        "--slow-clients",
        help="K: add K clients that subscribe to everything and never read, plus probes of a "
        "healthy client's event delay and first snapshot chunk (bench/slow.py); "
        "K1,K2: configuration A with K1, B with K2, interleaved",
    )
    run.add_argument(
        "--restart-every",
        type=float,
        metavar="S",
        help="restart the daemon on the same state dir every S seconds of the window (bench/restart.py)",
    )
    run.add_argument(
        "--restart-signal",
        choices=sorted(r.SIGNALS),
        default="TERM",
        help="how the daemon is stopped at each restart: TERM (a service manager's stop) or KILL (a crash)",
    )
    run.add_argument(
        "--pollers",
        help="the approval pollers: http (GET /api/requests/pending and the shell every poll "
        "period, the default), mcp (a long-poll on /mcp's wait_for_request for each bot's own threads), or http,mcp: "
        "configuration A with http, B with mcp, interleaved",
    )
    run.add_argument(
        "--scrape-interval",
        help="S: a Prometheus-like client scrapes GET /metrics every S seconds, recording its "
        "round trips (bench/scraper.py); S1,S2: configuration A with S1, B with S2 (0: no "
        "scraper), interleaved, e.g. 0,1 for the cost of a scrape a second",
    )
    run.add_argument(
        "--fixtures",
        help="the Claude sessions' turns: plain (the bench fixture, the default), subagents (the "
        "same turns, each starting two foreground subagents; bench/subagent_fixture.py), or "
        "plain,subagents: configuration A with plain, B with subagents, interleaved",
    )
    writes_cmd = sub.add_parser("writes", help="provider write batching on vs off, on the real store (bench/writes.py)")
    writes_cmd.add_argument("--reps", type=int, default=5, help="repetitions per configuration (default 5)")
    writes_cmd.add_argument("--synchronous", choices=("full", "normal"), default="full", help="SQLite synchronous level (default full)")
    merge = sub.add_parser("report", help="one report over earlier runs' summary.json files")
    merge.add_argument("dirs", nargs="+")
    merge.add_argument("--out", required=True)
    gen = sub.add_parser("gen-db", help="write a synthetic database shaped like a busy host's (bench/gen_db.py)")
    gen.add_argument("--events", type=int, required=True, help="events to write (e.g. 1000000)")
    gen.add_argument("--out", required=True, help="the database file to create (put it under /tmp)")
    gen.add_argument("--threads", type=int, help="threads, at least 21 (default: events ÷ 370, 2,700 from 1 M events on)")
    gen.add_argument("--big-thread-items", type=int, help="items of the one big thread (default: up to 100,000)")
    gen.add_argument("--seed", type=int, default=1)
    up = sub.add_parser("startup", help="start-up time and shell/snapshot reads on a database (bench/startup.py)")
    up.add_argument("--db", required=True, help="the database to start from (copied; never changed)")
    up.add_argument("--runs", type=int, default=5, help="daemon restarts after the first start (default 5)")
    up.add_argument("--reads", type=int, default=20, help="shell and snapshot reads each (default 20)")
    up.add_argument("--out", help="output directory (default: bench-out/startup-TIME)")
    pr = sub.add_parser("prune", help="retention on a database: sizes before and after prune and vacuum, and the time (bench/prune.py)")
    pr.add_argument("--db", required=True, help="the database to start from (copied; never changed)")
    pr.add_argument("--no-full-vacuum", action="store_true", help="skip the VACUUM after the prune")
    pr.add_argument("--duty", type=float, default=0.25, help="the daemon's --retention-duty for the pass (default 0.25, the daemon's default; 1 measures the pass without its pauses)")
    pr.add_argument("--out", help="output directory (default: bench-out/prune-TIME)")
    large = sub.add_parser("git-large", help="workspace status and checkpoints on a generated large repository (bench/git_large.py)")
    large.add_argument("--files", type=int, default=100_000, help="files in the repository (default 100000)")
    large.add_argument("--runs", type=int, default=7, help="rounds per untracked-cache setting (default 7)")
    large.add_argument("--dir", help="where the repository is generated once and kept (default /tmp/t3d-bench-git-large/FILES)")
    large.add_argument("--out", help="also write the samples as JSON to this file")
    idle = sub.add_parser("workspace-idle", help="git processes per minute for watched idle threads (bench/workspace_idle.py)")
    idle.add_argument("--threads", type=int, default=250, help="threads, each in a repository of its own (default 250)")
    idle.add_argument("--seconds", type=float, default=60.0, help="the idle window (default 60)")
    flood = sub.add_parser("flood", help="health latency while hostile connections without the token are held (bench/flood.py)")
    flood.add_argument("--connections", type=int, default=1000, help="hostile connections to hold (default 1000)")
    flood.add_argument("--seconds", type=float, default=60, help="measured window in seconds (default 60)")
    flood.add_argument("--out", help="output directory (default: a temporary directory)")
    args = parser.parse_args(argv)
    # A SIGTERM (a timeout, a service manager, kill) stops a run as Ctrl-C does, through
    # trio's SIGINT handling, so that the daemons it started are stopped, not left running.
    signal.signal(signal.SIGTERM, _interrupt)
    if args.command == "prune":
        from bench import prune

        return prune.command(args)
    if args.command == "git-large":
        from bench import git_large

        if args.files < 1 or args.runs < 1:
            parser.error("--files and --runs must be at least 1")
        return git_large.command(args)
    if args.command == "workspace-idle":
        from bench import workspace_idle

        return workspace_idle.command(args)
    if args.command == "flood":
        from bench import flood as flood_bench

        return flood_bench.command(args)
    if args.command == "gen-db":
        from bench import gen_db

        return gen_db.command(args)
    if args.command == "startup":
        from bench import startup

        return startup.command(args)
    if args.command == "run":
        if args.runs < 1:
            parser.error("--runs must be at least 1")
        fixtures_of(args)  # refused before anything starts
        if args.restart_every is not None and (args.restart_every <= 0 or PROFILES[args.profile].burst):
            parser.error("--restart-every takes a number of seconds above 0, and a profile with a window (not burst)")
        return command_run(args)
    if args.command == "writes":
        from bench import writes

        return writes.main(["--reps", str(args.reps), "--synchronous", args.synchronous])
    return command_report(args)


if __name__ == "__main__":
    sys.exit(main())
