"""``summary.json`` and ``report.md`` from a benchmark's runs. Pure (text in, text out).

The summary holds every run (valid or not, with its reasons), the medians over the valid
runs per configuration and session count, and with ``--compare`` the ratio B / A of each
median. The report puts a table under every chart and lists every run, invalid ones
marked, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from bench.figures import BURST_FIGURES, RESTART_FIGURES, STEADY_EXTRAS, STEADY_FIGURES
from bench.stats import median_figures, ratio

LABELS = {
    "turns_completed": "turns completed in the window",
    "turn_p50_s": "turn p50 (s)",
    "turn_p95_s": "turn p95 (s)",
    "dispatch_p50_ms": "dispatch p50 (ms)",
    "dispatch_p95_ms": "dispatch p95 (ms)",
    "dispatch_max_ms": "dispatch max (ms)",
    "first_item_p50_ms": "time to first streamed item p50 (ms)",
    "first_item_p95_ms": "time to first streamed item p95 (ms)",
    "sessions": "sessions",
    "sessions_with_output": "sessions that produced output",
    "loop_lag_p99_ms": "loop lag p99 (ms)",
    "loop_lag_max_ms": "loop lag max (ms)",
    "health_p50_ms": "health p50 (ms)",
    "health_p99_ms": "health p99 (ms)",
    "health_max_ms": "health max (ms)",
    "daemon_rss_peak_mib": "daemon RSS peak (MiB)",
    "daemon_pss_peak_mib": "daemon PSS peak (MiB)",
    "spawner_rss_peak_mib": "spawner RSS peak (MiB)",
    "spawner_pss_peak_mib": "spawner PSS peak (MiB)",
    "providers_rss_peak_mib": "provider processes RSS peak (MiB)",
    "total_rss_peak_mib": "daemon + spawner + providers RSS peak (MiB)",
    "daemon_cpu_s": "daemon CPU (s)",
    "spawner_cpu_s": "spawner CPU (s)",
    "driver_cpu_s": "driver CPU (s)",
    "daemon_cpu_ms_per_turn": "daemon CPU per turn (ms)",
    "daemon_cpu_ms_per_kline": "daemon CPU per 1,000 provider lines (ms)",
    "spawner_cpu_ms_per_turn": "spawner CPU per turn (ms)",
    "daemon_loop_cpu_ms_per_turn": "daemon's loop thread CPU per turn (ms)",
    "daemon_writer_cpu_ms_per_turn": "daemon's writer thread CPU per turn (ms)",
    "daemon_kernel_cpu_pct": "daemon CPU in the kernel (%)",
    "daemon_cpu_per_provider_cpu": "daemon CPU ÷ provider processes CPU",
    "providers_cpu_s": "provider processes CPU (s)",
    "machine_busy_pct": "machine CPU busy (% of all CPUs, every process)",
    "events_per_s": "events written per second",
    "gate_closed_pct": "admission gate closed (% of window)",
    "daemon_child_processes": "processes the daemon started (spawner aside)",
    "git_per_turn": "git processes per turn",
    "limit": "physical limit (turns)",
    "turns_per_limit": "turns ÷ limit",
    "turn_p50_per_fixture": "turn p50 ÷ the fixture's own turn",
    "providers_rss_per_session_mib": "provider processes RSS per session at the peak (MiB)",
    "replies_done_s": "every reply done (s)",
    "daemon_rss_first_third_mib": "daemon RSS, median of the window's first third (MiB)",
    "daemon_rss_last_third_mib": "daemon RSS, median of the window's last third (MiB)",
    "db_mib_start": "database file at the window's start (MiB)",
    "db_mib_first_third": "database file, median of the window's first third (MiB)",
    "db_mib_last_third": "database file, median of the window's last third (MiB)",
    "db_growth_first_third_mib_min": "database file growth in the window's first third (MiB/min)",
    "db_growth_last_third_mib_min": "database file growth in the window's last third (MiB/min)",
    "db_mib_peak": "database file peak (MiB)",
    "wal_mib_peak": "WAL file peak (MiB)",
    "snapshot_log_mib_first_third": "item snapshots still in the log, median of the window's first third (MiB of payload)",
    "snapshot_log_mib_last_third": "item snapshots still in the log, median of the window's last third (MiB of payload)",
    "snapshot_log_mib_peak": "item snapshots still in the log, peak (MiB of payload)",
    "retention_steps": "retention steps in the window (daemon)",
    "retention_deleted": "events retention deleted in the window (daemon)",
    "retention_compacted": "events retention compacted in the window (daemon)",
    "retention_running_at_end": "a retention pass running at the window's end (1 = yes)",
    "writer_job_p50_ms": "writer job, submission to outcome p50 (ms, daemon)",
    "writer_job_p95_ms": "writer job, submission to outcome p95 (ms, daemon)",
    "writer_job_p99_ms": "writer job, submission to outcome p99 (ms, daemon)",
    "writer_transactions_per_turn": "writer transactions per turn (each a COMMIT; daemon)",
    "writer_jobs_per_turn": "writer jobs per turn (daemon)",
    "wal_checkpoints": "WAL checkpoints on the checkpointer thread in the window (daemon)",
    "wal_checkpoints_on_writer": "WAL checkpoints a commit ran on the writer in the window (daemon)",
    "turns_done_s": "every turn done (s)",
    "subscribe_p50_ms": "subscribe.thread reply p50 (ms)",
    "subscribe_p95_ms": "subscribe.thread reply p95 (ms)",
    "first_chunk_p50_ms": "subscribe to first snapshot chunk p50 (ms)",
    "first_chunk_p95_ms": "subscribe to first snapshot chunk p95 (ms)",
    "first_chunk_samples": "first-chunk samples (thread switches in the window)",
    "slow_clients": "never-reading clients",
    "slow_connects": "never-reading connections opened",
    "event_delay_p50_ms": "healthy client's event delay p50 (ms)",
    "event_delay_p95_ms": "healthy client's event delay p95 (ms)",
    "event_delay_max_ms": "healthy client's event delay max (ms)",
    "probe_events_missed": "probe renames whose event never arrived",
    "restarts": "daemon restarts in the window",
    "restart_serving_p50_s": "restart signal to serving again p50 (s)",
    "restart_serving_max_s": "restart signal to serving again max (s)",
    "restart_stop_max_s": "restart signal to the old daemon gone max (s)",
    "agents_killed": "agents killed by the restarts (alive at a signal, gone by the next)",
    "turns_server_restart": "turns ended server_restart",
    "restarted_turns": "turns in flight at a restart",
    "restarted_turns_text_equal": "of those, final text equal to the recording's",
    "approval_seen_p50_ms": "approval: request's created_at (before the writer's queue) to a poller seeing it p50 (ms)",
    "approval_seen_p95_ms": "approval: request's created_at (before the writer's queue) to a poller seeing it p95 (ms)",
    "approval_answered_p50_ms": "approval: request's created_at to its answer committed p50 (ms)",
    "approval_answered_p95_ms": "approval: request's created_at to its answer committed p95 (ms)",
    "approval_commit_p50_ms": "approval: request's created_at to its commit applied, daemon p50 (ms)",
    "approval_commit_p95_ms": "approval: request's created_at to its commit applied, daemon p95 (ms)",
    "approval_reply_p50_ms": "approval: request's commit to a long-poll reply built, daemon p50 (ms)",
    "approval_reply_p95_ms": "approval: request's commit to a long-poll reply built, daemon p95 (ms)",
    "approval_replies": "long-poll replies carrying a request in the window (daemon)",
    "approvals_measured": "approvals measured (requests opened in the window)",
    "poller_calls": "calls the approval pollers made in the window",
    "scrapes": "GET /metrics scrapes in the window",
    "scrape_failures": "scrapes that failed",
    "scrape_p50_ms": "GET /metrics round trip p50 (ms)",
    "scrape_p99_ms": "GET /metrics round trip p99 (ms)",
    "scrape_max_ms": "GET /metrics round trip max (ms)",
    "scrape_kib": "GET /metrics body (KiB)",
}


def label(name: str) -> str:
    return LABELS.get(name, name.replace("_", " "))


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value.is_integer() and abs(value) >= 1:
            return f"{int(value):,}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |")
    return "\n".join(lines)


def figure_names(burst: bool) -> tuple[str, ...]:
    return BURST_FIGURES if burst else STEADY_FIGURES + STEADY_EXTRAS + RESTART_FIGURES


def summarize(
    runs: Sequence[dict[str, Any]], configs: Sequence[str], burst: bool
) -> list[dict[str, Any]]:
    """Per session count: each configuration's runs and medians over its valid runs, and B/A."""
    names = figure_names(burst)
    out = []
    for n in sorted({r["sessions"] for r in runs}):
        entry: dict[str, Any] = {"sessions": n, "configs": {}}
        for config in configs:
            mine = [r for r in runs if r["sessions"] == n and r["config"] == config]
            valid = [r["figures"] for r in mine if r["valid"]]
            entry["configs"][config] = {
                "runs": [r["label"] for r in mine],
                "valid_runs": len(valid),
                "median": median_figures(valid, names),
            }
        if len(configs) == 2:
            a, b = (entry["configs"][c]["median"] for c in configs)
            entry["ratio"] = {name: ratio(b[name], a[name]) for name in names}
        out.append(entry)
    return out


