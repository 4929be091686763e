"""Helpers for the live-delivery tests: merging snapshot chunks, and the API served in-process.

`serve_app` assembles the real pieces run_daemon wires together for the API
(store on a real SQLite file, hub, methods, ApiApp, the HTTP/WebSocket
transport on 127.0.0.1 port 0), without provider sessions, so a test can
commit domain commands directly and look at the hub's and the transport's
statistics.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import attrs
import orjson
import trio
import trio_websocket
from harness import RpcClient
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

from t3d.api.app import ApiApp
from t3d.api.methods import Methods
from t3d.api.transport import TransportStats, serve_api_transport
from t3d.daemon import DaemonInfo
from t3d.domain import commands as c
from t3d.domain.model import TurnItem
from t3d.live.budget import CONNECTION_BYTES
from t3d.live.hub import Hub
from t3d.spawn.direct import DirectSpawner
from t3d.store.store import Store, open_store

LIST_KEYS = ("turns", "items", "requests", "tasks", "projects", "threads")


def merge_chunks(notes: list[dict[str, Any]]) -> dict[str, Any]:
    """One snapshot from its ``snapshot.chunk`` notifications (others are ignored): the first
    chunk's head fields, and every list concatenated in chunk order."""
    merged: dict[str, Any] = {}
    for note in notes:
        if note["kind"] != "snapshot.chunk":
            continue
        for key, value in note["data"].items():
            if key in LIST_KEYS:
                merged.setdefault(key, []).extend(value)
            else:
                assert key not in merged, f"head field {key} in a later chunk"
                merged[key] = value
    return merged


@attrs.define
class Served:
    """The app served in-process; quacks like harness.Daemon for `http` and `ws_client`."""

    store: Store
    hub: Hub
    app: ApiApp
    transport: TransportStats
    port: int
    token: str = "test-token"

    @property
    def info(self) -> DaemonInfo:
        return DaemonInfo(f"http://127.0.0.1:{self.port}", self.port, "")


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


@asynccontextmanager
async def serve_app(state: Path, *, encode_once: bool = True, connection_budget: int = CONNECTION_BYTES) -> AsyncIterator[Served]:
    async with open_store(state / "t3d.sqlite", on_writer_lost=_lost) as store, trio.open_nursery() as nursery:
        hub = Hub(encode_once=encode_once)
        store.on_commit(hub.publish)
        bound: list[int] = [0]
        app = ApiApp(
            Methods(store),
            hub,
            "test-token",
            health=lambda: {"status": "ok"},
            bound=lambda: ("127.0.0.1", bound[0]),
            spawner=DirectSpawner(),
            connection_budget=connection_budget,
        )
        transport = TransportStats()
        port = await nursery.start(_serve, app, transport)
        bound[0] = port
        yield Served(store, hub, app, transport, port)
        nursery.cancel_scope.cancel()


async def _serve(app: ApiApp, transport: TransportStats, *, task_status: trio.TaskStatus[int]) -> None:
    await serve_api_transport(app, "127.0.0.1", 0, stats=transport, task_status=task_status)


# --- clients of an in-process app ---------------------------------------------------


@asynccontextmanager
async def ws_client(served: Any, *, receive_buffer: int | None = None) -> AsyncIterator[RpcClient]:
    """A trio-websocket JSON-RPC client on a socket the test owns, to an in-process app or
    a harness daemon; a small ``receive_buffer`` makes a client that stops reading stall the
    server's sends soon."""
    port = served.info.port
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    async with trio.SocketStream(sock) as stream:
        await sock.connect(("127.0.0.1", port))
        async with trio.open_nursery() as nursery:
            ws = await trio_websocket.wrap_client_stream(
                nursery, stream, "127.0.0.1", "/ws",
                extra_headers=[(b"Authorization", f"Bearer {served.token}".encode())],
                max_message_size=64 * 1024 * 1024,
            )  # fmt: skip
            yield RpcClient(ws)
            await ws.aclose()


async def raw_notes(client: RpcClient, sub: str, until: str) -> list[tuple[int, dict[str, Any]]]:
    """(frame size in bytes, notification) of ``sub``, read raw, up to the first of kind ``until``."""
    out = []
    while True:
        text = await client.ws.get_message()
        message = orjson.loads(text)
        if message.get("method") == "sub" and message["params"]["sub"] == sub:
            out.append((len(text.encode() if isinstance(text, str) else text), message["params"]))
            if message["params"]["kind"] == until:
                return out


async def notes_until(client: RpcClient, sub: str, kind: str) -> list[dict[str, Any]]:
    """Notifications of ``sub`` up to and including the first of ``kind``."""
    seen = []
    while True:
        note = await client.next_notification()
        if note["sub"] == sub:
            seen.append(note)
            if note["kind"] == kind:
                return seen


