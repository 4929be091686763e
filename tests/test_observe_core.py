"""The pure parts of observability: histograms, the commit tally, JSON log lines, /proc parsing."""

from __future__ import annotations

import logging
import os
import sys

import orjson
from prometheus_client.parser import text_string_to_metric_families

from t3d.api.app import _loopback
from t3d.domain.model import ProviderSession, Thread, Turn
from t3d.observe import exposition as x
from t3d.observe.agents import CLOCK_TICKS, parse_stat_cpu_s, read_groups, read_process
from t3d.observe.histogram import OTHER, Histogram, Histograms
from t3d.observe.logs import JsonFormatter
from t3d.observe.tally import MAX_THREADS, CommitTally
from t3d.store.commit import Committed, StoredEvent


def test_a_histogram_counts_each_value_in_its_bucket_inclusive_of_the_bound() -> None:
    """le is inclusive: 1.0 falls in le=1.0; the buckets come out cumulative, +Inf last."""
    h = Histogram((0.5, 1.0))
    for v in (0.1, 1.0, 3.0):
        h.observe(v)
    assert h.cumulative() == [("0.5", 1), ("1.0", 2), ("+Inf", 3)]
    assert (h.count, h.sum) == (3, 4.1)


def test_a_histogram_family_is_bounded() -> None:
    """Past max_series, new label combinations share one ``other`` series."""
    family = Histograms((1.0,), max_series=2)
    for name in ("a", "b", "c", "d"):
        family.observe((name,), 0.5)
    assert set(family.series) == {("a",), ("b",), (OTHER,)}
    assert family.series[(OTHER,)].count == 2


def _event(seq: int, entity: object, kind: str) -> StoredEvent:
    return StoredEvent(seq, kind, getattr(entity, "thread_id", getattr(entity, "id", None)), entity, b"{}", 0.0)  # type: ignore[arg-type]


def _thread(thread_id: str, provider: str = "replay") -> Thread:
    return Thread(thread_id, "p", "t", provider, None, "approval-required", None, None, None, "idle", 0.0)


def _turn(status: str, *, started: float | None = None, completed: float | None = None, error: str | None = None) -> Turn:
    return Turn("u1", "t1", 1, status, requested_at=10.0, started_at=started, completed_at=completed, error=error)  # type: ignore[arg-type]


def test_the_tally_counts_a_turn_once_started_and_once_finished() -> None:
    """starting -> running -> running (usage) -> completed counts one start and one finish
    (provider from the thread), the duration from the turn's own times, and clears the
    thread's active turn; events are counted by kind."""
    tally = CommitTally()
    tally.on_commit(Committed({}, (_event(1, _thread("t1"), "thread.updated"), _event(2, _turn("starting"), "turn.updated"))))
    assert tally.active_by_status()["starting"] == 1
    for seq, turn in enumerate((_turn("running", started=11.0), _turn("running", started=11.0)), 3):
        tally.on_commit(Committed({}, (_event(seq, turn, "turn.updated"),)))
    assert tally.turns_started == {"replay": 1}
    tally.on_commit(Committed({}, (_event(9, _turn("completed", started=11.0, completed=14.5), "turn.updated"),)))
    assert tally.turns_finished == {("replay", "completed"): 1}
    assert tally.turn_seconds.series[("replay", "completed")].sum == 3.5
    assert tally.active == {}
    assert tally.events == {"thread.updated": 1, "turn.updated": 4}


def test_a_turn_that_never_started_is_finished_without_a_duration() -> None:
    """A turn failed before its provider ran counts as finished (failed) with no duration
    observation, under provider unknown when no event named its thread's provider."""
    tally = CommitTally()
    tally.on_commit(Committed({}, (_event(1, _turn("failed", completed=12.0, error="no binary"), "turn.updated"),)))
    assert tally.turns_finished == {("unknown", "failed"): 1}
    assert tally.turn_seconds.series == {}


