"""Reading `GET /metrics` in tests: the raw body, and its samples parsed by prometheus_client."""

from __future__ import annotations

from typing import Any

import h11
import trio
from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


async def get_raw(port: int, path: str, *, token: str | None) -> tuple[int, dict[str, str], bytes]:
    """One GET over a fresh connection: (status, headers, body)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        headers = [("Host", f"127.0.0.1:{port}"), ("Connection", "close")]
        if token is not None:
            headers.append(("Authorization", f"Bearer {token}"))
        await stream.send_all(conn.send(h11.Request(method="GET", target=path, headers=headers)) + conn.send(h11.EndOfMessage()))
        status, got, chunks = 0, {}, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                got = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, got, b"".join(chunks)


def parse(body: bytes) -> dict[str, Any]:
    """Families by name: {name: (type, {labels: value})} (prometheus_client's parser)."""
    families: dict[str, Any] = {}
    for family in text_string_to_metric_families(body.decode()):
        samples = {}
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        families[family.name] = (family.type, samples)
    return families


def value(families: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    """One sample's value (0 when the series does not exist yet)."""
    _, samples = families.get(family, (None, {}))
    return float(samples.get((sample or family, frozenset(labels.items())), 0.0))


async def scrape(port: int, token: str | None) -> dict[str, Any]:
    status, _, body = await get_raw(port, "/metrics", token=token)
    assert status == 200, body[:300]
    return parse(body)
