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

from bench.__main__ import configurations, described_configurations, pollers_of
from bench.actors import Errors, PollerStats, Window, run_mcp_poller, run_poller

READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"


@pytest.mark.parametrize("kind", ["http", "mcp"])
async def test_a_poller_allows_its_threads_prompt_and_records_the_approval_latency(tmp_path: Path, nursery: trio.Nursery, kind: str) -> None:
    """The poller (HTTP: pending list every 0.2 s; MCP: wait_for_request long-polls) allows the
    Edit prompt of a thread it owns, and records, for that request opened in the window, the
    time from its opening to the poller seeing it and to the answer committed (seen first)."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
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
