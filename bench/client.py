"""The driver's clients of the public API: JSON-RPC over a WebSocket, and HTTP/1.1.

``open_rpc`` runs one reader task per connection: replies wake their caller, each
subscription notification goes to the connection's callback as it arrives (with its
arrival time), so nothing is queued beyond what trio-websocket holds. ``HttpClient``
keeps one keep-alive connection and reconnects when the server closes it; ``http_get_once``
opens a fresh connection per request, as a health prober does.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import h11
import orjson
import trio
import trio_websocket

Json = dict[str, Any]
NoteHandler = Callable[[Json, float], None]
CloseHandler = Callable[[BaseException], None]
MAX_MESSAGE = 64 * 1024 * 1024


class RpcFailed(Exception):
    """The daemon answered a call with a JSON-RPC error."""

    def __init__(self, method: str, error: Json) -> None:
        super().__init__(f"{method}: {error.get('message')} (code {error.get('code')})")
        self.code = error.get("code")


class RpcClosed(Exception):
    """The connection ended before the reply came."""


class RpcConnection:
    def __init__(
        self, ws: trio_websocket.WebSocketConnection, on_note: NoteHandler, on_close: CloseHandler
    ) -> None:
        self._ws = ws
        self._on_note = on_note
        self._on_close = on_close
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list[Json]]] = {}
        self.closed: BaseException | None = None
        self.gone = trio.Event()  # set when the connection has ended

    async def call(self, method: str, **params: Any) -> Any:
        if self.closed is not None:
            raise RpcClosed(f"{method}: the connection is closed ({self.closed!r})")
        request_id = next(self._ids)
        done, box = trio.Event(), list[Json]()
        self._waiting[request_id] = (done, box)
        try:
            frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            await self._ws.send_message(orjson.dumps(frame).decode())
            await done.wait()
        finally:
            self._waiting.pop(request_id, None)
        if not box:
            raise RpcClosed(f"{method}: the connection closed before the reply ({self.closed!r})")
        reply = box[0]
        if "error" in reply:
            raise RpcFailed(method, reply["error"])
        return reply["result"]

    async def read_forever(self) -> None:
        """Hand out replies and notifications until the connection ends (then wake every caller)."""
        try:
            while True:
                message = orjson.loads(await self._ws.get_message())
                now = time.monotonic()
                if message.get("method") == "sub":
                    self._on_note(message["params"], now)
                    continue
                waiter = self._waiting.get(message.get("id"))
                if waiter is not None:
                    waiter[1].append(message)
                    waiter[0].set()
        except (trio_websocket.ConnectionClosed, trio.BrokenResourceError) as exc:
            self.closed = exc
            for done, _ in self._waiting.values():
                done.set()
            self.gone.set()
            self._on_close(exc)


def ignore_notes(note: Json, at: float) -> None:
    return None


def ignore_close(exc: BaseException) -> None:
    return None


@asynccontextmanager
async def open_rpc(
    port: int,
    token: str,
    on_note: NoteHandler = ignore_notes,
    on_close: CloseHandler = ignore_close,
) -> AsyncIterator[RpcConnection]:
    """A connection with its reader task. Errors from the body come out as themselves, not
    wrapped in an exception group (the reader handles its own)."""
    headers = [(b"Authorization", f"Bearer {token}".encode())]
    async with trio_websocket.open_websocket(
        "127.0.0.1", port, "/ws", use_ssl=False, extra_headers=headers, max_message_size=MAX_MESSAGE
    ) as ws:
        connection = RpcConnection(ws, on_note, on_close)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(connection.read_forever)
                try:
                    yield connection
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise


class HttpError(Exception):
    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} {path}: HTTP {status} {body[:200]!r}")
        self.status = status


class HttpClient:
    """HTTP/1.1 with keep-alive on one connection; one request at a time."""

    def __init__(self, port: int, token: str | None) -> None:
        self._port = port
        self._token = token
        self._stream: trio.SocketStream | None = None
        self._conn = h11.Connection(h11.CLIENT)

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
            self._stream = None

    async def request(
        self, method: str, path: str, body: Any = None, headers: list[tuple[str, str]] | None = None,
        *, decode: bool = True,
    ) -> Any:
        """Send one request; return the decoded JSON body (``decode=False``: the raw bytes).
        Retries once on a closed connection."""
        for attempt in (1, 2):
            try:
                return await self._request_once(method, path, body, headers or [], decode)
            except (
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                h11.RemoteProtocolError,
                ConnectionError,
            ):
                await self.aclose()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _request_once(
        self, method: str, path: str, body: Any, extra: list[tuple[str, str]], decode: bool = True
    ) -> Any:
        if self._stream is None or self._conn.our_state is not h11.IDLE:
            await self.aclose()
            self._stream = await trio.open_tcp_stream("127.0.0.1", self._port)
            self._conn = h11.Connection(h11.CLIENT)
        data = b"" if body is None else orjson.dumps(body)
        headers = [("Host", f"127.0.0.1:{self._port}"), ("Content-Length", str(len(data)))]
        if self._token:
            headers.append(("Authorization", f"Bearer {self._token}"))
        headers += extra
        conn, stream = self._conn, self._stream
        await stream.send_all(
            conn.send(h11.Request(method=method, target=path, headers=headers))
            + conn.send(h11.Data(data=data))
            + conn.send(h11.EndOfMessage())
        )
        status, chunks = 0, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                received = await stream.receive_some(256 * 1024)
                conn.receive_data(received)
                if not received and conn.their_state is not h11.DONE:
                    raise trio.BrokenResourceError("the daemon closed the connection")
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("the daemon closed the connection")
        raw = b"".join(chunks)
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            await self.aclose()
        else:
            conn.start_next_cycle()
        if status >= 400:
            raise HttpError(method, path, status, raw)
        if not decode:
            return raw
        return orjson.loads(raw) if raw else None


MCP_VERSION = "2026-07-28"
_MCP_META = {
    "io.modelcontextprotocol/protocolVersion": MCP_VERSION,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "t3d-bench", "version": "1"},
}


class McpFailed(Exception):
    """A tool call came back as a tool error (isError) or a JSON-RPC error."""


class McpClient:
    """An MCP client of /mcp at 2026-07-28 (the per-request envelope, no handshake), over one
    keep-alive HTTP connection: what a stock client sends, without its per-call overhead in
    the driver."""

    def __init__(self, port: int, token: str) -> None:
        self.http = HttpClient(port, token)
        self._ids = itertools.count(1)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, params: Json, name: str | None = None) -> Any:
        headers = [
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
            ("MCP-Protocol-Version", MCP_VERSION),
            ("Mcp-Method", method),
        ]
        if name is not None:
            headers.append(("Mcp-Name", name))
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": {**params, "_meta": _MCP_META}}
        reply = await self.http.request("POST", "/mcp", body, headers)
        if "error" in reply:
            raise McpFailed(f"{method}: {reply['error'].get('message')}")
        return reply["result"]

    async def call_tool(self, name: str, **arguments: Any) -> Any:
        result = await self.request("tools/call", {"name": name, "arguments": arguments}, name)
        if result.get("isError"):
            raise McpFailed(f"{name}: {result['content'][0]['text']}")
        return result["structuredContent"]


async def http_get_once(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    """GET over a fresh connection (``Connection: close``): (status, body). With ``token``,
    as an authenticated client (``/api/health`` then returns its whole report)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        headers = [("Host", f"127.0.0.1:{port}"), ("Connection", "close")]
        if token is not None:
            headers.append(("Authorization", f"Bearer {token}"))
        request = h11.Request(method="GET", target=path, headers=headers)
        await stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
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
                return status, b"".join(chunks)
