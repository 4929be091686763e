"""Health under a connection flood: ``python -m bench flood``.

    python -m bench flood --connections 1000 --seconds 60

Starts a fresh ``t3d serve``, opens ``--connections`` hostile connections without the
token and keeps them held (each reconnects a second after the daemon closes it), then for
``--seconds`` probes ``GET /api/health`` every 100 ms over a fresh connection, twice over:
without the token (as a monitor does) and with it (as ``t3d ctl status`` does), each
prober in a process of its own (bench/prober.py). It prints health p50/p99/max, failed
probes, the daemon's loop lag and how many hostile connections were held (the daemon
closes some: refused heads, head timeouts, shedding at its connection limit; they come
back), and writes ``flood.json`` to ``--out``. Everything runs on this machine, so the
hostile clients' own CPU counts against the daemon's figures.

The hostile mix (`run_hostile`, also used by tests/test_api_flood.py), a quarter each:
- idle: connect and send nothing;
- slow head: a request head dripped a byte a second;
- tokenless body: a POST without the token declaring a large body, then a byte a second;
- keep-alive idle: one public health request, then nothing on the open connection.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import attrs
import orjson
import trio

from bench import daemon as d
from bench.fixture import fixture_path
from bench.profiles import PROFILES
from bench.stats import maximum, percentile

KINDS = ("idle", "slow_head", "tokenless_body", "keepalive_idle")
DRIP_EVERY_S = 1.0
RECONNECT_AFTER_S = 1.0
# Descriptors the driver keeps beyond its hostile connections.
_SPARE_FDS = 256


@attrs.define
class HostileStats:
    """What the hostile clients saw; ``held`` is how many are connected right now."""

    held: int = 0
    held_peak: int = 0
    opened: int = 0
    closed_by_server: int = 0
    refused_401: int = 0  # tokenless bodies answered 401 before any body byte
    statuses: dict[int, int] = attrs.Factory(dict)


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft descriptor limit towards ``wanted`` (up to the hard
    limit); the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return int(soft)


async def run_hostile(
    port: int,
    count: int,
    stats: HostileStats,
    *,
    kinds: tuple[str, ...] = KINDS,
    reconnect: bool = True,
    opened: trio.Event | None = None,
    drip_every_s: float = DRIP_EVERY_S,
) -> None:
    """Hold ``count`` hostile connections to 127.0.0.1:``port``, of ``kinds`` in turn,
    until cancelled; ``opened`` is set once each has connected the first time. Without
    ``reconnect`` a connection the daemon closes stays closed."""
    all_opened = [0]
    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(
                _hold, port, kinds[i % len(kinds)], stats, reconnect, drip_every_s, all_opened, count, opened
            )


async def _hold(
    port: int,
    kind: str,
    stats: HostileStats,
    reconnect: bool,
    drip_every_s: float,
    all_opened: list[int],
    count: int,
    opened: trio.Event | None,
) -> None:
    first = True
    while True:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.sleep(RECONNECT_AFTER_S)
            continue
        stats.opened += 1
        stats.held += 1
        stats.held_peak = max(stats.held_peak, stats.held)
        if first:
            first = False
            all_opened[0] += 1
            if opened is not None and all_opened[0] == count:
                opened.set()
        try:
            async with stream:
                await _misbehave(stream, kind, port, stats, drip_every_s)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the daemon closed or reset it: what a hostile client expects
        finally:
            stats.held -= 1
        stats.closed_by_server += 1
        if not reconnect:
            return
        await trio.sleep(RECONNECT_AFTER_S)


async def _misbehave(
    stream: trio.SocketStream, kind: str, port: int, stats: HostileStats, drip_every_s: float
) -> None:
    """Play one hostile client until the daemon closes the connection."""
    host = f"Host: 127.0.0.1:{port}\r\n".encode()
    if kind == "slow_head":
        await stream.send_all(b"GET /api/shell HTTP/1.1\r\n" + host)
        await _drip(stream, b"X-Slow: 1\r\n", drip_every_s)
    elif kind == "tokenless_body":
        await stream.send_all(b"POST /api/dispatch HTTP/1.1\r\n" + host + b"Content-Length: 1000000\r\n\r\n")
        await _drip(stream, b"x", drip_every_s, stats)
    elif kind == "keepalive_idle":
        await stream.send_all(b"GET /api/health HTTP/1.1\r\n" + host + b"\r\n")
        await _read_until_closed(stream, stats)
    else:
        await _read_until_closed(stream, stats)


async def _drip(
    stream: trio.SocketStream, byte: bytes, every_s: float, stats: HostileStats | None = None
) -> None:
    """Send ``byte`` (cycling through it) every ``every_s`` until the daemon closes."""
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            await _read_until_closed(stream, stats)
            nursery.cancel_scope.cancel()

        nursery.start_soon(read)
        i = 0
        while True:
            await trio.sleep(every_s)
            await stream.send_all(byte[i % len(byte) : i % len(byte) + 1])
            i += 1


async def _read_until_closed(stream: trio.SocketStream, stats: HostileStats | None) -> None:
    """Read until the daemon closes; count the status of its first reply."""
    head = bytearray()
    while data := await stream.receive_some(65536):
        if stats is not None and len(head) < 12:
            head += data
            if len(head) >= 12 and head.startswith(b"HTTP/1.1 "):
                status = int(head[9:12])
                stats.statuses[status] = stats.statuses.get(status, 0) + 1
                stats.refused_401 += status == 401


async def _flood(args: argparse.Namespace, out: Path) -> dict[str, object]:
    limit = raise_fd_limit(args.connections + _SPARE_FDS)
    if limit < args.connections + _SPARE_FDS:
        raise SystemExit(f"this process may open only {limit} files; raise ulimit -n for --connections {args.connections}")
    state = d.prepare_state(out / "state", None)
    fixture = fixture_path(PROFILES["stress"].fixture)
    stats = HostileStats()
    async with (
        d.open_daemon(state, fixture, {}, out / "daemon.log") as daemon,
        trio.open_nursery() as nursery,
    ):
        opened = trio.Event()
        nursery.start_soon(partial(run_hostile, daemon.port, args.connections, stats, opened=opened))
        with trio.move_on_after(30):
            await opened.wait()
        await trio.sleep(2)  # let the daemon take them all in
        until = time.monotonic() + args.seconds
        held: list[int] = []
        probers = [
            await trio.lowlevel.open_process(
                [sys.executable, "-m", "bench.prober", str(daemon.port), str(until), str(out / f"{name}.json"), *extra]
            )
            for name, extra in (("public", []), ("authenticated", [str(state.token_path)]))
        ]
        while time.monotonic() < until:
            held.append(stats.held)
            await trio.sleep(0.5)
        for prober in probers:
            await prober.wait()
        nursery.cancel_scope.cancel()
    result: dict[str, object] = {
        "connections": args.connections,
        "seconds": args.seconds,
        "held_min": min(held, default=0),
        "held_mean": round(sum(held) / len(held), 1) if held else 0,
        "hostile_opened": stats.opened,
        "hostile_statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
    }
    for name in ("public", "authenticated"):
        samples = orjson.loads((out / f"{name}.json").read_bytes())
        latency = [s[1] for s in samples if s[1] is not None]
        result[name] = {
            "probes": len(samples),
            "failed": len(samples) - len(latency),
            "p50_ms": _round(percentile(latency, 50)),
            "p99_ms": _round(percentile(latency, 99)),
            "max_ms": _round(maximum(latency)),
        }
        if name == "authenticated":  # the whole report carries the daemon's loop lag
            result["loop_lag_max_ms"] = _round(maximum(s[4] for s in samples if s[4] is not None))
    return result


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def command(args: argparse.Namespace) -> int:
    out = Path(args.out or tempfile.mkdtemp(prefix="t3d-flood-"))
    out.mkdir(parents=True, exist_ok=True)
    result = trio.run(_flood, args, out)
    (out / "flood.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(
        f"{result['connections']} hostile connections (held: min {result['held_min']}, "
        f"mean {result['held_mean']}) for {result['seconds']:g} s"
    )
    for name in ("public", "authenticated"):
        fig = result[name]
        assert isinstance(fig, dict)
        print(
            f"  health {name:13}: p50 {fig['p50_ms']} ms  p99 {fig['p99_ms']} ms  "
            f"max {fig['max_ms']} ms  failed {fig['failed']}/{fig['probes']}"
        )
    print(f"  daemon loop lag max: {result.get('loop_lag_max_ms')} ms")
    print(f"  hostile replies by status: {result['hostile_statuses']}")
    print(f"results: {out / 'flood.json'}")
    return 0
