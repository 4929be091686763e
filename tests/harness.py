"""Test harness: a real daemon on 127.0.0.1 port 0, and plain clients for it.

`start_daemon` runs `run_daemon` in the test's Trio run with a temp state
dir, the real SQLite file and real provider subprocesses. `RpcClient` speaks
JSON-RPC over a real WebSocket without any background task: `call` reads
frames until its reply, keeping notifications for `wait_event`. `http` is a
raw HTTP/1.1 request over a real socket.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import h11
import orjson
import trio
import trio_websocket

from t3d.config import Settings, load_settings
from t3d.daemon import DaemonControl, DaemonInfo, run_daemon

TERMINAL = {"completed", "interrupted", "failed", "cancelled"}
REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "replay_fixtures" / "claude"
TEST_FIXTURES = Path(__file__).resolve().parent / "fixtures"


@attrs.define
class Daemon:
    info: DaemonInfo
    settings: Settings
    scope: trio.CancelScope

    @property
    def token(self) -> str:
        return Path(self.info.token_path).read_text().strip()

    def stop(self) -> None:
        self.scope.cancel()


async def start_daemon(
    nursery: trio.Nursery, state_dir: Path, *, control: DaemonControl | None = None, **overrides: Any
) -> Daemon:
    """Run the daemon in ``nursery``; `Daemon.stop` shuts it down and, unless ``control``
    says otherwise, stops its agents with it (an in-process daemon's spawner would keep
    them for the next test otherwise)."""
    flags = {"state_dir": str(state_dir), "port": 0, "replay_speed": 0, **overrides}
    settings = load_settings(flags, {k: v for k, v in os.environ.items() if not k.startswith("T3D_")})
    control = control or DaemonControl(stop_agents=True)
    return await nursery.start(_daemon_task, settings, control)  # type: ignore[no-any-return]


async def _daemon_task(settings: Settings, control: DaemonControl, *, task_status: trio.TaskStatus[Daemon]) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as inner:
            info = await inner.start(partial(run_daemon, settings, control=control))
            task_status.started(Daemon(info, settings, scope))


class RpcFailed(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.code = error.get("code")
        self.message = error.get("message")
        self.data = error.get("data")


class RpcClient:
    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self.notifications: deque[dict[str, Any]] = deque()
        self._seen: list[dict[str, Any]] | None = None

    def record_events(self) -> list[dict[str, Any]]:
        """From now on, every event `wait_event` reads, whichever it returns, is kept in the list returned."""
        self._seen = []
        return self._seen

    async def send_raw(self, frame: str) -> None:
        await self.ws.send_message(frame)

    async def receive(self) -> dict[str, Any]:
        message = orjson.loads(await self.ws.get_message())
        assert isinstance(message, dict)
        return message

    async def reply_to(self, request_id: Any) -> dict[str, Any]:
        """Read frames until the reply for ``request_id``; keep notifications. A streamed
        reply (``snapshot.chunk`` notifications naming the request, then ``{sequence, chunks}``)
        comes back merged into one snapshot, as the other transports return it."""
        chunks: list[dict[str, Any]] = []
        while True:
            message = await self.receive()
            if message.get("method") == "sub":
                self.notifications.append(message["params"])
            elif message.get("method") == "snapshot.chunk" and message["params"]["id"] == request_id:
                chunks.append(message["params"]["data"])
            elif message.get("id") == request_id:
                if chunks and "result" in message:
                    assert message["result"]["chunks"] == len(chunks), message
                    merged: dict[str, Any] = {}
                    for chunk in chunks:  # head fields from the first, lists concatenated
                        for key, value in chunk.items():
                            if isinstance(value, list):
                                merged.setdefault(key, []).extend(value)
                            else:
                                merged.setdefault(key, value)
                    message["result"] = merged
                return message

    async def call(self, method: str, **params: Any) -> Any:
        request_id = next(self._ids)
        await self.send_raw(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).decode())
        reply = await self.reply_to(request_id)
        if "error" in reply:
            raise RpcFailed(reply["error"])
        return reply["result"]

    async def next_notification(self) -> dict[str, Any]:
        if self.notifications:
            return self.notifications.popleft()
        while True:
            message = await self.receive()
            if message.get("method") == "sub":
                return message["params"]

    async def wait_event(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The next ``event`` notification whose data satisfies ``predicate``."""
        while True:
            note = await self.next_notification()
            if note["kind"] != "event":
                continue
            if self._seen is not None:
                self._seen.append(note["data"])
            if predicate(note["data"]):
                return note["data"]