async def thread_events(db_path: Path, thread_id: str) -> list[dict[str, Any]]:
    """Every event of a thread so far as ``{kind, sequence, entity}``, read from the events
    table on a worker thread (the loop never runs SQLite); a compacted event's entity is
    None (retention dropped its payload: its body is its row)."""

    def read() -> list[dict[str, Any]]:
        conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            rows = conn.execute("SELECT sequence, kind, payload FROM events WHERE thread_id = ? ORDER BY sequence", (thread_id,))
            return [{"kind": kind, "sequence": seq, "entity": orjson.loads(payload) if payload else None} for seq, kind, payload in rows]
        finally:
            conn.close()

    return await trio.to_thread.run_sync(read)


def write_flood_fixture(path: Path, items: int, *, text_bytes: int = 200) -> None:
    """A one-turn Claude recording whose answer is ``items`` separate assistant messages."""
    session = "6175092a-f216-416d-a498-a026cc5bb015"
    lines: list[Any] = [
        {"type": "system", "subtype": "init", "cwd": "/workspace", "session_id": session, "model": "claude-opus-4-8", "tools": []}
    ]
    for n in range(items):
        message = {
            "id": f"msg_flood_{n}", "type": "message", "role": "assistant", "model": "claude-opus-4-8",
            "content": [{"type": "text", "text": f"line {n} " + "x" * text_bytes}],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
        }  # fmt: skip
        lines.append({"type": "assistant", "message": message, "parent_tool_use_id": None, "session_id": session})
    lines.append(
        {"type": "result", "subtype": "success", "is_error": False, "duration_ms": 1, "num_turns": 1, "result": "done",
         "stop_reason": "end_turn", "session_id": session, "total_cost_usd": 0, "usage": {"input_tokens": 1, "output_tokens": 1}}
    )  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


async def open_raw(served: Served, *, receive_buffer: int = 4096) -> trio.SocketStream:
    """A client socket with a small receive buffer, so a large response stalls the sender."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    await sock.connect(("127.0.0.1", served.port))
    return trio.SocketStream(sock)


async def reset(stream: trio.SocketStream) -> None:
    """Close with a TCP reset (SO_LINGER 0): the way a killed or timed-out client goes."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def raw_ws_first_message(served: Served, stream: trio.SocketStream, frame: bytes) -> str:
    """Upgrade ``stream`` to a WebSocket (wsproto, no background task), send one text frame,
    and return the first complete text message the server sends back."""
    ws = WSConnection(ConnectionType.CLIENT)
    request = Request(host="127.0.0.1", target="/ws", extra_headers=[(b"authorization", f"Bearer {served.token}".encode())])
    await stream.send_all(ws.send(request))
    text = ""
    accepted = False
    while True:
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                accepted = True
                await stream.send_all(ws.send(TextMessage(frame.decode())))
            elif isinstance(event, TextMessage):
                text += event.data
                if event.message_finished:
                    return text
        data = await stream.receive_some(65536)
        assert data or accepted, "the server closed before accepting"
        ws.receive_data(data or None)


# --- seeding a thread through the store ----------------------------------------------


async def seed_thread(store: Store, project_dir: Path, thread_id: str, *, turns: int, items: int, output_bytes: int) -> None:
    """A thread with ``turns`` completed turns of ``items`` command items each, every item
    holding ``output_bytes`` of command output."""
    if await store.thread(thread_id) is None:
        projects = await store.projects()
        if not projects:
            await store.execute(c.CreateProject("p", str(project_dir)))
        await store.execute(c.CreateThread(thread_id, "p", "replay"))
    for n in range(turns):
        turn_id = f"{thread_id}-u{n}-{output_bytes}-{items}"
        await store.execute(c.StartTurn(thread_id, turn_id, f"turn {n}"))
        batch = tuple(
            TurnItem(f"{turn_id}-i{k}", thread_id, turn_id, 0, "command", "completed", "make", None,
                     {"command": "make", "output": f"{k}:" + "o" * output_bytes}, 0.0)
            for k in range(items)
        )
        await store.execute(c.RecordItems(turn_id, batch))
        await store.execute(c.FinishTurn(turn_id, "completed"))


async def stored_snapshot(db_path: Path, thread_id: str, ordinals: range) -> dict[str, Any]:
    """What the store holds for a thread: its body, its turns with ``ordinals`` and their items
    in order, decoded from the tables on a worker thread (the loop never runs SQLite)."""

    def read() -> dict[str, Any]:
        conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            [(thread,)] = conn.execute("SELECT body FROM threads WHERE id = ?", (thread_id,))
            turns = [
                (turn_id, orjson.loads(body))
                for turn_id, body in conn.execute("SELECT id, body FROM turns WHERE thread_id = ? ORDER BY ordinal", (thread_id,))
            ]
            turns = [(turn_id, body) for turn_id, body in turns if body["ordinal"] in ordinals]
            items = [
                orjson.loads(body)
                for turn_id, _ in turns
                for (body,) in conn.execute("SELECT body FROM items WHERE turn_id = ? ORDER BY ordinal", (turn_id,))
            ]
            return {"thread": orjson.loads(thread), "turns": [body for _, body in turns], "items": items}
        finally:
            conn.close()

    return await trio.to_thread.run_sync(read)


def loads(body: bytes) -> Any:
    return orjson.loads(body)
