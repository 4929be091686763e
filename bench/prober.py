"""The health prober: ``python -m bench.prober PORT UNTIL OUT TOKEN_FILE`` in a process of its own.

Every 100 ms it sends ``GET /api/health`` over a fresh TCP connection (the accept path
included, as a monitoring probe does) and keeps, per sample, the monotonic time, the
round trip in ms and the loop lag the daemon reported (``loop_lag_ms``: ``last``, ``p99``
and ``max`` of its recent samples; the whole report needs the token, read from
``TOKEN_FILE``). A failed probe is kept with a round trip of None.
At ``UNTIL`` (monotonic seconds) it writes the samples to ``OUT`` as JSON and exits 0.
Its own process keeps the load clients' scheduling out of its figures.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import h11
import orjson
import trio

from bench.client import http_get_once

INTERVAL_S = 0.1
TIMEOUT_S = 10.0


def lag_of(body: bytes) -> tuple[float | None, float | None, float | None]:
    """(last, p99, max) of the health body's ``loop_lag_ms``; None for what it lacks. Pure."""
    try:
        lag = orjson.loads(body).get("loop_lag_ms") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None, None, None
    return lag.get("last"), lag.get("p99"), lag.get("max")


async def probe_until(port: int, until: float, token: str | None = None) -> list[list[Any]]:
    samples: list[list[Any]] = []
    while (started := time.monotonic()) < until:
        latency: float | None = None
        lag: tuple[float | None, float | None, float | None] = (None, None, None)
        with trio.move_on_after(TIMEOUT_S):
            try:
                status, body = await http_get_once(port, "/api/health", token)
            except (OSError, trio.BrokenResourceError, h11.ProtocolError):  # a daemon restarting
                status, body = 0, b""
            if status == 200:
                latency = (time.monotonic() - started) * 1000
                lag = lag_of(body)
        samples.append([started, latency, *lag])
        await trio.sleep(max(0.0, started + INTERVAL_S - time.monotonic()))
    return samples


def main(argv: list[str]) -> int:
    port, until, out = int(argv[0]), float(argv[1]), Path(argv[2])
    token = Path(argv[3]).read_text().strip() if len(argv) > 3 else None
    samples = trio.run(probe_until, port, until, token)
    out.write_bytes(orjson.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