@asynccontextmanager
async def open_client(daemon: Daemon, *, token: str | None = None) -> AsyncIterator[RpcClient]:
    """A WebSocket client, closed (before the daemon stops) when the block ends."""
    headers = [("Authorization", f"Bearer {token or daemon.token}")]
    async with trio_websocket.open_websocket(
        "127.0.0.1", daemon.info.port, "/ws", use_ssl=False, extra_headers=headers, max_message_size=64 * 1024 * 1024
    ) as ws:
        yield RpcClient(ws)


async def http(
    daemon: Daemon, method: str, path: str, body: Any = None, *, token: str | bool | None = True, headers: list[tuple[str, str]] | None = None
) -> tuple[int, Any]:
    """One HTTP/1.1 request over a fresh connection; returns (status, decoded JSON body)."""
    stream = await trio.open_tcp_stream("127.0.0.1", daemon.info.port)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        data = b"" if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        hdrs = [("Host", f"127.0.0.1:{daemon.info.port}"), ("Content-Length", str(len(data))), ("Connection", "close")]
        if token is True:
            hdrs.append(("Authorization", f"Bearer {daemon.token}"))
        elif isinstance(token, str):
            hdrs.append(("Authorization", f"Bearer {token}"))
        hdrs += headers or []
        await stream.send_all(conn.send(h11.Request(method=method, target=path, headers=hdrs)) + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
        status, chunks = 0, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
        raw = b"".join(chunks)
        return status, orjson.loads(raw) if raw else None


async def new_thread(client: RpcClient, project_dir: Path, provider: str = "replay", **params: Any) -> str:
    project = await client.call("project.create", path=str(project_dir))
    thread = await client.call("thread.create", project_id=project["project_id"], provider=provider, **params)
    await client.call("subscribe.thread", thread_id=thread["thread_id"])
    return str(thread["thread_id"])


@attrs.define
class TurnOutcome:
    turn: dict[str, Any]
    items: list[dict[str, Any]]
    requests: list[dict[str, Any]]
    events: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [i for i in self.items if i["kind"] == kind]

    @property
    def assistant_text(self) -> list[str]:
        return [i["text"] for i in self.of_kind("assistant_message")]


async def run_turn(
    client: RpcClient,
    thread_id: str,
    text: str,
    *,
    decide: Callable[[dict[str, Any]], str] = lambda request: "allow",
    on_event: Callable[[dict[str, Any]], Any] | None = None,
) -> TurnOutcome:
    """Start a turn on a subscribed thread, answer its prompts, return its final state."""
    started = await client.call("turn.start", thread_id=thread_id, text=text)
    turn_id = started["turn_id"]
    items: dict[str, dict[str, Any]] = {}
    requests: dict[str, dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    while True:
        data = await client.wait_event(lambda d: d["entity"].get("turn_id") == turn_id or d["entity"].get("id") == turn_id)
        events.append(data)
        entity = data["entity"]
        if on_event is not None:
            await on_event(data)
        if data["kind"] == "item.updated":
            items[entity["id"]] = entity
        elif data["kind"] == "request.updated":
            requests[entity["id"]] = entity
            if entity["status"] == "pending":
                await client.call("request.respond", request_id=entity["id"], decision=decide(entity))
        elif data["kind"] == "turn.updated" and entity["status"] in TERMINAL:
            ordered = sorted(items.values(), key=lambda i: i["ordinal"])
            return TurnOutcome(entity, ordered, list(requests.values()), events)


async def wait_until(condition: Callable[[], Any], interval: float = 0.02) -> None:
    """Poll ``condition`` (a function, or an async one) until it is true. Bound it with fail_after."""
    while True:
        value = condition()
        if hasattr(value, "__await__"):
            value = await value
        if value:
            return
        await trio.sleep(interval)
