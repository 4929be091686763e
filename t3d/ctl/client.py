"""Talk to a running daemon over its public API: HTTP GETs and JSON-RPC over WebSocket.

Theory of operation: :func:`open_rpc` opens ``ws://host:port/ws`` with the
bearer token and starts one reader task in a per-connection nursery. The
reader routes each response to the caller waiting on its id and each
notification to a bounded channel that :meth:`RpcConnection.receive_notification`
drains. :func:`http_get_json` is a one-shot HTTP/1.1 GET (h11, ``Connection:
close``) for the plain HTTP endpoints.

Rules:
- Foreign exceptions (OSError, h11, trio-websocket) are mapped once, here,
  to :class:`CtlError`, whose message names the problem and the fix and
  whose ``exit_code`` is what ``t3d ctl`` exits with.
- The reader never blocks, so a response can always reach its caller. At the
  notification bound it drops notifications and, as soon as there is room,
  queues one synthetic ``resync`` (``sub`` None): the consumer re-reads the
  snapshot, as it does after a server-side resync.
- Every wait on the daemon has a deadline, except waiting for notifications,
  which is the consumer's choice.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import h11
import orjson
import trio
import trio_websocket

from t3d.config import Settings
from t3d.errors import T3dError
from t3d.service.statedir import running_daemon

JsonDict = dict[str, Any]

CONNECT_TIMEOUT_S = 5.0
HTTP_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 2.0
MAX_HTTP_BODY_BYTES = 64 * 1024 * 1024  # a bigger reply is refused with an error
MAX_WS_MESSAGE_BYTES = 64 * 1024 * 1024  # trio-websocket closes with 1009 above this
# Notifications waiting for the consumer; over either bound: drop, then resync.
NOTIFY_QUEUE_MESSAGES = 1_000
NOTIFY_QUEUE_BYTES = 16 * 1024 * 1024

# Exit statuses of `t3d ctl` (t3d/ctl/main.py says when each is used).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SIGINT = 130

START_HINT = "start it with `t3d serve` (or `make run`)"
# A daemon listening on every address is reached on loopback.
_LISTEN_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1"}


class CtlError(T3dError):
    """An expected failure of a ``t3d ctl`` command, shown to the user as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class RpcError(CtlError):
    """The daemon answered a JSON-RPC call with an error object."""

    def __init__(self, method: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{method} failed: {message} (code {code})", EXIT_FAILED)
        self.method = method
        self.code = code
        self.rpc_message = message
        self.data = data


@attrs.frozen
class Endpoint:
    """Where the daemon listens and where its token lives."""

    host: str
    port: int
    token_path: Path

    @classmethod
    def from_settings(cls, settings: Settings) -> Endpoint:
        return cls(settings.host, settings.port, settings.token_path)

    @classmethod
    def discover(cls, settings: Settings, *, port_given: bool, host_given: bool) -> Endpoint:
        """Where the daemon of ``settings.state_dir`` serves: the address its
        ``daemon.json`` names (so a daemon on ``--port 0`` is found), unless a port is given;
        the settings' address when there is no such file. A CtlError when the file is stale."""
        if port_given:
            return cls.from_settings(settings)
        run, stale = running_daemon(settings.state_dir)
        if stale is not None:
            raise CtlError(f"no t3d daemon runs on {settings.state_dir}: {stale}; {START_HINT}, which replaces the file")
        if run is None:
            return cls.from_settings(settings)
        host = settings.host if host_given else _LISTEN_ANY.get(run.host, run.host)
        return cls(host, run.port, settings.token_path)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.authority}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.authority}/ws"


def new_command_id() -> str:
    """A fresh client-minted ``command_id`` for a mutating call."""
    return uuid.uuid4().hex


