"""The HTTP/WebSocket transport over real sockets on 127.0.0.1.

Each test states the behaviour it pins. Clients are raw trio sockets (with
h11 or wsproto doing the framing on the client side) or trio-websocket, so
that misbehaving peers can be played exactly.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import h11
import orjson
import pytest
import trio
import trio_websocket
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Event,
    Message,
    RejectConnection,
    Request,
)

from t3d.api.prefixed_stream import PrefixedStream
from t3d.api.transport import (
    HeadCheck,
    HttpRequest,
    HttpResponse,
    TransportLimits,
    TransportStats,
    error_response,
    serve_api_transport,
)
from t3d.errors import ConfigError

HOST = "127.0.0.1"


# The FakeApp's credentials: a request with this header is trusted.
TRUSTED = ("authorization", "let-me-in")


PART_BYTES = 64 * 1024


class FakeApp:
    """Echoes what it is given; a few paths misbehave on purpose.

    A request with the `TRUSTED` header is trusted; ``/private...`` refuses
    any other with 401 on its head.
    """

    def __init__(self) -> None:
        self.log: list[str] = []
        self.waiting = trio.Event()  # a handler on /wait or /ws/idle is parked
        self.ws_done = trio.Event()

    def check_head(self, request: HttpRequest) -> HeadCheck:
        trusted = request.headers.get(TRUSTED[0]) == TRUSTED[1]
        if request.path.startswith("/private") and not trusted:
            return HeadCheck(refusal=error_response(401, "unauthorized", "send the header"))
        return HeadCheck(trusted=trusted, watch=not request.path.startswith("/quick"))

    async def handle_http(self, request: HttpRequest) -> HttpResponse:
        if request.path == "/boom":
            raise RuntimeError("kaboom")
        if request.path == "/config":
            raise ConfigError("the frobnicator is off; turn it on")
        if request.path in ("/wait", "/private/wait"):
            try:
                await self._park()
            except trio.Cancelled:
                self.log.append("http cancelled")
                raise
        if request.path.startswith("/parts/"):  # /parts/N: N parts of PART_BYTES, each its index
            count = int(request.path.removeprefix("/parts/"))
            return HttpResponse(200, b"", parts=tuple(bytes([i % 256]) * PART_BYTES for i in range(count)))
        if request.path.startswith(("/echo", "/quick/echo")):
            echoed = attrs.asdict(request) | {"body": request.body.decode()}
            return HttpResponse(
                200, orjson.dumps(echoed, default=dict), headers=(("x-test", "yes"),)
            )
        return error_response(404, "not_found", f"no route for {request.path}; check the URL")

    def answer_now(self, request: HttpRequest) -> HttpResponse | None:
        if request.path == "/now":
            return HttpResponse(200, b'{"now":true}')
        if request.path == "/now/boom":
            raise RuntimeError("kaboom at once")
        return None

    def check_websocket(self, request: HttpRequest) -> HttpResponse | None:
        if request.path == "/ws/forbidden":
            return error_response(403, "forbidden", "foreign origin; connect from the app")
        return None

    async def handle_websocket(
        self, ws: trio_websocket.WebSocketConnection, request: HttpRequest, stream: PrefixedStream
    ) -> None:
        try:
            if request.path == "/ws/idle":
                await self._park()
            if request.path == "/ws/crash":
                raise RuntimeError("handler bug")
            while True:
                await ws.send_message(await ws.get_message())
        except trio_websocket.ConnectionClosed:
            self.log.append("ws closed")
            raise
        except trio.Cancelled:
            self.log.append("ws cancelled")
            raise
        finally:
            self.ws_done.set()

    async def _park(self) -> None:
        self.waiting.set()
        await trio.sleep_forever()


@attrs.frozen
class Server:
    port: int
    stats: TransportStats

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream(HOST, self.port)

    async def wait_no_connections(self) -> None:
        await self.stats.wait_open_connections(0)


StartServer = Callable[..., Awaitable[Server]]


@pytest.fixture
def app() -> FakeApp:
    return FakeApp()


@pytest.fixture
def start_server(nursery: trio.Nursery, app: FakeApp) -> StartServer:
    async def start(**limits: Any) -> Server:
        stats = TransportStats()
        serve = partial(
            serve_api_transport, app, HOST, 0, limits=TransportLimits(**limits), stats=stats
        )
        return Server(await nursery.start(serve), stats)

    return start


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


async def send_request(
    stream: trio.SocketStream,
    client: h11.Connection,
    method: str,
    target: str,
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
) -> Reply:
    framing = [("content-length", str(len(body)))] if body else []
    head = h11.Request(method=method, target=target, headers=[("host", HOST), *framing, *headers])
    data = client.send(head) or b""
    data += client.send(h11.Data(data=body)) or b"" if body else b""
    await stream.send_all(data + (client.send(h11.EndOfMessage()) or b""))
    return await read_reply(stream, client)


async def read_reply(stream: trio.SocketStream, client: h11.Connection) -> Reply:
    response: h11.Response | None = None
    body = bytearray()
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(await stream.receive_some())
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert response is not None
            headers = {name.decode(): value.decode() for name, value in response.headers}
            return Reply(response.status_code, headers, bytes(body))


async def receive_until_eof(stream: trio.abc.ReceiveStream) -> bytes:
    chunks = []
    while chunk := await stream.receive_some():
        chunks.append(chunk)
    return b"".join(chunks)


def parse_reply(data: bytes) -> Reply:
    """A whole response read off a connection that the server then closed."""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    assert len(body) == int(headers["content-length"])
    return Reply(int(status_line.split()[1]), headers, body)


async def reset(stream: trio.SocketStream) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a client that vanishes does."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def raw_exchange(server: Server, data: bytes) -> Reply:
    async with await server.connect() as stream:
        await stream.send_all(data)
        return parse_reply(await receive_until_eof(stream))


@asynccontextmanager
async def websocket_client(
    server: Server, target: str, **options: Any
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A trio-websocket client whose socket the test owns and closes.

    open_websocket_url leaves its socket open when the server closes first
    or rejects the handshake, which filterwarnings=error turns into failures.
    """
    async with await server.connect() as stream, trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(nursery, stream, HOST, target, **options)
        yield ws
        await ws.aclose()
        nursery.cancel_scope.cancel()


