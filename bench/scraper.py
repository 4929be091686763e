"""A Prometheus-like scraper: ``python -m bench.scraper CONFIG`` in a process of its own.

CONFIG is a JSON file with ``port``, ``token``, ``interval`` (seconds), ``until``
(monotonic seconds) and ``out``. Every ``interval`` it sends ``GET /metrics`` with the
token over one keep-alive connection (as Prometheus does; a new one if the daemon closed
it) and keeps, per scrape, the monotonic start time, the round trip in ms (None if it
failed) and the body's size in bytes. At ``until`` it writes them to ``out`` as JSON and
exits 0. Run with ``python -m bench run --scrape-interval 0,1``: configuration A without
a scraper, B scraping every second, interleaved (the daemon's CPU of each is the cost).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import h11
import orjson
import trio

TIMEOUT_S = 10.0


class Scraper:
    def __init__(self, port: int, token: str) -> None:
        self._port = port
        self._token = token
        self._stream: trio.SocketStream | None = None
        self._conn = h11.Connection(h11.CLIENT)

    async def scrape(self) -> int:
        """One GET /metrics; returns the body's size. Raises on any failure (the caller counts it)."""
        if self._stream is None or self._conn.our_state is not h11.IDLE:
            await self.aclose()
            self._stream = await trio.open_tcp_stream("127.0.0.1", self._port)
            self._conn = h11.Connection(h11.CLIENT)
        conn, stream = self._conn, self._stream
        headers = [("Host", f"127.0.0.1:{self._port}"), ("Authorization", f"Bearer {self._token}"), ("Accept", "text/plain")]
        await stream.send_all(conn.send(h11.Request(method="GET", target="/metrics", headers=headers)) + conn.send(h11.EndOfMessage()))
        status, size = 0, 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(256 * 1024)
                if not data:
                    raise trio.BrokenResourceError("the daemon closed the connection")
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("the daemon closed the connection")
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            await self.aclose()
        else:
            conn.start_next_cycle()
        if status != 200:
            raise RuntimeError(f"GET /metrics answered {status}")
        return size

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()


async def scrape_until(port: int, token: str, interval: float, until: float) -> list[list[Any]]:
    scraper = Scraper(port, token)
    samples: list[list[Any]] = []
    try:
        while (started := time.monotonic()) < until:
            latency: float | None = None
            size = 0
            with trio.move_on_after(TIMEOUT_S):
                try:
                    size = await scraper.scrape()
                    latency = (time.monotonic() - started) * 1000
                except (OSError, trio.BrokenResourceError, h11.ProtocolError, RuntimeError):
                    await scraper.aclose()
            samples.append([started, latency, size])
            await trio.sleep(max(0.0, started + interval - time.monotonic()))
    finally:
        await scraper.aclose()
    return samples


def main(argv: list[str]) -> int:
    config = orjson.loads(Path(argv[0]).read_bytes())
    samples = trio.run(scrape_until, config["port"], config["token"], float(config["interval"]), float(config["until"]))
    Path(config["out"]).write_bytes(orjson.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
