"""A run's figures, from what the load, the prober and the sampler recorded. Pure.

Every figure is a number or None; a None figure has its reason in ``missing``. Times are
monotonic seconds; the window is ``[start, end]``. Which records count:

* turns completed: terminal ``completed`` events seen by the client inside the window;
  turn p50/p95 over those (``turn.start`` sent to terminal event received);
* dispatch (the ``turn.start`` round trip) and time to first streamed item (the first
  ``item.updated`` of the turn other than the user's message): turns started in the window;
* loop lag p99: over the daemon's latest-lag values the prober read in the window (a
  random sample of its 50 ms ticks); loop lag max: the largest ``max`` it reported (each
  covers the daemon's last ~10 s, so it may reach up to 10 s before the window);
* memory peaks: sampled in the window; CPU seconds: the change across the window.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import attrs

from bench.metrics_text import bucket_deltas, bucket_quantile, counter_value, histogram_buckets
from bench.profiles import Profile, physical_limit
from bench.sampler import Sample
from bench.stats import maximum, percentile, ratio

STEADY_FIGURES = (
    "turns_completed", "turn_p50_s", "turn_p95_s", "dispatch_p50_ms", "dispatch_p95_ms",
    "first_item_p50_ms", "first_item_p95_ms", "sessions", "sessions_with_output",
    "loop_lag_p99_ms", "loop_lag_max_ms", "health_p50_ms", "health_p99_ms", "health_max_ms",
    "daemon_rss_peak_mib", "daemon_pss_peak_mib", "spawner_rss_peak_mib", "spawner_pss_peak_mib",
    "providers_rss_peak_mib", "total_rss_peak_mib", "daemon_cpu_s", "spawner_cpu_s", "driver_cpu_s",
    "providers_cpu_s", "machine_busy_pct", "events_per_s", "git_per_turn", "limit", "turns_per_limit",
    "gate_closed_pct", "daemon_child_processes", "turn_p50_per_fixture", "providers_rss_per_session_mib",
    "daemon_cpu_ms_per_turn", "daemon_cpu_ms_per_kline", "spawner_cpu_ms_per_turn",
    "daemon_loop_cpu_ms_per_turn", "daemon_writer_cpu_ms_per_turn", "daemon_kernel_cpu_pct",
    "daemon_cpu_per_provider_cpu",
)  # fmt: skip
STEADY_EXTRAS = (
    "turns_failed", "turns_in_flight", "health_failures", "providers_peak",
    "subscriber_events", "subscriber_resyncs", "session_resyncs", "subscribe_p50_ms", "subscribe_p95_ms",
    "approvals", "polls", "pending_p50_ms", "shell_p50_ms", "snapshot_polls", "snapshot_p50_ms",
    "driver_lag_p99_ms", "driver_lag_max_ms", "errors",
    "daemon_rss_first_third_mib", "daemon_rss_last_third_mib",
    "db_mib_start", "db_mib_first_third", "db_mib_last_third", "db_growth_first_third_mib_min",
    "db_growth_last_third_mib_min", "db_mib_peak", "wal_mib_peak",
    "snapshot_log_mib_first_third", "snapshot_log_mib_last_third", "snapshot_log_mib_peak",
    "retention_steps", "retention_deleted", "retention_compacted", "retention_running_at_end",
    "writer_job_p50_ms", "writer_job_p95_ms", "writer_job_p99_ms", "wal_checkpoints", "wal_checkpoints_on_writer",
    "writer_transactions_per_turn", "writer_jobs_per_turn",
    "first_chunk_p50_ms", "first_chunk_p95_ms", "first_chunk_samples",
    "slow_clients", "slow_connects", "event_delay_p50_ms", "event_delay_p95_ms",
    "event_delay_max_ms", "probe_events_missed",
    "approval_seen_p50_ms", "approval_seen_p95_ms", "approval_answered_p50_ms", "approval_answered_p95_ms",
    "approvals_measured", "poller_calls",
    "approval_commit_p50_ms", "approval_commit_p95_ms", "approval_reply_p50_ms", "approval_reply_p95_ms",
    "approval_replies",
    "scrapes", "scrape_failures", "scrape_p50_ms", "scrape_p99_ms", "scrape_max_ms", "scrape_kib",
)  # fmt: skip
# With --restart-every (bench/restart.py); None otherwise.
RESTART_FIGURES = (
    "restarts", "restart_serving_p50_s", "restart_serving_max_s", "restart_stop_max_s",
    "agents_killed", "turns_server_restart", "restarted_turns", "restarted_turns_text_equal",
)  # fmt: skip
BURST_FIGURES = (
    "sessions", "turns_completed", "replies_done_s", "turns_done_s", "dispatch_p50_ms", "dispatch_max_ms",
    "daemon_rss_peak_mib", "daemon_pss_peak_mib", "spawner_rss_peak_mib", "providers_rss_peak_mib",
    "total_rss_peak_mib", "git_per_turn", "providers_rss_per_session_mib",
)  # fmt: skip


@attrs.frozen
class Inputs:
    profile: Profile
    sessions: int
    window_s: float
    fixture_turn_s: float
    load: dict[str, Any]
    probes: Sequence[Sequence[Any]]
    samples: Sequence[Sample]
    sequence_span: tuple[int, int] | None  # events sequence at window start and end
    spawner_seen: bool
    # Seconds the admission gate had been closed, at window start and end (/api/health).
    saturated_span: tuple[float, float] | None = None
    daemon_children: int | None = None  # processes the daemon started itself (not the spawner)
    # GET /metrics samples (bench/scraper.py): [monotonic start, round trip ms or None, bytes].
    scrapes: Sequence[Sequence[Any]] | None = None
    # The fixture's mean stdout lines per turn (for CPU per 1,000 provider lines).
    lines_per_turn: float | None = None
    # The daemon's GET /metrics bodies at the window's start and end.
    metrics_span: tuple[str, str] | None = None


def turns_of(load: dict[str, Any]) -> list[dict[str, Any]]:
    fields = load["turn_fields"]
    return [dict(zip(fields, row, strict=True)) for row in load["turns"]]


def _in(t: float | None, start: float, end: float) -> bool:
    return t is not None and start <= t <= end


def _memory(
    samples: Sequence[Sample], spawner_seen: bool, fig: dict[str, Any], missing: dict[str, str]
) -> None:
    fig["daemon_rss_peak_mib"] = maximum(s.daemon_rss for s in samples if s.daemon_rss is not None)
    fig["daemon_pss_peak_mib"] = maximum(s.daemon_pss for s in samples if s.daemon_pss is not None)
    fig["providers_rss_peak_mib"] = maximum(s.providers_rss for s in samples)
    fig["providers_peak"] = maximum(s.providers for s in samples)
    # At the sample with the most provider RSS: what each of its processes held on average.
    peak = max((s for s in samples if s.providers), key=lambda s: s.providers_rss, default=None)
    fig["providers_rss_per_session_mib"] = None if peak is None else peak.providers_rss / peak.providers
    if peak is None:
        missing["providers_rss_per_session_mib"] = "no provider process was sampled"
    fig["total_rss_peak_mib"] = maximum(
        (s.daemon_rss or 0) + (s.spawner_rss or 0) + s.providers_rss for s in samples
    )
    fig["spawner_rss_peak_mib"] = maximum(
        s.spawner_rss for s in samples if s.spawner_rss is not None
    )
    fig["spawner_pss_peak_mib"] = maximum(
        s.spawner_pss for s in samples if s.spawner_pss is not None
    )
    if not spawner_seen:
        for name in ("spawner_rss_peak_mib", "spawner_pss_peak_mib", "spawner_cpu_s"):
            missing[name] = (
                "absent: no spawner process (-m spawner --socket STATE/spawner.sock) ran"
            )
    if not samples:
        missing["daemon_rss_peak_mib"] = "no /proc sample fell in the window"


def _git(
    samples: Sequence[Sample], turns: int, fig: dict[str, Any], missing: dict[str, str]
) -> None:
    calls = [s.git_calls for s in samples if s.git_calls is not None]
    if not calls:
        fig["git_per_turn"] = None
        missing["git_per_turn"] = "git is not installed here, so git processes could not be counted"
    elif calls[-1] - calls[0] == 0:
        fig["git_per_turn"] = None
        missing["git_per_turn"] = (
            "n/a: no git process ran in the window (checkpoints off, or no turn ended in it)"
        )
    else:
        fig["git_per_turn"] = ratio(calls[-1] - calls[0], turns)


def _cpu(samples: Sequence[Sample], name: str) -> float | None:
    """CPU seconds a process used across the samples. A counter that drops is a new process
    (the daemon restarted by `--restart-every`): it counts from zero again, so the total is
    the sum over the processes (less each old one's last sampling interval)."""
    values: list[float] = [getattr(s, name) for s in samples if getattr(s, name) is not None]
    if len(values) < 2:
        return None
    return sum(after - before if after >= before else after for before, after in itertools.pairwise(values))


def _busy(samples: Sequence[Sample]) -> float | None:
    """How busy all the machine's CPUs were across the samples, in percent (every process)."""
    if len(samples) < 2:
        return None
    total = samples[-1].machine_total - samples[0].machine_total
    return ratio((samples[-1].machine_busy - samples[0].machine_busy) * 100, total)


def steady_figures(i: Inputs) -> tuple[dict[str, Any], dict[str, str]]:
    start, end = i.load["window"]
    fig: dict[str, Any] = {}
    missing: dict[str, str] = {}
    turns = turns_of(i.load)
    done = [t for t in turns if _in(t["end"], start, end) and t["status"] == "completed"]
    started = [t for t in turns if _in(t["start"], start, end)]
    fig["turns_completed"] = len(done)
    fig["turns_failed"] = sum(
        1 for t in turns if _in(t["end"], start, end) and t["status"] != "completed"
    )
    fig["turns_in_flight"] = sum(1 for t in turns if t["end"] is None and t["status"] is None)
    durations = [t["end"] - t["start"] for t in done]
    fig["turn_p50_s"], fig["turn_p95_s"] = percentile(durations, 50), percentile(durations, 95)
    dispatch = [t["dispatch_ms"] for t in started if t["dispatch_ms"] is not None]
    fig["dispatch_p50_ms"], fig["dispatch_p95_ms"] = (
        percentile(dispatch, 50),
        percentile(dispatch, 95),
    )
    first = [(t["first_item"] - t["start"]) * 1000 for t in started if t["first_item"] is not None]
    fig["first_item_p50_ms"], fig["first_item_p95_ms"] = (
        percentile(first, 50),
        percentile(first, 95),
    )
    fig["sessions"] = i.sessions
    fig["sessions_with_output"] = i.load["sessions_with_output"]

    probes = [p for p in i.probes if _in(p[0], start, end)]
    latency = [p[1] for p in probes if p[1] is not None]
    fig["health_p50_ms"], fig["health_p99_ms"] = percentile(latency, 50), percentile(latency, 99)
    fig["health_max_ms"] = maximum(latency)
    fig["health_failures"] = sum(1 for p in probes if p[1] is None)
    fig["loop_lag_p99_ms"] = percentile([p[2] for p in probes if p[2] is not None], 99)
    fig["loop_lag_max_ms"] = maximum(p[4] for p in probes if p[4] is not None)
    if probes and fig["loop_lag_p99_ms"] is None:
        missing["loop_lag_p99_ms"] = missing["loop_lag_max_ms"] = (
            "/api/health carries no loop_lag_ms"
        )

    window_samples = [s for s in i.samples if _in(s.t, start, end)]
    _memory(window_samples, i.spawner_seen, fig, missing)
    rss = [s.daemon_rss for s in window_samples if s.daemon_rss is not None]
    third = len(rss) // 3
    fig["daemon_rss_first_third_mib"] = percentile(rss[:third], 50) if third else None
    fig["daemon_rss_last_third_mib"] = percentile(rss[-third:], 50) if third else None
    _db_size(window_samples, fig)
    if fig["snapshot_log_mib_peak"] is None:
        for name in ("snapshot_log_mib_first_third", "snapshot_log_mib_last_third", "snapshot_log_mib_peak"):
            missing[name] = "not measured: run with --snapshot-log S"
    fig["daemon_cpu_s"] = _cpu(window_samples, "daemon_cpu")
    fig["spawner_cpu_s"] = _cpu(window_samples, "spawner_cpu")
    fig["driver_cpu_s"] = _cpu(window_samples, "driver_cpu")
    fig["providers_cpu_s"] = _cpu(window_samples, "providers_cpu")
    fig["machine_busy_pct"] = _busy(window_samples)
    _cpu_per_turn(fig, missing, len(done), i.lines_per_turn)
    _daemon_cpu_split(window_samples, fig, missing, len(done))
    if i.sequence_span is None:
        fig["events_per_s"] = None
        missing["events_per_s"] = (
            "the events sequence could not be read from GET /api/shell at the window's edges"
        )
    else:
        fig["events_per_s"] = (i.sequence_span[1] - i.sequence_span[0]) / i.window_s
    _git(window_samples, len(done), fig, missing)
    if i.saturated_span is None:
        fig["gate_closed_pct"] = None
        missing["gate_closed_pct"] = "the daemon's /api/health reports no admission.saturated_s"
    else:
        fig["gate_closed_pct"] = 100 * (i.saturated_span[1] - i.saturated_span[0]) / i.window_s
    fig["daemon_child_processes"] = i.daemon_children
    fig["limit"] = physical_limit(i.sessions, i.window_s, i.profile.think_s, i.fixture_turn_s)
    fig["turns_per_limit"] = ratio(len(done), fig["limit"])
    fig["turn_p50_per_fixture"] = ratio(fig["turn_p50_s"], i.fixture_turn_s)
    if fig["turn_p50_per_fixture"] is None:
        missing["turn_p50_per_fixture"] = "no turn completed in the window"

    subs, polls, snap = i.load["subscribers"], i.load["pollers"], i.load["snapshot"]
    fig["subscriber_events"], fig["subscriber_resyncs"] = subs["events"], subs["resyncs"]
    fig["session_resyncs"] = i.load["session_resyncs"]
    fig["subscribe_p50_ms"] = percentile(subs["subscribe_ms"], 50)
    fig["subscribe_p95_ms"] = percentile(subs["subscribe_ms"], 95)
    fig["approvals"], fig["polls"] = polls["approvals"], polls["polls"]
    fig["pending_p50_ms"], fig["shell_p50_ms"] = (
        percentile(polls["pending_ms"], 50),
        percentile(polls["shell_ms"], 50),
    )
    _approvals(polls, fig, missing)
    _approvals_from_commit(i.metrics_span, fig, missing)
    _retention(i.metrics_span, fig, missing)
    _writer(i.metrics_span, fig, missing, len(done))
    fig["snapshot_polls"], fig["snapshot_p50_ms"] = (
        snap["polls"],
        percentile(snap["snapshot_ms"], 50),
    )
    _switches_and_slow_clients(i.load, fig, missing)
    _scrapes(i.scrapes, start, end, fig, missing)
    _driver(i.load, fig)
    return fig, missing


def _cpu_per_turn(fig: dict[str, Any], missing: dict[str, str], turns: int, lines_per_turn: float | None) -> None:
    """Daemon (and spawner) CPU in the window per turn completed in it, and the daemon's per
    1,000 provider stdout lines (turns x the fixture's mean lines per turn). CPU spent on
    turns still in flight at the window's edges counts too, so it is an estimate that is
    close when many turns fit in the window."""
    names = ("daemon_cpu_ms_per_turn", "daemon_cpu_ms_per_kline", "spawner_cpu_ms_per_turn")
    daemon, spawner = fig.get("daemon_cpu_s"), fig.get("spawner_cpu_s")
    if not turns:
        for name in names:
            fig[name] = None
            missing[name] = "no turn completed in the window"
        return
    fig["daemon_cpu_ms_per_turn"] = None if daemon is None else daemon * 1000 / turns
    fig["spawner_cpu_ms_per_turn"] = None if spawner is None else spawner * 1000 / turns
    lines = None if lines_per_turn is None else turns * lines_per_turn
    fig["daemon_cpu_ms_per_kline"] = None if daemon is None or not lines else daemon * 1000 / (lines / 1000)
    if not lines:
        missing["daemon_cpu_ms_per_kline"] = "the fixture's lines per turn are not known"
    for name, value in (("daemon", daemon), ("spawner", spawner)):
        if value is None:
            for figure in names:
                if figure.startswith(name):
                    missing[figure] = f"the {name}'s CPU was not sampled at both ends of the window"


def _daemon_cpu_split(samples: Sequence[Sample], fig: dict[str, Any], missing: dict[str, str], turns: int) -> None:
    """Where the daemon's CPU in the window went: its loop's thread and its writer thread per
    turn completed, and the share spent in the kernel (system calls, wake-ups)."""
    for name, field in (("daemon_loop_cpu_ms_per_turn", "daemon_loop_cpu"), ("daemon_writer_cpu_ms_per_turn", "daemon_writer_cpu")):
        cpu = _cpu(samples, field)
        fig[name] = None if cpu is None or not turns else cpu * 1000 / turns
        if fig[name] is None:
            missing[name] = "no turn completed in the window" if not turns else "the thread was not sampled at both ends of the window"
    kernel, total = _cpu(samples, "daemon_kernel_cpu"), fig.get("daemon_cpu_s")
    fig["daemon_kernel_cpu_pct"] = None if kernel is None else ratio(kernel * 100, total)
    if fig["daemon_kernel_cpu_pct"] is None:
        missing["daemon_kernel_cpu_pct"] = "the daemon's CPU was not sampled at both ends of the window"
    # The agents do the same work for a turn whatever the daemon is, so their CPU tracks how
    # fast the shared machine was during this window: the ratio is steadier between runs.
    fig["daemon_cpu_per_provider_cpu"] = ratio(total, fig.get("providers_cpu_s"))
    if fig["daemon_cpu_per_provider_cpu"] is None:
        missing["daemon_cpu_per_provider_cpu"] = "the daemon's or the agents' CPU was not sampled at both ends of the window"


def _scrapes(scrapes: Sequence[Sequence[Any]] | None, start: float, end: float, fig: dict[str, Any], missing: dict[str, str]) -> None:
    """The scraper's GET /metrics round trips in the window (``--scrape-interval``)."""
    names = ("scrapes", "scrape_failures", "scrape_p50_ms", "scrape_p99_ms", "scrape_max_ms", "scrape_kib")
    if scrapes is None:
        for name in names:
            fig[name] = None
            missing[name] = "not measured: run with --scrape-interval S (S1,S2 to compare)"
        return
    window = [s for s in scrapes if _in(s[0], start, end)]
    latency = [s[1] for s in window if s[1] is not None]
    fig["scrapes"], fig["scrape_failures"] = len(window), sum(1 for s in window if s[1] is None)
    fig["scrape_p50_ms"], fig["scrape_p99_ms"] = percentile(latency, 50), percentile(latency, 99)
    fig["scrape_max_ms"] = maximum(latency)
    sizes = [s[2] for s in window if s[1] is not None]
    fig["scrape_kib"] = sizes[-1] / 1024 if sizes else None


def _approvals(polls: dict[str, Any], fig: dict[str, Any], missing: dict[str, str]) -> None:
    """Approval latency: from a request's opening (its created_at, the daemon's clock just
    before the commit) to a poller having it in hand, and to the poller's answer committed;
    over requests opened in the window. And how many calls the pollers made in it."""
    seen, answered = polls.get("seen_ms"), polls.get("answered_ms")
    names = ("approval_seen_p50_ms", "approval_seen_p95_ms", "approval_answered_p50_ms", "approval_answered_p95_ms")
    if seen is None or answered is None:  # a load from before approval latency was recorded
        for name in names:
            fig[name] = None
            missing[name] = "not recorded by this load"
    else:
        fig["approval_seen_p50_ms"], fig["approval_seen_p95_ms"] = percentile(seen, 50), percentile(seen, 95)
        fig["approval_answered_p50_ms"], fig["approval_answered_p95_ms"] = percentile(answered, 50), percentile(answered, 95)
    fig["approvals_measured"] = None if seen is None else len(seen)
    fig["poller_calls"] = polls.get("calls")


COMMIT_HISTOGRAM = "t3d_request_commit_seconds"
REPLY_HISTOGRAM = "t3d_request_wait_reply_seconds"
WRITER_JOB_HISTOGRAM = "t3d_writer_job_seconds"
NO_EDGES = "GET /metrics could not be read at both edges of the window"


def _histogram_ms(
    span: tuple[str, str] | None, histogram: str, prefix: str, quantiles: tuple[int, ...],
    fig: dict[str, Any], missing: dict[str, str], empty: str,
) -> list[tuple[float, float]]:
    """``{prefix}_p{q}_ms`` for each quantile of a /metrics histogram over the window (its
    bucket deltas; ``empty`` says why when it saw nothing); returns the deltas."""
    names = [f"{prefix}_p{q}_ms" for q in quantiles]
    if span is None or not (end := histogram_buckets(span[1], histogram)):
        for name in names:
            fig[name] = None
            missing[name] = NO_EDGES if span is None else f"this daemon's /metrics has no {histogram}"
        return []
    deltas = bucket_deltas(histogram_buckets(span[0], histogram), end)
    for q, name in zip(quantiles, names, strict=True):
        value = bucket_quantile(deltas, q / 100)
        fig[name] = None if value is None else value * 1000
        if value is None:
            missing[name] = empty
    return deltas


def _counter_delta(span: tuple[str, str] | None, counter: str) -> float | None:
    """A /metrics counter's growth over the window (None: not read at both edges)."""
    start, end = span or ("", "")
    before, after = counter_value(start, counter), counter_value(end, counter)
    return None if before is None or after is None else after - before


def _counter_deltas(span: tuple[str, str] | None, counters: dict[str, str], fig: dict[str, Any], missing: dict[str, str]) -> None:
    """Each figure of ``counters`` (figure -> /metrics counter): its growth over the window."""
    for name, counter in counters.items():
        fig[name] = _counter_delta(span, counter)
        if fig[name] is None:
            missing[name] = f"GET /metrics had no {counter} at both edges of the window"


def _approvals_from_commit(span: tuple[str, str] | None, fig: dict[str, Any], missing: dict[str, str]) -> None:
    """Approval latency as the daemon measured it over the window (its /metrics histograms'
    bucket deltas): a request's created_at to its commit applied, and its commit to each
    long-poll reply that carries it built for the transport (every bot woken, every transport)."""
    empty = "no runtime request in the window"
    _histogram_ms(span, COMMIT_HISTOGRAM, "approval_commit", (50, 95), fig, missing, empty)
    replies = _histogram_ms(span, REPLY_HISTOGRAM, "approval_reply", (50, 95), fig, missing, empty)
    fig["approval_replies"] = replies[-1][1] if replies else (0 if span else None)
    if span is None:
        missing["approval_replies"] = NO_EDGES


RETENTION_COUNTERS = {
    "retention_steps": "t3d_retention_steps_total",
    "retention_deleted": "t3d_retention_events_deleted_total",
    "retention_compacted": "t3d_retention_events_compacted_total",
}
WRITER_COUNTERS = {  # per turn completed
    "writer_transactions_per_turn": "t3d_writer_transactions_total",
    "writer_jobs_per_turn": "t3d_writer_jobs_total",
}
WAL_COUNTERS = {
    "wal_checkpoints": "t3d_wal_checkpoints_total",
    "wal_checkpoints_on_writer": "t3d_wal_checkpoints_on_writer_total",
}


def _retention(span: tuple[str, str] | None, fig: dict[str, Any], missing: dict[str, str]) -> None:
    """What retention did in the window (its /metrics counters' deltas): steps run, events
    deleted and compacted; and whether a pass ran at the window's end."""
    _counter_deltas(span, RETENTION_COUNTERS, fig, missing)
    fig["retention_running_at_end"] = counter_value((span or ("", ""))[1], "t3d_retention_running")
    if fig["retention_running_at_end"] is None:
        missing["retention_running_at_end"] = "GET /metrics had no t3d_retention_running at the window's end"


def _writer(span: tuple[str, str] | None, fig: dict[str, Any], missing: dict[str, str], turns: int) -> None:
    """The writer's commit latency over the window (a job's submission to its outcome, every
    job: commands, provider batches, retention steps), its transactions (each one COMMIT and
    fsync) and jobs per turn completed, and the WAL checkpoints: on their thread, and those
    a commit ran on the writer."""
    _histogram_ms(span, WRITER_JOB_HISTOGRAM, "writer_job", (50, 95, 99), fig, missing, "no writer job in the window")
    _counter_deltas(span, WAL_COUNTERS, fig, missing)
    for name, counter in WRITER_COUNTERS.items():
        count = _counter_delta(span, counter)
        fig[name] = None if count is None or not turns else count / turns
        if fig[name] is None:
            missing[name] = f"GET /metrics had no {counter} at both edges of the window" if count is None else "no turn completed in the window"


def _switches_and_slow_clients(load: dict[str, Any], fig: dict[str, Any], missing: dict[str, str]) -> None:
    """First snapshot chunk after a subscribe (UI subscribers' switches, and the switch probe
    with --slow-clients); the never-reading clients and the healthy probe's event delay."""
    slow = load.get("slow")
    chunks = list(load["subscribers"].get("first_chunk_ms") or []) + list((slow or {}).get("first_chunk_ms") or [])
    fig["first_chunk_p50_ms"], fig["first_chunk_p95_ms"] = percentile(chunks, 50), percentile(chunks, 95)
    fig["first_chunk_samples"] = len(chunks)
    if slow is None:
        for name in ("slow_clients", "slow_connects", "event_delay_p50_ms", "event_delay_p95_ms", "event_delay_max_ms", "probe_events_missed"):
            fig[name] = None
            missing[name] = "not measured: run with --slow-clients K (0 for the probes alone)"
        return
    delays = slow["event_delay_ms"]
    fig["slow_clients"], fig["slow_connects"] = slow["clients"], slow["connects"]
    fig["event_delay_p50_ms"], fig["event_delay_p95_ms"] = percentile(delays, 50), percentile(delays, 95)
    fig["event_delay_max_ms"] = maximum(delays)
    fig["probe_events_missed"] = slow["renames"] - len(delays)


def _driver(load: dict[str, Any], fig: dict[str, Any]) -> None:
    lag = load.get("driver_lag_ms") or []
    fig["driver_lag_p99_ms"], fig["driver_lag_max_ms"] = percentile(lag, 99), maximum(lag)
    fig["errors"] = sum((load.get("errors") or {}).get("counts", {}).values())


def burst_figures(i: Inputs) -> tuple[dict[str, Any], dict[str, str]]:
    at = i.load["burst_at"]
    fig: dict[str, Any] = {}
    missing: dict[str, str] = {}
    turns = turns_of(i.load)
    done = [t for t in turns if t["status"] == "completed"]
    fig["sessions"] = i.sessions
    fig["turns_completed"] = len(done)
    replies = [t["reply_done"] for t in turns]
    ends = [t["end"] for t in turns]
    complete = len(turns) == i.sessions and all(r is not None for r in replies)
    fig["replies_done_s"] = max(replies) - at if complete and replies else None
    fig["turns_done_s"] = max(ends) - at if ends and all(e is not None for e in ends) else None
    if fig["replies_done_s"] is None:
        missing["replies_done_s"] = "not every reply completed before the burst timeout"
    if fig["turns_done_s"] is None:
        missing["turns_done_s"] = "not every turn ended before the burst timeout"
    dispatch = [t["dispatch_ms"] for t in turns if t["dispatch_ms"] is not None]
    fig["dispatch_p50_ms"], fig["dispatch_max_ms"] = percentile(dispatch, 50), maximum(dispatch)
    last = max((e for e in ends if e is not None), default=at) + 1.0
    window_samples = [s for s in i.samples if at <= s.t <= last]
    _memory(window_samples, i.spawner_seen, fig, missing)
    _git(window_samples, len(done), fig, missing)
    _driver(i.load, fig)
    return fig, missing


def _db_size(samples: Sequence[Sample], fig: dict[str, Any]) -> None:
    """The database file over the window: at its start, the medians of its first and last
    thirds, how fast it grew in each (MiB per minute: with retention, the last third grows
    only by the final state of new work, not by every superseded snapshot), its peak, and
    the WAL's peak."""
    db = [(s.t, s.db_mib) for s in samples if s.db_mib is not None]
    third = len(db) // 3
    fig["db_mib_start"] = db[0][1] if db else None
    fig["db_mib_first_third"] = percentile([m for _, m in db[:third]], 50) if third else None
    fig["db_mib_last_third"] = percentile([m for _, m in db[-third:]], 50) if third else None
    fig["db_growth_first_third_mib_min"] = _growth(db[:third])
    fig["db_growth_last_third_mib_min"] = _growth(db[-third:])
    fig["db_mib_peak"] = maximum(m for _, m in db)
    fig["wal_mib_peak"] = maximum(s.wal_mib for s in samples if s.wal_mib is not None)
    log = [s.snapshot_log_mib for s in samples if s.snapshot_log_mib is not None]
    third = len(log) // 3
    fig["snapshot_log_mib_first_third"] = percentile(log[:third], 50) if third else None
    fig["snapshot_log_mib_last_third"] = percentile(log[-third:], 50) if third else None
    fig["snapshot_log_mib_peak"] = maximum(log)


def _growth(points: Sequence[tuple[float, float]]) -> float | None:
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) * 60


