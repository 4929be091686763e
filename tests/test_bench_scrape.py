"""Bench support for the cost of scraping: --scrape-interval, the scraper, its figures."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
import trio
from harness import start_daemon
from metrics_support import scrape, value

from bench import observe_cost
from bench.__main__ import configurations, described_configurations, scrape_intervals_of
from bench.figures import _scrapes
from bench.scraper import scrape_until


def _args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"compare": None, "slow_clients": None, "scrape_interval": None, **given})


def test_scrape_interval_gives_every_configuration_one_or_compares_two() -> None:
    """``1``: one configuration scraping every second; ``0,1``: A without a scraper, B with
    one, shown in the report; nonsense and a second comparison are refused."""
    assert scrape_intervals_of(_args(scrape_interval="1")) == {"A": 1.0, "B": 1.0}
    assert list(configurations(_args(scrape_interval="1"))) == ["A"]
    assert scrape_intervals_of(_args(scrape_interval="0,1")) == {"A": 0.0, "B": 1.0}
    assert described_configurations(_args(scrape_interval="0,1")) == {"A": {"--scrape-interval": "0"}, "B": {"--scrape-interval": "1"}}
    for bad in ("x", "0.01", "1,2,3"):
        with pytest.raises(SystemExit):
            scrape_intervals_of(_args(scrape_interval=bad))
    with pytest.raises(SystemExit):
        scrape_intervals_of(_args(scrape_interval="0,1", compare="T3D_X=1"))


def test_scrape_figures_count_the_window_only() -> None:
    """Round-trip percentiles, failures and the body size come from scrapes in the window;
    without a scraper each figure is missing with the option that measures it."""
    samples = [[0.5, 9.0, 100], [1.0, 2.0, 1024], [2.0, None, 0], [3.0, 4.0, 2048], [9.0, 50.0, 10]]
    fig: dict[str, object] = {}
    missing: dict[str, str] = {}
    _scrapes(samples, 1.0, 5.0, fig, missing)
    assert (fig["scrapes"], fig["scrape_failures"], fig["scrape_max_ms"], fig["scrape_kib"]) == (3, 1, 4.0, 2.0)
    assert missing == {}
    _scrapes(None, 1.0, 5.0, fig, missing)
    assert fig["scrape_p99_ms"] is None and "--scrape-interval" in missing["scrape_p99_ms"]


async def test_the_scraper_scrapes_a_real_daemon_over_one_connection(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Against a real daemon, every scrape in 1.5 s at 0.2 s succeeds with a body of several
    KiB, over one keep-alive connection."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        samples = await scrape_until(daemon.info.port, daemon.token, 0.2, time.monotonic() + 1.5)
        after = await scrape(daemon.info.port, daemon.token)
        daemon.stop()
    assert value(after, "t3d_http_connections_accepted", "t3d_http_connections_accepted_total") == 2  # the scraper's and this one
    assert len(samples) >= 4
    assert all(latency is not None and size > 4096 for _, latency, size in samples)


def test_the_tally_cost_measurement_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench.observe_cost` prints the tally's cost per event."""
    assert observe_cost.main(["--turns", "20"]) == 0
    assert "µs per event" in capsys.readouterr().out
