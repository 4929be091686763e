"""`HttpConnection`: HTTP/1.1 on one accepted socket, for the transport (transport.py).

Each request head goes to the `App` (`App.check_head`) before any of its body is read:
a refusal is answered at once and the connection closes. An admitted request is read
whole, within one deadline for head and body together, and answered by the App: at once
(`App.answer_now`), unwatched (a quick route, `HeadCheck.watch` False), or while a task
watches the socket and cancels the handler if the client resets. A GET that asks to
upgrade goes, with every byte already read for it, to trio-websocket, and the App owns
the conversation. `TransportLimits` bounds every wait and buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import h11
import trio
import trio_websocket
from wsproto.frame_protocol import FrameProtocol

from t3d.api.http1 import (
    HeadCheck,
    HttpRequest,
    HttpResponse,
    announces_body,
    body_too_large,
    declared_length,
    encode_response_pieces,
    error_response,
    handshake_problem,
    is_websocket_upgrade,
    parse_request,
    request_timeout,
    unsupported_version,
)
from t3d.api.prefixed_stream import PrefixedStream, write_now
from t3d.api.shedding import Slot, Standing
from t3d.errors import T3dError
from t3d.fd_read import receive_some

logger = logging.getLogger("t3d.api")

# At most this many pieces of a response go in its first write (one writev; IOV_MAX is 1024).
_WRITE_PIECES = 64
# After a connection's last response, how long we drain what the peer still
# sends, so that it reads the response rather than a reset.
_LINGER_S = 1.0
# Close codes we send when wsproto finds the peer broke the protocol.
_PROTOCOL_ERROR_CODES = frozenset({1002, 1007, 1009})


@attrs.frozen
class TransportLimits:
    """The bounds every connection lives within, each with its policy at the bound."""

    max_header_bytes: int = 64 * 1024  # request line + headers; over it: 431, close
    max_body_bytes: int = 8 * 1024 * 1024  # request body; over it: 413, close
    # Body of a request the App did not find trusted (public routes take none); over it: 413.
    max_untrusted_body_bytes: int = 1024
    # A request head must be complete this long after its first byte (after the accept, on
    # a new connection), and a WebSocket handshake must complete within it; else 408, close.
    header_timeout_s: float = 10.0
    # Head and body together must be complete this long after the head's start; else 408.
    request_timeout_s: float = 30.0
    # Keep-alive wait for the next request, or a peer that accepts none of our bytes
    # for this long: close.
    idle_timeout_s: float = 60.0
    # Open connections. At the limit the connection that has gone longest without showing
    # credentials is closed to make room, then the longest-idle authenticated one; when
    # every connection is an authenticated one at work, the newcomer gets a 503.
    max_connections: int = 1024
    ws_max_message_bytes: int = 4 * 1024 * 1024  # received message; over it: close code 1009
    ws_message_queue_size: int = 16  # received, unread messages; when full we stop reading
    ws_close_timeout_s: float = 5.0  # wait for the peer's close frame; then drop the socket


class App(Protocol):
    """What the transport serves; the API layer implements it."""

    def check_head(self, request: HttpRequest) -> HeadCheck:
        """Cheap and without I/O: may this request go on, and does it carry credentials?

        Called for every request head (WebSocket upgrades included) before any
        of its body is read.
        """
        ...

    async def handle_http(self, request: HttpRequest) -> HttpResponse: ...

    def answer_now(self, request: HttpRequest) -> HttpResponse | None:
        """The response to ``request`` if the App has it at once, without waiting for
        anything (then nothing watches the peer meanwhile); None: `handle_http` answers."""
        ...

    def check_websocket(self, request: HttpRequest) -> HttpResponse | None:
        """None accepts the upgrade; a response refuses it (sent, then the connection closes)."""
        ...

    async def handle_websocket(
        self, ws: trio_websocket.WebSocketConnection, request: HttpRequest, stream: PrefixedStream
    ) -> None:
        """Own the conversation; ``stream`` is the one ``ws`` runs on (for writing frames
        directly: t3d/api/ws_frames.py)."""
        ...


class _Refusal(Exception):
    """The request cannot be served: send this response, then close."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status)
        self.response = response