def _median_table(
    entry: dict[str, Any],
    configs: Sequence[str],
    names: Sequence[str],
    runs: Sequence[dict[str, Any]],
) -> str:
    """Medians (and B ÷ A), then every run of this session count, invalid ones marked."""
    header = ["figure", *(f"median {c}" for c in configs)] + (
        ["B ÷ A"] if len(configs) == 2 else []
    )
    mine = [r for r in runs if r["sessions"] == entry["sessions"]]
    header += [r["label"] + ("" if r["valid"] else " (INVALID)") for r in mine]
    rows = []
    for n in names:
        row = [label(n), *(entry["configs"][c]["median"][n] for c in configs)]
        if len(configs) == 2:
            row.append(entry["ratio"][n])
        rows.append(row + [r["figures"].get(n) for r in mine])
    return table(header, rows)


def chart_table(
    results: Sequence[dict[str, Any]], configs: Sequence[str], names: Sequence[str]
) -> str:
    """The numbers behind a chart: one row per session count, one column per figure and config."""
    header = ["sessions"] + [
        f"{label(n)} [{c}]" if len(configs) > 1 else label(n) for n in names for c in configs
    ]
    rows = [
        [e["sessions"]] + [e["configs"][c]["median"][n] for n in names for c in configs]
        for e in results
    ]
    return table(header, rows)


