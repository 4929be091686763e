"""Clients that never read, and probes of what a healthy client sees meanwhile (``--slow-clients``).

- `run_slow_client`: a WebSocket client on a socket with a 4 KiB receive buffer. It
  subscribes to the shell and to every thread, then never reads another byte. The daemon
  ends a connection whose peer takes none of its bytes for 60 s (its idle timeout), so the
  client resets its connection every `SLOW_HOLD_S` and connects again: K never-reading
  connections are open through the whole window, each re-subscribing to everything.
- `run_rename_probe`: a healthy client follows a thread of its own and renames it every
  second; the event delay is the time from sending the rename to receiving its event.
- `run_switch_probe`: a healthy client that switches its subscription to the next session
  thread every 2 s; each switch's time to its first snapshot chunk is a first-chunk sample.
"""

from __future__ import annotations

import socket
import struct
import time

import attrs
import orjson
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, Request, TextMessage

from bench.actors import EXPECTED, Errors, SubscriberStats, Window, first_chunk, sleep_until
from bench.client import Json, open_rpc

SLOW_RECEIVE_BUFFER = 4096
SLOW_HOLD_S = 45.0
RENAME_GRACE_S = 5.0  # no rename in the window's last seconds
RENAME_EVERY_S = 1.0
SWITCH_EVERY_S = 2.0


@attrs.define
class SlowStats:
    connects: int = 0
    subscriptions: int = 0  # subscribe requests sent, over every connection


async def _never_reading(port: int, token: str, frames: list[bytes]) -> trio.SocketStream:
    """A WebSocket with a small receive buffer: the handshake is read, then only sends."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RECEIVE_BUFFER)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    ws = WSConnection(ConnectionType.CLIENT)
    auth = [(b"authorization", f"Bearer {token}".encode())]
    await stream.send_all(ws.send(Request(host="127.0.0.1", target="/ws", extra_headers=auth)))
    accepted = False
    while not accepted:
        data = await stream.receive_some(4096)
        if not data:
            raise trio.BrokenResourceError("the daemon closed the connection during the handshake")
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, RejectConnection):
                raise trio.BrokenResourceError(
                    f"the daemon refused the WebSocket ({event.status_code})"
                )
            accepted = accepted or isinstance(event, AcceptConnection)
    for frame in frames:
        await stream.send_all(ws.send(TextMessage(frame.decode())))
    return stream


async def _reset(stream: trio.SocketStream) -> None:
    with trio.CancelScope(shield=True):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()


async def run_slow_client(
    port: int, token: str, threads: list[str], stats: SlowStats, errors: Errors
) -> None:
    """Subscribe to the shell and every thread, never read; reconnect every SLOW_HOLD_S."""
    requests = [{"method": "subscribe.shell"}] + [
        {"method": "subscribe.thread", "params": {"thread_id": t}} for t in threads[:255]
    ]
    frames = [orjson.dumps({"jsonrpc": "2.0", "id": n, **r}) for n, r in enumerate(requests)]
    while True:
        try:
            stream = await _never_reading(port, token, frames)
        except EXPECTED as exc:
            errors.add("slow client", exc)
            await trio.sleep(1.0)
            continue
        stats.connects += 1
        stats.subscriptions += len(frames)
        try:
            await trio.sleep(SLOW_HOLD_S)
        finally:
            await _reset(stream)


@attrs.define
class ProbeStats:
    renames: int = 0  # renames sent in the window
    delays_ms: list[float] = attrs.field(factory=list)  # their events' delays
    sent: dict[str, float] = attrs.field(factory=dict)  # title -> when sent (until its event)


async def run_rename_probe(
    port: int, token: str, thread_id: str, window: Window, stats: ProbeStats, errors: Errors
) -> None:
    def on_note(note: Json, at: float) -> None:
        data = note.get("data")
        if (
            note.get("kind") == "event"
            and isinstance(data, dict)
            and data.get("kind") == "thread.updated"
        ):
            started = stats.sent.pop(str((data.get("entity") or {}).get("title")), None)
            if started is not None:
                stats.delays_ms.append((at - started) * 1000)

    try:
        async with open_rpc(port, token, on_note) as rpc:
            await rpc.call("subscribe.thread", thread_id=thread_id)
            await sleep_until(window.start)
            n = 0
            # The steady phase is cut at window.end: a rename sent in its last seconds could
            # be counted missed while its event is still on the way.
            while time.monotonic() < window.end - RENAME_GRACE_S:
                n += 1
                title = f"probe {n}"
                stats.sent[title] = time.monotonic()
                stats.renames += 1
                await rpc.call("thread.rename", thread_id=thread_id, title=title)
                await trio.sleep(RENAME_EVERY_S)
    except EXPECTED as exc:
        errors.add("rename probe", exc)


async def run_switch_probe(
    port: int,
    token: str,
    threads: list[str],
    window: Window,
    stats: SubscriberStats,
    errors: Errors,
) -> None:
    def on_note(note: Json, at: float) -> None:
        if note.get("kind") == "snapshot.chunk":
            first_chunk(stats, at, window)

    try:
        async with open_rpc(port, token, on_note) as rpc:
            await sleep_until(window.start)
            sub: str | None = None
            position = 0
            while time.monotonic() < window.end:
                if sub is not None:
                    await rpc.call("unsubscribe", sub=sub)
                stats.pending_since = time.monotonic()
                sub = str(
                    (
                        await rpc.call(
                            "subscribe.thread", thread_id=threads[position % len(threads)]
                        )
                    )["sub"]
                )
                stats.switches += 1
                position += 1
                await trio.sleep(SWITCH_EVERY_S)
    except EXPECTED as exc:
        errors.add("switch probe", exc)