def read_token(path: Path) -> str:
    """The daemon's bearer token from ``path``; a CtlError says how to get one."""
    try:
        token = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise CtlError(
            f"no token at {path}; the daemon writes it at its first start: {START_HINT}, "
            "or pass the --state-dir (or T3D_STATE_DIR) the daemon uses"
        ) from None
    except PermissionError:
        raise CtlError(
            f"cannot read the token at {path} (permission denied); "
            "run `t3d ctl` as the user that runs the daemon"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CtlError(
            f"cannot read the token at {path} ({exc}); restart the daemon to rewrite it"
        ) from None
    if not token:
        raise CtlError(
            f"the token file {path} is empty; delete it and restart the daemon to make a new one"
        )
    return token


def _not_running(endpoint: Endpoint, exc: BaseException | None) -> CtlError:
    why = f" ({exc.strerror})" if isinstance(exc, OSError) and exc.strerror else ""
    return CtlError(f"no t3d daemon answers at {endpoint.url}{why}; {START_HINT}")


def _refused_token(endpoint: Endpoint) -> CtlError:
    return CtlError(
        f"the token in {endpoint.token_path} was refused by the daemon at {endpoint.url}; "
        "pass the --state-dir (or T3D_STATE_DIR) that `t3d serve` uses, or restart the daemon "
        "if its token file was replaced"
    )


def _http_failure(endpoint: Endpoint, path: str, status: int, body: bytes) -> CtlError:
    """What a non-200 reply means; a JSON-RPC error in it (an int code: the daemon refused
    the request, e.g. a thread that does not exist) is an RpcError, as over the WebSocket."""
    if status == 401:
        return _refused_token(endpoint)
    detail = " ".join(body[:2000].decode("utf-8", "replace").split())[:120]
    try:
        error = orjson.loads(body)["error"]
        detail = f"{error['message']} ({error['code']})"
        if isinstance(error["code"], int) and not isinstance(error["code"], bool):
            return RpcError(f"GET {path.split('?', 1)[0]}", error["code"], str(error["message"]), error.get("data"))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    if status == 404:
        return CtlError(
            f"{endpoint.url}{path} does not exist (HTTP 404: {detail}); "
            "is another program using this port, or is the daemon older than this client?"
        )
    return CtlError(f"{endpoint.url}{path} answered HTTP {status}: {detail or 'no details'}")


async def http_get_json(endpoint: Endpoint, path: str, *, token: str | None = None, method: str = "GET") -> Any:
    """GET ``path`` (or another bodiless ``method``) and return its decoded JSON body; any
    non-200 reply is a CtlError.

    The whole exchange is bounded by HTTP_TIMEOUT_S.
    """
    headers = [
        ("Host", endpoint.authority),
        ("Accept", "application/json"),
        ("Connection", "close"),
        ("User-Agent", "t3d-ctl"),
    ]
    if method != "GET":
        headers.append(("Content-Length", "0"))
    if token is not None:
        headers.append(("Authorization", f"Bearer {token}"))
    with trio.move_on_after(HTTP_TIMEOUT_S) as scope:
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
        except (OSError, trio.TooSlowError) as exc:
            raise _not_running(endpoint, exc) from exc
        async with stream:
            try:
                status, body = await _exchange(
                    stream, h11.Request(method=method, target=path, headers=headers)
                )
            except (OSError, trio.BrokenResourceError) as exc:
                raise CtlError(
                    f"the connection to {endpoint.url} broke during {method} {path} ({exc}); "
                    "check that the daemon is still running with `t3d ctl status`"
                ) from exc
            except h11.ProtocolError as exc:
                raise CtlError(
                    f"the server at {endpoint.url} does not speak HTTP as t3d does ({exc}); "
                    "is another program using this port?"
                ) from exc
    if scope.cancelled_caught:
        raise CtlError(
            f"the daemon at {endpoint.url} did not answer {method} {path} within {HTTP_TIMEOUT_S:g} s; "
            "it may be overloaded or stuck: check its log (journalctl --user -u t3d)"
        )
    if status != 200:
        raise _http_failure(endpoint, path, status, body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise CtlError(
            f"{endpoint.url}{path} answered with a body that is not JSON ({exc})"
        ) from exc


async def _exchange(stream: trio.SocketStream, request: h11.Request) -> tuple[int, bytes]:
    """Send one request, read its whole response: (status, body), body bounded."""
    conn = h11.Connection(h11.CLIENT)
    await stream.send_all((conn.send(request) or b"") + (conn.send(h11.EndOfMessage()) or b""))
    status = 0
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(64 * 1024))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_HTTP_BODY_BYTES:
                raise h11.RemoteProtocolError(f"reply larger than {MAX_HTTP_BODY_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage):
            return status, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise h11.RemoteProtocolError("connection closed before the reply ended")


class RpcConnection:
    """One JSON-RPC session over an open WebSocket; see the module docstring."""

    def __init__(self, ws: trio_websocket.WebSocketConnection, endpoint: Endpoint) -> None:
        self._ws = ws
        self._endpoint = endpoint
        self._next_id = 1
        self._waiters: dict[int, trio.MemorySendChannel[JsonDict]] = {}
        self._notify_send, self._notify_recv = trio.open_memory_channel[tuple[JsonDict, int]](
            NOTIFY_QUEUE_MESSAGES
        )
        self._queued_bytes = 0
        self._lagging = False
        self._closed: CtlError | None = None

    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """Send one request and wait for its result (at most CALL_TIMEOUT_S).

        An error reply raises RpcError; a lost connection or no answer, CtlError.
        """
        if self._closed is not None:
            raise self._closed
        request_id = self._next_id
        self._next_id += 1
        send, recv = trio.open_memory_channel[JsonDict](1)
        self._waiters[request_id] = send
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params or {})}
        try:
            try:
                await self._ws.send_message(orjson.dumps(frame).decode())
            except trio_websocket.ConnectionClosed as exc:
                raise self._closed_error(exc.reason) from None
            with trio.move_on_after(CALL_TIMEOUT_S) as scope:
                try:
                    reply = await recv.receive()
                except trio.EndOfChannel:
                    raise self._closed or self._closed_error(None) from None
            if scope.cancelled_caught:
                raise CtlError(
                    f"the daemon did not answer {method} within {CALL_TIMEOUT_S:g} s; "
                    "it may be overloaded or stuck: see `t3d ctl status` and its log"
                )
        finally:
            self._waiters.pop(request_id, None)
        error = reply.get("error")
        if error is not None:
            if not isinstance(error, dict):
                error = {"code": -32603, "message": str(error)}
            raise RpcError(
                method,
                int(error.get("code", -32603)),
                str(error.get("message", "")),
                error.get("data"),
            )
        return reply.get("result")

    async def receive_notification(self) -> JsonDict:
        """The next notification's ``params``; a CtlError once the connection is gone."""
        try:
            params, size = await self._notify_recv.receive()
        except trio.EndOfChannel:
            raise self._closed or self._closed_error(None) from None
        self._queued_bytes -= size
        return params

    async def read_loop(self) -> None:
        """Route every incoming frame until the connection closes; never blocks on a consumer."""
        try:
            while True:
                raw = await self._ws.get_message()
                self._route(raw)
        except trio_websocket.ConnectionClosed as exc:
            self._closed = self._closed_error(exc.reason)
        finally:
            self._notify_send.close()
            for waiter in self._waiters.values():
                waiter.close()

    def _route(self, raw: str | bytes) -> None:
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return  # not ours to repair; a caller waiting on it times out with a clear error
        if not isinstance(message, dict):
            return
        if "id" in message and ("result" in message or "error" in message):
            waiter = (
                self._waiters.pop(message["id"], None) if isinstance(message["id"], int) else None
            )
            if waiter is not None:
                waiter.send_nowait(message)
                waiter.close()
            return
        params = message.get("params")
        if message.get("method") == "sub" and isinstance(params, dict):
            self._enqueue(params, len(raw))
        elif message.get("method") == "snapshot.chunk" and isinstance(params, dict):
            # A chunk of a thread.snapshot reply (whose response only counts the chunks):
            # delivered like a subscription's chunk, outside any subscription.
            chunk = {"sub": None, "kind": "snapshot.chunk", "seq": params.get("seq"), "data": params.get("data")}
            self._enqueue(chunk, len(raw))

    def _enqueue(self, params: JsonDict, size: int) -> None:
        if self._lagging:
            marker: JsonDict = {
                "sub": None,
                "kind": "resync",
                "seq": None,
                "data": {"reason": "client_lagged"},
            }
            if not self._offer(marker, 0):
                return
            self._lagging = False
        if not self._offer(params, size):
            self._lagging = True

    def _offer(self, params: JsonDict, size: int) -> bool:
        if self._queued_bytes + size > NOTIFY_QUEUE_BYTES:
            return False
        try:
            self._notify_send.send_nowait((params, size))
        except trio.WouldBlock:
            return False
        self._queued_bytes += size
        return True

    def _closed_error(self, reason: trio_websocket.CloseReason | None) -> CtlError:
        why = ""
        if reason is not None:
            why = f" (code {reason.code}{': ' + reason.reason if reason.reason else ''})"
        return CtlError(
            f"the daemon at {self._endpoint.url} closed the connection{why}; "
            "check that it is still running with `t3d ctl status`"
        )