def test_the_tally_tracks_agents_and_forgets_deleted_threads() -> None:
    """An agent is known from its session's running event until its exited event; a
    deleted thread leaves nothing behind; the provider map is bounded."""
    tally = CommitTally()
    running = ProviderSession("s1", "t1", "replay", "running", 5.0, pid=42)
    tally.on_commit(Committed({}, (_event(1, running, "session.updated"),)))
    assert tally.describe_thread("t1")["session_id"] == "s1"
    exited = ProviderSession("s1", "t1", "replay", "exited", 5.0, pid=42, exited_at=9.0, exit_code=0)
    tally.on_commit(Committed({}, (_event(2, exited, "session.updated"),)))
    assert tally.agents == {}
    tally.on_commit(Committed({}, (_event(3, _thread("t1"), "thread.deleted"),)))
    assert tally.provider("t1") == "unknown"
    for n in range(MAX_THREADS + 5):
        tally.on_commit(Committed({}, (_event(n, _thread(f"x{n}"), "thread.updated"),)))
    assert tally.provider("x0") == "unknown" and tally.provider(f"x{MAX_THREADS + 4}") == "replay"


def test_a_json_log_line_is_one_object_with_fields_and_the_traceback() -> None:
    """time/level/logger/message first, then the record's extra fields; an exception's
    traceback goes in ``exception``; a newline in the message stays on one line."""
    try:
        raise ValueError("boom")
    except ValueError:
        info = sys.exc_info()
    record = logging.LogRecord("t3d.x", logging.ERROR, __file__, 1, "two\nlines %s", ("a",), info)
    record.thread_id = "t1"
    line = JsonFormatter().format(record)
    assert "\n" not in line
    value = orjson.loads(line)
    assert list(value)[:4] == ["time", "level", "logger", "message"]
    assert value["message"] == "two\nlines a" and value["level"] == "error" and value["thread_id"] == "t1"
    assert "ValueError: boom" in value["exception"]
    assert value["time"].endswith("Z")


def test_proc_figures_of_this_process_and_a_missing_one() -> None:
    """The stat parser takes a command name with spaces and parentheses; this process has
    an RSS and CPU time; a pid that does not exist is absent."""
    stat = "12 (a (b) c) S 1 12 12 0 -1 0 0 0 0 0 100 50 7 3 20 0 1 0 0 0 0"
    assert parse_stat_cpu_s(stat) == 160 / CLOCK_TICKS
    me = read_process(os.getpid())
    assert me is not None and me.rss_bytes > 0 and me.cpu_s > 0
    assert read_process(2**22 + 7) is None
    assert read_groups([]) == {}


def test_loopback_peers() -> None:
    """127.0.0.0/8, ::1 and IPv4-mapped loopback are loopback; anything else (or nothing) is not."""
    assert _loopback("127.0.0.1") and _loopback("127.1.2.3") and _loopback("::1") and _loopback("::ffff:127.0.0.1")
    assert not _loopback("10.0.0.1") and not _loopback("") and not _loopback("::ffff:10.0.0.1")


def test_the_hand_written_exposition_reads_back_through_prometheus_clients_parser() -> None:
    """Label values with a quote, a backslash and a newline, HELP text with a newline,
    NaN and infinities, integers and floats, and a histogram all come back exactly."""
    h = Histogram((0.5,))
    h.observe(0.25)
    h.observe(2.0)
    body = x.render([
        x.gauge("g", "two\nlines \\ here").sample(float("nan"), (("a", 'q"b\\n\nl'),)).sample(float("inf"), (("a", "x"),)),
        x.counter("c_total", "a counter", 7),
        x.histogram("h_seconds", "a histogram", h, (("k", "v"),)),
    ]).decode()
    assert body.splitlines()[:3] == ["# HELP g two\\nlines \\\\ here", "# TYPE g gauge", 'g{a="q\\"b\\\\n\\nl"} NaN']
    families = {f.name: f for f in text_string_to_metric_families(body)}
    gauge = families["g"]
    assert gauge.documentation == "two\nlines \\ here"
    assert [s.labels["a"] for s in gauge.samples] == ['q"b\\n\nl', "x"] and gauge.samples[1].value == float("inf")
    assert [(s.name, s.value) for s in families["c"].samples] == [("c_total", 7)]
    assert [(s.name, s.labels.get("le"), s.value) for s in families["h_seconds"].samples] == [
        ("h_seconds_bucket", "0.5", 1), ("h_seconds_bucket", "+Inf", 2), ("h_seconds_sum", None, 2.25), ("h_seconds_count", None, 2),
    ]