def memory_table(runs: Sequence[dict[str, Any]]) -> str:
    names = (
        "daemon_rss_first_third_mib",
        "daemon_rss_last_third_mib",
        "daemon_rss_peak_mib",
        "daemon_pss_peak_mib",
    )
    return table(
        ["run", *(label(n) for n in names)],
        [[r["label"], *(r["figures"].get(n) for n in names)] for r in runs],
    )


def render(
    summary: dict[str, Any],
    charts: Sequence[tuple[str, str, Sequence[str]]],
    memory_png: str | None = None,
) -> str:
    """report.md: set-up, medians, every chart with its table, every run, missing figures."""
    burst = summary["burst"]
    configs = list(summary["configs"])
    names = figure_names(burst)
    out = [f"# t3d benchmark: {summary['profile']}", ""]
    out += [f"- command: `{summary['command']}`", f"- started: {summary['started_at']}"]
    m = summary["machine"]
    out += [
        f"- machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['mem_gib']:.1f} GiB RAM, Linux {m['kernel']}, Python {m['python']}; load average at start {m['loadavg']}"
    ]
    out += [f"- code: {summary.get('code', 'unknown')}"]
    out += [f"- profile: {summary['profile_description']}"]
    agents = {"claude": "the fake claude", "codex": "the fake codex", "mix": "the fake claude and the fake codex, alternately"}
    provider = summary.get("provider", "claude")
    out += [f"- agents (--provider {provider}): {agents.get(provider, provider)}"]
    out += [
        f"- fixture: `{summary['fixture']['name']}`, its own turn {summary['fixture']['turn_s']:.2f} s (mean), first streamed item {summary['fixture']['first_item_ms']:.0f} ms in"
    ]
    if not burst:
        out += [
            f"- warm-up {summary['warmup_s']:g} s, window {summary['window_s']:g} s, {summary['runs_per_config']} run(s) per configuration"
        ]
    if summary.get("restart"):
        restart = summary["restart"]
        out += [f"- the daemon restarted every {restart['every_s']:g} s of the window with SIG{restart['signal']}, on the same state dir and port"]
    for config, env in summary["configs"].items():
        shown = " ".join(f"{k}={v}" for k, v in env.items()) or "the default settings"
        out += [f"- configuration {config}: {shown}"]
    out += [
        "- medians over valid runs; a run is valid only if every session produced provider output in the window"
        + (" (burst: every turn completed)" if burst else ""),
        "",
    ]
    for entry in summary["results"]:
        valid = ", ".join(
            f"{c}: {entry['configs'][c]['valid_runs']} of {len(entry['configs'][c]['runs'])} valid"
            for c in configs
        )
        out += [
            f"## {entry['sessions']} session(s) ({valid})",
            "",
            _median_table(entry, configs, names, summary["runs"]),
            "",
        ]
    for title, png, chart_names in charts:
        out += [
            f"## {title}",
            "",
            f"![{title}]({png})",
            "",
            chart_table(summary["results"], configs, chart_names),
            "",
        ]
    if memory_png:
        out += [
            "## Daemon memory over the run",
            "",
            f"![Daemon memory]({memory_png})",
            "",
            memory_table(summary["runs"]),
            "",
        ]
    out += ["## Every run", ""]
    key = (
        (
            "turns_completed",
            "turn_p50_s",
            "dispatch_p50_ms",
            "loop_lag_p99_ms",
            "daemon_rss_peak_mib",
        )
        if not burst
        else ("replies_done_s", "turns_done_s", "dispatch_p50_ms", "daemon_rss_peak_mib")
    )
    rows = [
        [
            r["label"],
            "valid" if r["valid"] else "**INVALID**",
            "; ".join(r["reasons"]) or "",
            *[r["figures"].get(k) for k in key],
        ]
        for r in summary["runs"]
    ]
    out += [table(["run", "valid", "why not", *(label(k) for k in key)], rows), ""]
    missing = {(name, reason) for r in summary["runs"] for name, reason in r["missing"].items()}
    if missing:
        out += ["## Figures not measured", ""]
        out += [f"- {label(name)}: {reason}" for name, reason in sorted(missing)]
        out += [""]
    notes = [f"- {r['label']}: {n}" for r in summary["runs"] for n in r["notes"] if "\n" not in n]
    if notes:
        out += ["## Notes", "", *notes, ""]
    return "\n".join(out)