def unwrap_group(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member groups (what a Trio nursery adds)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _handshake_failure(endpoint: Endpoint, exc: trio_websocket.HandshakeError) -> CtlError:
    if isinstance(exc, trio_websocket.ConnectionRejected):
        return _http_failure(endpoint, "/ws", exc.status_code, exc.body or b"")
    if isinstance(exc, trio_websocket.ConnectionTimeout):
        return CtlError(
            f"the daemon at {endpoint.url} did not accept a WebSocket within {CONNECT_TIMEOUT_S:g} s; "
            "it may be overloaded: see `t3d ctl status`"
        )
    return _not_running(endpoint, exc.__cause__)


@asynccontextmanager
async def open_rpc(endpoint: Endpoint, token: str) -> AsyncIterator[RpcConnection]:
    """Connect, authenticate and run the reader; closing the block closes the connection."""
    body_error: BaseException | None = None
    try:
        async with (
            trio_websocket.open_websocket_url(
                endpoint.ws_url,
                extra_headers=[(b"Authorization", f"Bearer {token}".encode())],
                max_message_size=MAX_WS_MESSAGE_BYTES,
                connect_timeout=CONNECT_TIMEOUT_S,
                disconnect_timeout=CLOSE_TIMEOUT_S,
            ) as ws,
            trio.open_nursery() as nursery,
        ):
            connection = RpcConnection(ws, endpoint)
            nursery.start_soon(connection.read_loop)
            try:
                yield connection
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise unwrap_group(group) from None
    except trio_websocket.DisconnectionTimeout:
        # The daemon did not finish the closing handshake; the work is done either way.
        if body_error is not None:
            raise body_error from None
    except trio_websocket.HandshakeError as exc:
        if body_error is not None:
            raise
        raise _handshake_failure(endpoint, exc) from exc
    except OSError as exc:
        if body_error is not None:
            raise
        raise _not_running(endpoint, exc) from exc