async def next_ws_event(stream: trio.SocketStream, ws: WSConnection) -> Event:
    while True:
        for event in ws.events():
            return event
        ws.receive_data(await stream.receive_some())


async def open_raw_websocket(server: Server, target: str) -> tuple[trio.SocketStream, WSConnection]:
    stream = await server.connect()
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(ws.send(Request(host=HOST, target=target)))
    assert isinstance(await next_ws_event(stream, ws), AcceptConnection)
    return stream, ws


# --- HTTP ---------------------------------------------------------------------


async def test_get_passes_decoded_path_query_and_headers_to_the_app(
    start_server: StartServer,
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            reply = await send_request(
                stream,
                h11.Connection(h11.CLIENT),
                "GET",
                "/echo/a%20b?x=1&x=2&empty=",
                headers=[("X-Dup", "one"), ("x-dup", "two")],
            )
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["content-length"] == str(len(reply.body))
    assert reply.headers["x-test"] == "yes"
    echoed = reply.json()
    assert echoed["method"] == "GET"
    assert echoed["path"] == "/echo/a b"
    assert echoed["query"] == {"x": "1", "empty": ""}
    assert echoed["headers"]["x-dup"] == "one, two"


async def test_keep_alive_serves_a_post_then_a_get_on_one_connection(
    start_server: StartServer,
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            client = h11.Connection(h11.CLIENT)
            first = await send_request(stream, client, "POST", "/echo", body=b'{"a": 1}')
            client.start_next_cycle()
            second = await send_request(stream, client, "GET", "/nowhere")
            assert server.stats.statistics().accepted_total == 1
    assert first.json()["body"] == '{"a": 1}'
    assert second.status == 404
    assert second.json()["error"]["code"] == "not_found"


async def test_head_gets_the_length_but_no_body(start_server: StartServer) -> None:
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            client = h11.Connection(h11.CLIENT)
            head = await send_request(stream, client, "HEAD", "/nowhere")
            client.start_next_cycle()
            get = await send_request(stream, client, "GET", "/nowhere")
    assert head.status == 404
    assert head.body == b""
    assert head.headers["content-length"] == str(len(get.body))


async def test_chunked_request_body_is_assembled(start_server: StartServer) -> None:
    request = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    with trio.fail_after(5):
        reply = await raw_exchange(await start_server(), request)
    assert reply.json()["body"] == "hello world"
    assert reply.headers["connection"] == "close"


async def test_expect_100_continue_gets_an_interim_response(start_server: StartServer) -> None:
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            await stream.send_all(head)
            assert (await stream.receive_some()).startswith(b"HTTP/1.1 100 ")
            await stream.send_all(b"ok")
            assert b'"body":"ok"' in await stream.receive_some()


async def test_declared_body_over_the_cap_gets_413_without_being_read(
    start_server: StartServer,
) -> None:
    with trio.fail_after(5):
        server = await start_server(max_body_bytes=100)
        reply = await raw_exchange(
            server,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: let-me-in\r\n"
            b"Content-Length: 1000\r\n\r\n",
        )
        await server.wait_no_connections()
    assert reply.status == 413
    assert reply.headers["connection"] == "close"
    error = reply.json()["error"]
    assert error["code"] == "body_too_large"
    assert "100 bytes" in error["message"]


async def test_chunked_body_over_the_cap_gets_413(start_server: StartServer) -> None:
    chunk = b"c8\r\n" + b"x" * 200 + b"\r\n"
    request = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: let-me-in\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunk
    )
    with trio.fail_after(5):
        reply = await raw_exchange(await start_server(max_body_bytes=100), request)
    assert reply.status == 413


async def test_garbage_gets_400_and_the_server_keeps_serving(start_server: StartServer) -> None:
    with trio.fail_after(5):
        server = await start_server()
        reply = await raw_exchange(server, b"\x00\x01\xffnot http at all\r\n\r\n")
        after = await raw_exchange(
            server, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        await server.wait_no_connections()
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "bad_request"
    assert after.status == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET / HTTP/1.1\r\n\r\n",  # no Host
        b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",  # target not ASCII
        b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),  # TLS hello
        b"GET /ws HTTP/1.1\r\nHost: \xff\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n",  # no key
    ],
)
async def test_malformed_requests_get_400_and_log_no_error(
    start_server: StartServer, caplog: pytest.LogCaptureFixture, request_bytes: bytes
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        reply = await raw_exchange(server, request_bytes)
        after = await raw_exchange(
            server, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        await server.wait_no_connections()
    assert reply.status == 400
    assert reply.json()["error"]["message"]
    assert after.status == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_other_http_versions_get_505(start_server: StartServer) -> None:
    with trio.fail_after(5):
        reply = await raw_exchange(await start_server(), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert reply.status == 505
    assert "HTTP/1.1" in reply.json()["error"]["message"]


async def test_truncated_request_gets_400(start_server: StartServer) -> None:
    with trio.fail_after(5):
        server = await start_server()
        for partial_request in (
            b"GET /echo HTTP/1.1\r\nHost: x\r\n",
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc",
        ):
            async with await server.connect() as stream:
                await stream.send_all(partial_request)
                await stream.send_eof()
                assert parse_reply(await receive_until_eof(stream)).status == 400
        await server.wait_no_connections()


async def test_header_over_the_cap_gets_431(start_server: StartServer) -> None:
    request = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    with trio.fail_after(5):
        reply = await raw_exchange(await start_server(), request)
    assert reply.status == 431
    assert "65536 bytes" in reply.json()["error"]["message"]


async def test_slowloris_is_cut_off_at_the_header_timeout(start_server: StartServer) -> None:
    """A head still unfinished at the header timeout gets a 408 and the connection closes;
    others are served meanwhile."""
    with trio.fail_after(5):
        server = await start_server(header_timeout_s=0.2)
        async with await server.connect() as slow:
            await slow.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            ok = await raw_exchange(
                server, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            assert ok.status == 200
            reply = parse_reply(await receive_until_eof(slow))
        await server.wait_no_connections()
    assert reply.status == 408
    assert "head" in reply.json()["error"]["message"]


async def test_a_connection_that_sends_nothing_is_closed_quietly(
    start_server: StartServer,
) -> None:
    """A new connection that sends no byte within the header timeout is closed without a reply."""
    with trio.fail_after(5):
        server = await start_server(header_timeout_s=0.2)
        async with await server.connect() as silent:
            assert await receive_until_eof(silent) == b""
        await server.wait_no_connections()


async def test_a_dripping_body_gets_408_at_the_request_deadline(start_server: StartServer) -> None:
    """A body dripped a byte at a time, each read well within the idle timeout, still gets a
    408 once head and body together take longer than request_timeout_s."""
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: let-me-in\r\nContent-Length: 1000\r\n\r\n"
    with trio.fail_after(10):
        server = await start_server(request_timeout_s=0.5, idle_timeout_s=60)
        async with await server.connect() as stream:
            await stream.send_all(head)
            received = bytearray()
            with trio.move_on_after(8):
                while b"\r\n\r\n" not in received:
                    await stream.send_all(b"x")
                    with trio.move_on_after(0.05):
                        received += await stream.receive_some()
            received += await receive_until_eof(stream)
        await server.wait_no_connections()
    reply = parse_reply(bytes(received))
    assert reply.status == 408
    assert reply.json()["error"]["code"] == "request_timeout"


async def test_a_refused_head_is_answered_before_any_body(start_server: StartServer) -> None:
    """A head the App refuses (here: no credentials) is answered at once, with none of the
    declared body sent, and the connection closes."""
    with trio.fail_after(5):
        server = await start_server()
        reply = await raw_exchange(
            server, b"POST /private HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"
        )
        await server.wait_no_connections()
    assert reply.status == 401
    assert reply.headers["connection"] == "close"


async def test_a_request_without_credentials_may_carry_only_a_small_body(
    start_server: StartServer,
) -> None:
    """An untrusted request declaring a body over max_untrusted_body_bytes gets 413 unread;
    the same body with credentials is served."""
    body = b"y" * 2000
    with trio.fail_after(5):
        server = await start_server()
        refused = await raw_exchange(
            server, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n"
        )
        async with await server.connect() as stream:
            served = await send_request(
                stream, h11.Connection(h11.CLIENT), "POST", "/echo", body, headers=[TRUSTED]
            )
    assert refused.status == 413
    assert "without credentials" in refused.json()["error"]["message"]
    assert served.status == 200
    assert served.json()["body"] == body.decode()


async def test_a_half_closed_request_is_answered(start_server: StartServer) -> None:
    """A client that sends a whole request and then shuts its write side gets the reply
    (with Connection: close), then the server closes."""
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            await stream.send_all(
                b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            )
            await stream.send_eof()
            reply = parse_reply(await receive_until_eof(stream))
        await server.wait_no_connections()
    assert reply.status == 200
    assert reply.json()["body"] == "hello"


async def test_a_request_the_app_calls_quick_is_answered_unwatched(start_server: StartServer) -> None:
    """A route the App marks quick (`HeadCheck.watch` False) runs with no task watching the
    socket: it is answered on a kept-alive connection, and a request sent with the write
    side then shut is answered too (the end of stream is seen at the next head)."""
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            client = h11.Connection(h11.CLIENT)
            for n in range(2):
                reply = await send_request(stream, client, "GET", f"/quick/echo?n={n}")
                client.start_next_cycle()
                assert reply.status == 200 and reply.json()["query"] == {"n": str(n)}
            assert server.stats.statistics().accepted_total == 1
        async with await server.connect() as stream:
            await stream.send_all(b"POST /quick/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            await stream.send_eof()
            reply = parse_reply(await receive_until_eof(stream))
        await server.wait_no_connections()
    assert reply.status == 200 and reply.json()["body"] == "hello"


async def test_a_response_of_many_parts_reaches_a_slow_reader_whole_and_in_order(
    start_server: StartServer,
) -> None:
    """A response of more parts than one write takes (100 of 64 KiB: the first write hands
    over at most 64 of them, the socket takes less) reaches a client that reads slowly
    byte for byte, each part in its place."""
    with trio.fail_after(20):
        server = await start_server()
        async with await server.connect() as stream:
            await stream.send_all(b"GET /parts/100 HTTP/1.1\r\nHost: x\r\n\r\n")
            received = bytearray()
            while b"\r\n\r\n" not in received or len(received) < received.index(b"\r\n\r\n") + 4 + 100 * PART_BYTES:
                received += await stream.receive_some(16 * 1024)
                await trio.sleep(0.0005)
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: %d" % (100 * PART_BYTES) in head.lower()
    assert body == b"".join(bytes([i]) * PART_BYTES for i in range(100))


async def test_idle_keep_alive_connection_is_closed(start_server: StartServer) -> None:
    with trio.fail_after(5):
        server = await start_server(idle_timeout_s=0.2)
        async with await server.connect() as stream:
            reply = await send_request(stream, h11.Connection(h11.CLIENT), "GET", "/echo")
            assert reply.status == 200
            assert await receive_until_eof(stream) == b""


async def test_at_the_limit_the_longest_waiting_unauthenticated_connection_makes_room(
    start_server: StartServer,
) -> None:
    """At max_connections a newcomer is served, and the connection that has shown no
    credentials for longest is closed to make room; the younger ones stay open."""
    with trio.fail_after(5):
        server = await start_server(max_connections=3)
        oldest, middle, youngest = [await server.connect() for _ in range(3)]
        await server.stats.wait_open_connections(3)
        async with oldest, middle, youngest:
            reply = await raw_exchange(
                server, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            assert await receive_until_eof(oldest) == b""
            await server.stats.wait_open_connections(2)
            stats = server.stats.statistics()
        await server.wait_no_connections()
    assert reply.status == 200
    assert (stats.shed_total, stats.refused_total) == (1, 0)


async def test_exposed_connections_are_shed_before_idle_authenticated_ones(
    start_server: StartServer, app: FakeApp
) -> None:
    """Room for a newcomer comes from a connection that showed no credentials, even a
    younger one, before an idle authenticated keep-alive connection; once only that idle
    one (and authenticated work) is left, the idle one goes."""
    with trio.fail_after(5):
        server = await start_server(max_connections=2)
        async with await server.connect() as trusted:
            client = h11.Connection(h11.CLIENT)
            served = await send_request(trusted, client, "GET", "/echo", headers=[TRUSTED])
            assert served.status == 200
            async with await server.connect() as exposed:
                await server.stats.wait_open_connections(2)
                first = await raw_exchange(
                    server, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
                assert await receive_until_eof(exposed) == b""
            await server.stats.wait_open_connections(1)
            async with await server.connect() as busy:
                await busy.send_all(
                    b"GET /private/wait HTTP/1.1\r\nHost: x\r\nAuthorization: let-me-in\r\n\r\n"
                )
                await app.waiting.wait()
                second = await raw_exchange(
                    server, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
                assert await receive_until_eof(trusted) == b""
                assert app.log == []  # the authenticated work goes on
                await reset(busy)
        await server.wait_no_connections()
    assert (first.status, second.status) == (200, 200)
    assert server.stats.statistics().shed_total == 2


async def test_authenticated_work_is_never_shed_and_a_newcomer_then_gets_503(
    start_server: StartServer, app: FakeApp
) -> None:
    """When every open connection is an authenticated request at work, a newcomer gets a
    503 and the request at work goes on undisturbed."""
    with trio.fail_after(5):
        server = await start_server(max_connections=1)
        async with await server.connect() as busy:
            await busy.send_all(
                b"GET /private/wait HTTP/1.1\r\nHost: x\r\nAuthorization: let-me-in\r\n\r\n"
            )
            await app.waiting.wait()
            async with await server.connect() as refused:
                reply = parse_reply(await receive_until_eof(refused))
            assert app.log == []
            assert server.stats.statistics().open_connections == 1
            await reset(busy)
        await server.wait_no_connections()
    assert reply.status == 503
    assert reply.json()["error"]["code"] == "server_busy"
    assert server.stats.statistics().refused_total == 1


async def test_app_exception_is_a_logged_500_and_the_connection_goes_on(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            client = h11.Connection(h11.CLIENT)
            crashed = await send_request(stream, client, "GET", "/boom")
            client.start_next_cycle()
            refused = await send_request(stream, client, "GET", "/config")
            client.start_next_cycle()
            fine = await send_request(stream, client, "GET", "/echo")
    assert crashed.status == 500
    assert crashed.json()["error"]["message"].startswith("internal error")
    assert b"kaboom" not in crashed.body
    assert refused.status == 500
    assert refused.json()["error"]["message"] == "the frobnicator is off; turn it on"
    assert fine.status == 200
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.name == "t3d.api"
    assert record.exc_info is not None and "kaboom" in str(record.exc_info[1])


async def test_an_answer_the_app_has_at_once_is_served_on_a_kept_alive_connection(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    """`App.answer_now` answers without `handle_http` (health takes this path); one that
    raises is a logged 500 like any other, and the connection serves the next request."""
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            client = h11.Connection(h11.CLIENT)
            now = await send_request(stream, client, "GET", "/now")
            client.start_next_cycle()
            crashed = await send_request(stream, client, "GET", "/now/boom")
            client.start_next_cycle()
            fine = await send_request(stream, client, "GET", "/echo")
    assert now.status == 200 and now.json() == {"now": True}
    assert crashed.status == 500 and b"kaboom" not in crashed.body
    assert fine.status == 200
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and "kaboom at once" in str(record.exc_info[1])


async def test_client_resetting_the_connection_cancels_its_request_handler(
    start_server: StartServer, app: FakeApp
) -> None:
    """A client that resets the connection while its request is answered has the handler
    cancelled at once."""
    with trio.fail_after(5):
        server = await start_server()
        stream = await server.connect()
        await stream.send_all(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
        await app.waiting.wait()
        await reset(stream)
        await server.wait_no_connections()
    assert app.log == ["http cancelled"]


async def test_localhost_port_zero_binds_one_reachable_port(app: FakeApp) -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_api_transport, app, "localhost", 0)
            async with await trio.open_tcp_stream("localhost", port) as stream:
                reply = await send_request(stream, h11.Connection(h11.CLIENT), "GET", "/echo")
            nursery.cancel_scope.cancel()
    assert reply.status == 200


async def test_cancelling_the_server_closes_listener_and_connections(app: FakeApp) -> None:
    stats = TransportStats()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_api_transport, app, HOST, 0, stats=stats))
            server = Server(port, stats)
            idle = await server.connect()
            ws_stream, _ = await open_raw_websocket(server, "/ws/idle")
            await app.waiting.wait()
            nursery.cancel_scope.cancel()
        async with idle, ws_stream:
            assert await receive_until_eof(idle) == b""
            assert await receive_until_eof(ws_stream) == b""
        with pytest.raises(OSError):
            await trio.open_tcp_stream(HOST, port)
    assert stats.statistics().open_connections == 0
    assert app.log == ["ws cancelled"]


# --- WebSocket ----------------------------------------------------------------


async def test_websocket_upgrade_echoes_messages(start_server: StartServer, app: FakeApp) -> None:
    with trio.fail_after(5):
        server = await start_server()
        async with trio_websocket.open_websocket_url(f"ws://{HOST}:{server.port}/ws") as ws:
            await ws.send_message("hello")
            assert await ws.get_message() == "hello"
            await ws.send_message(b"\x00bytes")
            assert await ws.get_message() == b"\x00bytes"
        await app.ws_done.wait()
        await server.wait_no_connections()


async def test_websocket_after_a_keep_alive_request_replays_the_right_bytes(
    start_server: StartServer,
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            reply = await send_request(stream, h11.Connection(h11.CLIENT), "GET", "/echo")
            assert reply.status == 200
            ws = WSConnection(ConnectionType.CLIENT)
            await stream.send_all(ws.send(Request(host=HOST, target="/ws")))
            assert isinstance(await next_ws_event(stream, ws), AcceptConnection)
            await stream.send_all(ws.send(Message(data="again")))
            echoed = await next_ws_event(stream, ws)
    assert isinstance(echoed, Message)
    assert echoed.data == "again"


async def test_websocket_refused_by_the_app_is_rejected_with_its_status(
    start_server: StartServer, app: FakeApp
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        rejections: list[trio_websocket.ConnectionRejected] = []
        try:
            async with websocket_client(server, "/ws/forbidden"):
                pytest.fail("the upgrade was accepted")
        except* trio_websocket.ConnectionRejected as group:
            rejections.extend(group.exceptions)  # type: ignore[arg-type]
        await server.wait_no_connections()
    [rejection] = rejections
    assert rejection.status_code == 403
    assert rejection.body is not None
    assert orjson.loads(rejection.body)["error"]["code"] == "forbidden"
    assert not app.ws_done.is_set()


async def test_websocket_with_a_wrong_version_gets_426(start_server: StartServer) -> None:
    request = (
        b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n"
    )
    with trio.fail_after(5):
        reply = await raw_exchange(await start_server(), request)
    assert reply.status == 426
    assert "Sec-WebSocket-Version: 13" in reply.json()["error"]["message"]


async def test_websocket_client_vanishing_mid_message_releases_the_handler(
    start_server: StartServer, app: FakeApp
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        stream, ws = await open_raw_websocket(server, "/ws")
        frame = ws.send(Message(data="x" * 1000))
        async with stream:
            await stream.send_all(frame[:100])
        await app.ws_done.wait()
        await server.wait_no_connections()
    assert app.log in (["ws closed"], ["ws cancelled"])


async def test_websocket_client_vanishing_cancels_a_handler_that_is_not_reading(
    start_server: StartServer, app: FakeApp
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        stream, _ = await open_raw_websocket(server, "/ws/idle")
        await app.waiting.wait()
        await stream.aclose()
        await server.wait_no_connections()
    assert app.log == ["ws cancelled"]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"\x8f\x05hello", 1002),  # a reserved opcode, and unmasked
        (b"\x81\x82\x00\x00\x00\x00\xff\xfe", 1007),  # a text frame that is not UTF-8
    ],
)
async def test_websocket_protocol_violation_gets_a_close_frame_and_ends_that_connection_only(
    start_server: StartServer, app: FakeApp, caplog: pytest.LogCaptureFixture, frame: bytes, code: int
) -> None:
    """A frame that breaks the protocol (bad framing: 1002; invalid UTF-8 in a text frame:
    1007) gets a close frame with that code and a warning naming it, then the connection
    closes; the handler is released and another client is served as before."""
    with trio.fail_after(5):
        server = await start_server()
        stream, ws = await open_raw_websocket(server, "/ws")
        async with stream:
            await stream.send_all(frame)
            ws.receive_data(await receive_until_eof(stream))
        await app.ws_done.wait()
        await server.wait_no_connections()
        async with trio_websocket.open_websocket_url(f"ws://{HOST}:{server.port}/ws") as other:
            await other.send_message("still here")
            assert await other.get_message() == "still here"
    events = list(ws.events())
    assert not any(isinstance(event, Message) for event in events)
    assert [e.code for e in events if isinstance(e, CloseConnection)] == [code]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"closing it with {code}" in warning.getMessage()


async def test_websocket_message_over_the_cap_closes_with_1009(start_server: StartServer) -> None:
    with trio.fail_after(5):
        server = await start_server(ws_max_message_bytes=1024)
        async with websocket_client(server, "/ws") as ws:
            await ws.send_message("y" * 2000)
            with pytest.raises(trio_websocket.ConnectionClosed) as info:
                await ws.get_message()
        await server.wait_no_connections()
    assert info.value.reason is not None
    assert info.value.reason.code == 1009


async def test_websocket_handler_crash_is_logged_and_closes_with_1011(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(5):
        server = await start_server()
        async with websocket_client(server, "/ws/crash") as ws:
            with pytest.raises(trio_websocket.ConnectionClosed) as info:
                await ws.get_message()
        await server.wait_no_connections()
    assert info.value.reason is not None
    assert info.value.reason.code == 1011
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "handler bug" in record.getMessage() + str(record.exc_info)


async def test_rejected_raw_handshake_is_seen_by_the_client(start_server: StartServer) -> None:
    with trio.fail_after(5):
        server = await start_server()
        async with await server.connect() as stream:
            ws = WSConnection(ConnectionType.CLIENT)
            await stream.send_all(ws.send(Request(host=HOST, target="/ws/forbidden")))
            ws.receive_data(await receive_until_eof(stream))
            rejection = next(ws.events())
    assert isinstance(rejection, RejectConnection)
    assert rejection.status_code == 403


async def test_websocket_upgrade_with_a_head_wsproto_cannot_take_gets_431(
    start_server: StartServer,
) -> None:
    request = (
        b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"X-Pad: " + b"p" * 20_000 + b"\r\n\r\n"
    )
    with trio.fail_after(5):
        reply = await raw_exchange(await start_server(), request)
    assert reply.status == 431