class HttpConnection:
    """HTTP/1.1 on one socket: requests in, App responses out, until close or upgrade."""

    def __init__(
        self,
        stream: trio.SocketStream,
        app: App,
        limits: TransportLimits,
        nursery: trio.Nursery,
        slot: Slot[Any],
    ) -> None:
        self._stream = stream
        self._app = app
        self._limits = limits
        self._nursery = nursery
        self._slot = slot
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        # Every byte from the start of the current request head on (bounded by
        # max_header_bytes); replayed to trio-websocket on upgrade.
        self._head_bytes = bytearray()
        self._served = 0
        self._peer = _peer_address(stream)
        # When the current request began: the accept for the first, else its first byte.
        self._request_started = trio.current_time()
        self._trusted = False  # the current (or, between requests, the last) request's
        self._head_request = False  # the current request is a HEAD: its responses carry no body

    async def serve(self) -> None:
        try:
            while await self._serve_one():
                self._h11.start_next_cycle()
                self._head_request = False
                self._head_bytes = bytearray(self._h11.trailing_data[0])
        except _Refusal as refusal:
            await self._send_response(refusal.response, close=True, with_body=not self._head_request)
            await self._close_gracefully()

    async def _serve_one(self) -> bool:
        """Serve one request; True when the connection stays open for another."""
        head = await self._receive_head()
        if head is None:
            return False
        self._head_request = head.method == b"HEAD"
        if head.http_version not in (b"1.0", b"1.1"):
            raise _Refusal(unsupported_version(head.http_version))
        request = attrs.evolve(parse_request(head), peer=self._peer)
        check = self._app.check_head(request)
        self._trusted = check.trusted
        self._slot.stand(Standing.PROTECTED if check.trusted else Standing.EXPOSED)
        if check.refusal is not None:
            raise _Refusal(check.refusal)
        if is_websocket_upgrade(request):
            await self._serve_websocket(request)
            return False
        request = attrs.evolve(request, body=await self._receive_body(head))
        response = _answer_now(self._app, request)
        if response is None:
            response = await (self._respond_unless_abandoned(request) if check.watch else _call_app(self._app, request))
        if response is None:
            return False
        half_closed = self._h11.trailing_data[1]  # the peer sent its request, then its EOF
        await self._send_response(response, close=half_closed, with_body=not self._head_request)
        self._served += 1
        self._slot.stand(Standing.IDLE if self._trusted else Standing.EXPOSED)
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            return True
        await self._close_gracefully()
        return False

    async def _receive_head(self) -> h11.Request | None:
        """The next request head; None if the peer closed, or sent nothing in time."""
        if self._served and not self._h11.trailing_data[0]:
            with trio.move_on_after(self._limits.idle_timeout_s):
                await self._receive_into_h11(in_head=True)
            if not self._head_bytes and not self._h11.trailing_data[1]:
                return None  # idle for too long: close quietly
        if self._served:
            self._request_started = trio.current_time()
        with trio.move_on_at(self._request_started + self._limits.header_timeout_s) as scope:
            event = await self._next_event(in_head=True)
        if scope.cancelled_caught:
            if self._head_bytes:
                raise _Refusal(request_timeout("head", self._limits.header_timeout_s))
            return None  # a connection that never sent a byte: close quietly
        if isinstance(event, h11.ConnectionClosed):
            return None
        assert isinstance(event, h11.Request)
        return event

    async def _receive_body(self, head: h11.Request) -> bytes:
        """The whole body, due by the request's deadline (not a per-read one)."""
        if not announces_body(head):  # a GET as clients send it: nothing to wait for
            end = self._h11.next_event()
            assert isinstance(end, h11.EndOfMessage)
            return b""
        deadline = self._request_started + self._limits.request_timeout_s
        with trio.move_on_at(deadline) as scope:
            return await self._read_body(head)
        assert scope.cancelled_caught
        raise _Refusal(request_timeout("body", self._limits.request_timeout_s))

    async def _read_body(self, head: h11.Request) -> bytes:
        trusted = self._trusted
        limit = self._limits.max_body_bytes if trusted else self._limits.max_untrusted_body_bytes
        declared = declared_length(head)
        if declared is not None and declared > limit:
            raise _Refusal(body_too_large(limit, trusted=trusted))
        if self._h11.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event(in_head=False)
            if not isinstance(event, h11.Data):  # h11 yields only Data, then EndOfMessage
                return b"".join(chunks)
            size += len(event.data)
            if size > limit:
                raise _Refusal(body_too_large(limit, trusted=trusted))
            chunks.append(bytes(event.data))

    async def _next_event(self, *, in_head: bool) -> h11.Event:
        # PAUSED never comes up: we stop reading at a request's end, and
        # hand an upgrade over before that.
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise _Refusal(self._bad_request(exc)) from exc
            if isinstance(event, h11.Event):
                return event
            await self._receive_into_h11(in_head=in_head)

    async def _receive_into_h11(self, *, in_head: bool) -> None:
        if in_head:
            # While a head is read, h11's buffer is exactly _head_bytes. h11
            # checks its size only when it needs more data, so reading at most
            # one byte past the cap makes its 431 exact.
            room = self._limits.max_header_bytes + 1 - len(self._head_bytes)
            data = await receive_some(self._stream.socket.fileno, max(1, room))
            self._head_bytes += data
        else:
            data = await receive_some(self._stream.socket.fileno)
        self._h11.receive_data(data)

    def _bad_request(self, exc: h11.RemoteProtocolError) -> HttpResponse:
        if exc.error_status_hint == 431:
            return error_response(
                431,
                "header_too_large",
                f"the request head is over {self._limits.max_header_bytes} bytes; "
                "send fewer or shorter headers",
            )
        return error_response(
            400, "bad_request", f"malformed HTTP/1.1 request ({exc}); send a well-formed request"
        )

    async def _respond_unless_abandoned(self, request: HttpRequest) -> HttpResponse | None:
        """Run the App while watching the socket; None if the peer reset the connection first."""
        responses: list[HttpResponse] = []
        async with trio.open_nursery() as nursery:

            async def respond() -> None:
                responses.append(await _call_app(self._app, request))
                nursery.cancel_scope.cancel()

            nursery.start_soon(respond)
            await self._wait_for_reset()
            nursery.cancel_scope.cancel()
        return responses[0] if responses else None

    async def _wait_for_reset(self) -> None:
        """Return when the peer resets the connection; wait forever otherwise.

        An end of stream is the peer's half-close: its request is complete,
        so it is answered (and the connection then closes). Bytes of a
        pipelined next request are kept for the next cycle; from then on this
        request is answered without watching.
        """
        try:
            data = await receive_some(self._stream.socket.fileno)
        except trio.BrokenResourceError:
            return
        self._h11.receive_data(data)
        await trio.sleep_forever()

    async def _serve_websocket(self, request: HttpRequest) -> None:
        refusal = handshake_problem(request, len(self._head_bytes))
        refusal = refusal or self._app.check_websocket(request)
        if refusal is not None:
            raise _Refusal(refusal)
        limits = self._limits
        stream = PrefixedStream(
            bytes(self._head_bytes), self._stream, send_timeout_s=limits.idle_timeout_s
        )
        with trio.fail_after(limits.header_timeout_s):
            proposal = await trio_websocket.wrap_server_stream(
                self._nursery,
                stream,
                message_queue_size=limits.ws_message_queue_size,
                max_message_size=limits.ws_max_message_bytes,
            )
            ws = await proposal.accept()
        stream.farewell = _protocol_error_farewell(ws, request)
        await _run_websocket_app(self._app, ws, request, stream, limits.ws_close_timeout_s)

    async def _send_response(
        self, response: HttpResponse, *, close: bool, with_body: bool = True
    ) -> None:
        await self._send_pieces(encode_response_pieces(self._h11, response, close=close, with_body=with_body))

    async def _send(self, event: h11.Event) -> None:
        data = self._h11.send(event)
        assert data is not None
        await self._send_pieces([data])

    async def _send_pieces(self, pieces: list[bytes]) -> None:
        """Send ``pieces`` in order: what the socket takes at once in one write (of at most
        `_WRITE_PIECES` pieces, none joined), the rest as the peer reads."""
        sent = write_now(self._stream, *pieces[:_WRITE_PIECES]) if pieces else 0
        for piece in pieces:
            if sent >= len(piece):
                sent -= len(piece)
                continue
            with trio.fail_after(self._limits.idle_timeout_s):
                await self._stream.send_all(memoryview(piece)[sent:])
            sent = 0

    async def _close_gracefully(self) -> None:
        """Half-close, then drain the peer's leftovers briefly so it reads our last response."""
        with trio.move_on_after(_LINGER_S):
            await self._stream.send_eof()
            while await receive_some(self._stream.socket.fileno):
                pass


