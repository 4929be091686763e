"""The benchmark's approval pollers (bench/actors.py): HTTP polling and MCP long-polls.

Each poller runs against a real daemon whose replay agent asks a real permission prompt;
the test pins that it answers the prompts of its own threads and records the approval's
latency, and that `--pollers` makes configurations as the report shows them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
import trio
from harness import new_thread, open_client, run_turn, start_daemon, wait_until

from bench import figures, metrics_text
from bench.__main__ import configurations, described_configurations, pollers_of
from bench.actors import Errors, PollerStats, Window, run_mcp_poller, run_poller
from bench.client import HttpClient

READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"


@pytest.mark.parametrize("kind", ["http", "mcp"])
async def test_a_poller_allows_its_threads_prompt_and_records_the_approval_latency(tmp_path: Path, nursery: trio.Nursery, kind: str) -> None:
    """The poller (HTTP: pending list every 0.2 s; MCP: wait_for_request long-polls) allows the
    Edit prompt of a thread it owns, and records, for that request opened in the window, the
    time from its opening to the poller seeing it and to the answer committed (seen first).
    The daemon's /metrics, read before and after, give the figures from the commit: one
    request committed, one long-poll reply carrying it (MCP; HTTP polling makes none)."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        scraper = HttpClient(daemon.info.port, daemon.token)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
            before = (await scraper.request("GET", "/metrics", decode=False)).decode()
            now = time.monotonic()
            window = Window(now, now, now + 60)
            stats, errors = PollerStats(), Errors()
            async with trio.open_nursery() as pollers:
                if kind == "mcp":
                    pollers.start_soon(run_mcp_poller, daemon.info.port, daemon.token, frozenset({thread_id}), 0.0, window, stats, errors)
                else:
                    pollers.start_soon(run_poller, daemon.info.port, daemon.token, frozenset({thread_id}), 0.2, 0.0, window, stats, errors)
                turn_id = (await client.call("turn.start", thread_id=thread_id, text=EDIT))["turn_id"]
                await client.wait_event(lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn_id and d["entity"]["status"] == "completed")
                await wait_until(lambda: stats.answered_ms)
                pollers.cancel_scope.cancel()
            after = (await scraper.request("GET", "/metrics", decode=False)).decode()
            await scraper.aclose()
        fig: dict[str, object] = {}
        missing: dict[str, str] = {}
        figures._approvals_from_commit((before, after), fig, missing)
        assert fig["approval_commit_p50_ms"] is not None and 0 <= fig["approval_commit_p95_ms"] < 30_000  # type: ignore[operator]
        if kind == "mcp":
            assert fig["approval_replies"] == 1 and 0 <= fig["approval_reply_p95_ms"] < 30_000  # type: ignore[operator]
        else:
            assert fig["approval_replies"] == 0 and "approval_reply_p50_ms" in missing
        assert errors.counts == {} and stats.approvals == 1
        [seen], [answered] = stats.seen_ms, stats.answered_ms
        assert 0 <= seen <= answered < 30_000
        assert stats.calls >= 2
        daemon.stop()


def test_pollers_make_configurations_a_and_b_or_set_every_run() -> None:
    """--pollers http,mcp is two configurations (A polls over HTTP, B long-polls over MCP),
    named so in the report; one kind sets every run; anything else, or two kinds beside
    --compare, is refused with the fix."""

    def args(pollers: str | None, compare: str | None = None) -> argparse.Namespace:
        return argparse.Namespace(pollers=pollers, compare=compare, slow_clients=None)

    assert pollers_of(args("http,mcp")) == {"A": "http", "B": "mcp"}
    assert list(configurations(args("http,mcp"))) == ["A", "B"]
    assert described_configurations(args("http,mcp")) == {"A": {"--pollers": "http"}, "B": {"--pollers": "mcp"}}
    assert pollers_of(args("mcp")) == {"A": "mcp", "B": "mcp"} and list(configurations(args("mcp"))) == ["A"]
    assert described_configurations(args(None)) == {"A": {}}
    with pytest.raises(SystemExit, match="http, mcp or http,mcp"):
        pollers_of(args("ws"))
    with pytest.raises(SystemExit, match="drop --compare"):
        pollers_of(args("http,mcp", compare="T3D_X=1"))


METRICS = """# TYPE t3d_request_wait_reply_seconds histogram
t3d_request_wait_reply_seconds_bucket{via="mcp",le="0.01"} %d
t3d_request_wait_reply_seconds_bucket{via="mcp",le="0.05"} %d
t3d_request_wait_reply_seconds_bucket{via="mcp",le="+Inf"} %d
t3d_request_wait_reply_seconds_sum{via="mcp"} 1.0
t3d_request_wait_reply_seconds_count{via="mcp"} %d
t3d_request_wait_reply_seconds_bucket{via="rpc",le="0.01"} %d
t3d_request_wait_reply_seconds_bucket{via="rpc",le="0.05"} %d
t3d_request_wait_reply_seconds_bucket{via="rpc",le="+Inf"} %d
t3d_request_wait_reply_seconds_count{via="rpc"} %d
t3d_request_wait_reply_seconds_other_bucket{le="0.01"} 999
"""


def test_approval_figures_from_the_commit_come_from_the_histograms_window_deltas() -> None:
    """The bucket lines of one histogram are summed over its label sets (but le), the
    window's figures come from end minus start per bucket, and a quantile is interpolated
    inside its bucket (the +Inf bucket gives the highest finite bound); with no observation in
    the window, or no such histogram, the figure is None and says why."""
    start = METRICS % (10, 10, 10, 10, 5, 5, 5, 5)
    # In the window: mcp 20 in (0, 10 ms], 60 in (10, 50 ms], 20 above; rpc 0.
    end = METRICS % (30, 90, 110, 110, 5, 5, 5, 5)
    assert metrics_text.histogram_buckets(start, "t3d_request_wait_reply_seconds") == [(0.01, 15.0), (0.05, 15.0), (float("inf"), 15.0)]
    deltas = metrics_text.bucket_deltas(metrics_text.histogram_buckets(start, "t3d_request_wait_reply_seconds"), metrics_text.histogram_buckets(end, "t3d_request_wait_reply_seconds"))
    assert deltas == [(0.01, 20.0), (0.05, 80.0), (float("inf"), 100.0)]
    assert metrics_text.bucket_quantile(deltas, 0.1) == pytest.approx(0.005)
    assert metrics_text.bucket_quantile(deltas, 0.5) == pytest.approx(0.01 + 0.04 * 30 / 60)
    assert metrics_text.bucket_quantile(deltas, 0.95) == 0.05
    assert metrics_text.bucket_quantile([(0.01, 0.0), (float("inf"), 0.0)], 0.5) is None
    assert metrics_text.histogram_buckets(start, "t3d_absent") == []
    fig: dict[str, object] = {}
    missing: dict[str, str] = {}
    figures._approvals_from_commit((start, end), fig, missing)
    assert fig["approval_reply_p50_ms"] == pytest.approx(30.0) and fig["approval_replies"] == 100.0
    assert fig["approval_commit_p50_ms"] is None and "t3d_request_commit_seconds" in missing["approval_commit_p50_ms"]
    figures._approvals_from_commit((start, start), fig, missing)
    assert fig["approval_reply_p95_ms"] is None and missing["approval_reply_p95_ms"] == "no runtime request in the window"
    figures._approvals_from_commit(None, fig, missing)
    assert fig["approval_replies"] is None and "GET /metrics" in missing["approval_replies"]
