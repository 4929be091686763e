"""Health latency while agent turns run: a first, small measurement.

Starts `t3d serve` on a fresh state dir, runs N replay sessions that start a
turn, wait for its terminal event (via a subscription), think, and repeat,
while a prober (a process of its own) hits ``GET /api/health`` every 100 ms
over a fresh TCP connection. Prints health latency p50/p99/max, turns completed and the
daemon's loop-lag figures. Uses only the public API (WebSocket + HTTP).

    python -m bench.health_probe --sessions 20 --seconds 30
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import trio
import trio_websocket

TERMINAL = {"completed", "interrupted", "failed", "cancelled"}


async def _http_get(port: int, path: str) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
    return b"".join(chunks)


async def probe(port: int, stop: trio.Event, samples: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await _http_get(port, "/api/health")
        samples.append((time.perf_counter() - start) * 1000)
        await trio.sleep(0.1)


async def session(port: int, token: str, project: Path, think: float, stop: trio.Event, done: list[float]) -> None:
    ids = itertools.count(1)
    headers = [("Authorization", f"Bearer {token}")]
    async with trio_websocket.open_websocket("127.0.0.1", port, "/ws", use_ssl=False, extra_headers=headers) as ws:

        async def call(method: str, **params: object) -> dict:
            request_id = next(ids)
            await ws.send_message(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).decode())
            while True:
                message = orjson.loads(await ws.get_message())
                if message.get("id") == request_id:
                    return message["result"]
                pending.append(message)

        pending: list[dict] = []
        project_id = (await call("project.create", path=str(project)))["project_id"]
        thread_id = (await call("thread.create", project_id=project_id, provider="replay"))["thread_id"]
        await call("subscribe.thread", thread_id=thread_id)
        while not stop.is_set():
            start = time.perf_counter()
            turn_id = (await call("turn.start", thread_id=thread_id, text="go"))["turn_id"]
            while True:
                message = pending.pop(0) if pending else orjson.loads(await ws.get_message())
                params = message.get("params") or {}
                if params.get("kind") != "event":
                    continue
                entity = params["data"]["entity"]
                kind = params["data"]["kind"]
                if kind == "request.updated" and entity["status"] == "pending":
                    await call("request.respond", request_id=entity["id"], decision="allow")
                if kind == "turn.updated" and entity["id"] == turn_id and entity["status"] in TERMINAL:
                    break
            done.append(time.perf_counter() - start)
            if os.environ.get("BENCH_DEBUG"):
                print(f"{thread_id[:6]} {entity['status']} {done[-1]:.2f}s", file=sys.stderr)
            await trio.sleep(think)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def probe_for(port: int, seconds: float) -> None:
    """The prober's own process: sample health for ``seconds``, print the samples as JSON."""
    stop = trio.Event()
    samples: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe, port, stop, samples)
        await trio.sleep(seconds)
        stop.set()
    print(orjson.dumps(samples).decode())


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def sample_rss(pid: int, samples: list[float]) -> None:
    while True:
        samples.append(rss_mib(pid))
        await trio.sleep(1)


async def drive(args: argparse.Namespace, port: int, token: str, project: Path, daemon_pid: int) -> None:
    stop = trio.Event()
    turns: list[float] = []
    rss: list[float] = []
    # The prober runs in a process of its own, so the load clients' scheduling is not in its figures.
    prober = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bench.health_probe", "--probe-port", str(port), "--seconds", str(args.seconds)],
        stdout=subprocess.PIPE,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample_rss, daemon_pid, rss)
        for _ in range(args.sessions):
            nursery.start_soon(session, port, token, project, args.think, stop, turns)
        await trio.sleep(args.seconds)
        stop.set()
        nursery.cancel_scope.deadline = trio.current_time() + 15
    assert prober.stdout is not None
    output = b"".join([chunk async for chunk in prober.stdout])
    await prober.wait()
    health: list[float] = orjson.loads(output)
    final = orjson.loads((await _http_get(port, "/api/health")).split(b"\r\n\r\n", 1)[1])
    print(f"sessions={args.sessions} window={args.seconds}s speed={args.speed} think={args.think}s")
    print(f"turns completed: {len(turns)}; turn p50 {statistics.median(turns):.2f}s" if turns else "turns completed: 0")
    print(f"health: n={len(health)} p50={statistics.median(health):.2f}ms p99={_percentile(health, 0.99):.2f}ms max={max(health):.2f}ms")
    print(f"daemon loop lag (last 10 s): {final['loop_lag_ms']}")
    third = max(1, len(rss) // 3)
    print(
        f"daemon RSS MiB: first {rss[0]:.1f}, median of first third {statistics.median(rss[:third]):.1f}, "
        f"median of last third {statistics.median(rss[-third:]):.1f}, peak {max(rss):.1f}"
    )


def main(args: argparse.Namespace) -> None:
    """Start a daemon on a fresh state dir, drive it, stop it."""
    state = Path(tempfile.mkdtemp(prefix="t3d-bench-"))
    project = state / "project"
    project.mkdir()
    env = {**os.environ, "T3D_REPLAY_INTERRUPT_TIMEOUT": "0.5"}
    cmd = [sys.executable, "-m", "t3d", "serve", "--state-dir", str(state), "--port", "0", "--replay-speed", str(args.speed), "--log-level", "warning"]
    daemon = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert daemon.stderr is not None
        found = re.search(r":(\d+)$", daemon.stderr.readline().strip())
        if found is None:
            raise SystemExit("the daemon did not print its URL; see its stderr")
        token = (state / "auth" / "token").read_text().strip()
        trio.run(drive, args, int(found.group(1)), token, project, daemon.pid)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--think", type=float, default=1.0)
    parser.add_argument("--probe-port", type=int, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.probe_port:
        trio.run(probe_for, parsed.probe_port, parsed.seconds)
    else:
        main(parsed)