def series_rows(
    samples: Sequence[Sample],
    probes: Sequence[Sequence[Any]],
    turns: list[dict[str, Any]],
    origin: float,
    period: float,
) -> list[dict[str, Any]]:
    """The per-period series for a run's CSV: memory, CPU, health, turns per period and the
    database's size."""
    if not samples:
        return []
    first = samples[0].t - period

    def slot(t: float) -> int:
        return int((t - first) // period)

    done: dict[int, int] = {}
    for t in turns:
        if t["end"] is not None:
            done[slot(t["end"])] = done.get(slot(t["end"]), 0) + 1
    health: dict[int, list[float]] = {}
    lag: dict[int, list[float]] = {}
    for p in probes:
        if p[1] is not None:
            health.setdefault(slot(p[0]), []).append(p[1])
        if p[2] is not None:
            lag.setdefault(slot(p[0]), []).append(p[2])
    rows = []
    for s in samples:
        k = slot(s.t) - 1  # the period that ends at this sample
        rows.append({
            "t_s": round(s.t - origin, 3),
            "daemon_rss_mib": s.daemon_rss, "daemon_pss_mib": s.daemon_pss, "daemon_cpu_s": s.daemon_cpu,
            "spawner_rss_mib": s.spawner_rss, "spawner_pss_mib": s.spawner_pss, "spawner_cpu_s": s.spawner_cpu,
            "providers": s.providers, "providers_rss_mib": round(s.providers_rss, 1),
            "providers_cpu_s": round(s.providers_cpu, 2), "driver_cpu_s": s.driver_cpu,
            "machine_busy_jiffies": s.machine_busy, "machine_total_jiffies": s.machine_total,
            "git_calls": s.git_calls, "turns_done": done.get(k, 0),
            "health_max_ms": maximum(health.get(k, [])), "loop_lag_max_ms": maximum(lag.get(k, [])),
            "db_mib": s.db_mib, "wal_mib": s.wal_mib, "snapshot_log_mib": s.snapshot_log_mib,
        })  # fmt: skip
    return rows