def _peer_address(stream: trio.SocketStream) -> str:
    """The peer's IP address, or "" if the socket no longer knows it."""
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return ""


async def _call_app(app: App, request: HttpRequest) -> HttpResponse:
    """The App's response; a 500 if it raises (`_failed`)."""
    try:
        return await app.handle_http(request)
    except Exception as exc:
        return _failed(request, exc)


def _failed(request: HttpRequest, exc: Exception) -> HttpResponse:
    """The 500 for an App that raised ``exc``: a T3dError's message (a warning in the log),
    anything else unnamed (logged with its traceback)."""
    if isinstance(exc, T3dError):
        logger.warning("%s %s failed: %s", request.method, request.path, exc)
        return error_response(500, "server_error", str(exc))
    logger.error("%s %s failed", request.method, request.path, exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has the details")


def _protocol_error_farewell(
    ws: trio_websocket.WebSocketConnection, request: HttpRequest
) -> Callable[[], bytes | None]:
    """The close frame to send when the stream closes because the peer broke the protocol.

    wsproto reports a bad frame (invalid UTF-8: 1007; bad framing: 1002) as if
    the peer had closed with that code, and trio-websocket then drops the
    stream without a close frame of ours. The stream asks this on closing.
    """

    def farewell() -> bytes | None:
        reason = ws.closed
        if reason is None or reason.code not in _PROTOCOL_ERROR_CODES:
            return None
        logger.warning(
            "a WebSocket client on %s broke the protocol (%s); closing it with %d",
            request.path,
            reason.reason,
            reason.code,
        )
        frame = FrameProtocol(client=False, extensions=[]).close(reason.code, reason.reason)
        return bytes(frame)

    return farewell


def _answer_now(app: App, request: HttpRequest) -> HttpResponse | None:
    """`App.answer_now`, with a 500 if it raises (`_failed`)."""
    try:
        return app.answer_now(request)
    except Exception as exc:
        return _failed(request, exc)


async def _run_websocket_app(
    app: App,
    ws: trio_websocket.WebSocketConnection,
    request: HttpRequest,
    stream: PrefixedStream,
    close_timeout_s: float,
) -> None:
    """Run the App's handler until it returns or the peer's stream ends, then close."""
    code = 1000
    try:
        async with trio.open_nursery() as nursery:

            async def handle() -> None:
                await app.handle_websocket(ws, request, stream)
                nursery.cancel_scope.cancel()

            nursery.start_soon(handle)
            await stream.wait_receive_ended()
            nursery.cancel_scope.cancel()
    except* trio_websocket.ConnectionClosed:
        pass
    except* Exception:
        logger.exception("websocket handler for %s failed", request.path)
        code = 1011
    with trio.move_on_after(close_timeout_s):
        await ws.aclose(code)
    await stream.aclose()  # sends the farewell, if the WebSocket library's own close was cut short
