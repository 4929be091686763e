"""One TCP port that speaks HTTP/1.1 and WebSocket to local clients.

Theory of operation: one accept loop per listening socket gives every
connection its own task and nursery, which runs an `HttpConnection`
(http_connection.py; this module keeps the listeners, the connection table
and the shedding). The task parses HTTP/1.1 with h11 and
asks the :class:`App` about each request head (:meth:`App.check_head`)
before it reads any of the body: a refusal (no token, wrong Host, wrong
method) is answered at once and the connection closes. An admitted request
is read whole, within one deadline for head and body together, and handed
to the App. A GET that asks to upgrade to WebSocket goes, with every byte
already read for it, to trio-websocket, and the App then owns the
conversation. When a connection ends, its nursery is cancelled: no task,
buffer or body started for it outlives it.

Rules:
- Every wait on a peer has a deadline and every buffer a bound
  (:class:`TransportLimits`); at a bound the peer gets a JSON error, where
  HTTP still allows one, and the connection closes.
- Capacity goes to those who show credentials: at the connection limit the
  connection that has shown none for longest is closed to make room, then
  the longest-idle authenticated one (t3d/api/shedding.py); a request
  without credentials may carry only a small body.
- A connection is a supervision boundary. Whatever goes wrong inside it ends
  that connection alone; the server and the other connections carry on.
- An App that raises while answering HTTP gets its client a 500, and the
  connection stays usable.
- A complete request is answered even if the client then half-closes its
  side; a client that resets the connection while its request is answered,
  or a WebSocket client whose stream ends, has its handler cancelled at once.
- A WebSocket peer that breaks the protocol (bad UTF-8, bad framing) gets a
  close frame with 1007 or 1002 and a log line, not a silent close.
"""

from __future__ import annotations

import errno
import logging
import resource
from collections.abc import Sequence

import attrs
import h11
import trio
import trio_websocket

from t3d.api.http1 import HeadCheck as HeadCheck
from t3d.api.http1 import HttpRequest as HttpRequest
from t3d.api.http1 import HttpResponse as HttpResponse
from t3d.api.http1 import encode_response, error_response
from t3d.api.http_connection import App as App
from t3d.api.http_connection import HttpConnection
from t3d.api.http_connection import TransportLimits as TransportLimits
from t3d.api.shedding import ConnectionTable, Slot
from t3d.errors import T3dError

logger = logging.getLogger("t3d.api")

DEFAULT_LIMITS = TransportLimits()

# A 503 for a connection over the limit is written inline by the accept loop,
# so it must never wait long.
_REFUSAL_SEND_S = 0.5
# Accept errors that mean "out of descriptors or memory for now": shed, or wait and retry.
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_S = 0.1
# Descriptors the process keeps for everything but connections (database, spawner, agents).
_OTHER_DESCRIPTORS = 256
# At most one warning per this many seconds while connections are being shed.
_SHED_WARNING_EVERY_S = 60.0
# Ends of a connection that are the peer's doing (or a deadline), not a bug.
_PEER_ENDINGS = (
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    trio_websocket.ConnectionClosed,
)


class ListenError(T3dError):
    """The port could not be bound (in use, not permitted, no such address)."""


@attrs.frozen
class TransportStatistics:
    open_connections: int
    accepted_total: int
    refused_total: int  # turned away with a 503: at max_connections with nothing to shed
    shed_total: int  # closed to make room for a newcomer (or a descriptor)


class TransportStats:
    """Live counters of one server, for health reporting and tests."""

    def __init__(self) -> None:
        self._open = 0
        self._accepted = 0
        self._refused = 0
        self._shed = 0
        self._changed = trio.Event()

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(self._open, self._accepted, self._refused, self._shed)

    async def wait_open_connections(self, count: int) -> None:
        """Wait until exactly ``count`` connections are open."""
        while self._open != count:
            await self._changed.wait()

    def _opened(self) -> None:
        self._open += 1
        self._accepted += 1
        self._notify()

    def _closed(self, *, shed: bool = False) -> None:
        self._open -= 1
        self._shed += shed
        self._notify()

    def _refused_one(self) -> None:
        self._refused += 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


def listen_failure(host: str, port: int, exc: OSError) -> str:
    """Why ``host:port`` could not be bound, and what to do about it, by errno. Pure."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        hint = "another process listens there; pick another --port (or T3D_PORT) or stop the server that holds it"
    elif exc.errno == errno.EADDRNOTAVAIL:
        hint = "no interface of this host has that address; pick one it has with --host (or T3D_HOST), e.g. 127.0.0.1 or ::1"
    elif exc.errno == errno.EACCES and 0 < port < 1024:
        hint = "ports below 1024 need privileges; pick a port from 1024 up with --port (or T3D_PORT)"
    elif exc.errno == errno.EACCES:
        hint = "this user may not listen there; pick another --port (or T3D_PORT) or --host (or T3D_HOST)"
    else:
        hint = "check --host and --port (or T3D_HOST and T3D_PORT)"
    return f"could not listen on {where}: {exc.strerror or exc}; {hint}"


async def serve_api_transport(
    app: App,
    host: str,
    port: int,
    *,
    limits: TransportLimits = DEFAULT_LIMITS,
    stats: TransportStats | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on host:port until cancelled; report the bound port through task_status.

    With port 0 and a host name that resolves to several addresses, only the
    first address is served, since the kernel would pick a different port for each.
    """
    _ensure_descriptors(limits.max_connections)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ListenError(listen_failure(host, port, exc)) from exc
    if port == 0:
        await _close_all(listeners[1:])
        del listeners[1:]
    server = _Server(app, limits, stats or TransportStats())
    try:
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(server.accept_connections, listener, nursery)
            task_status.started(listeners[0].socket.getsockname()[1])
    finally:
        await _close_all(listeners)


def _ensure_descriptors(max_connections: int) -> None:
    """Raise the soft descriptor limit so max_connections fit beside everything else.

    Each connection is one descriptor; an accept that fails for want of one
    sheds a connection instead, but the limit should rarely be what decides.
    """
    wanted = max_connections + _OTHER_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        logger.warning(
            "this process may open only %d files (ulimit -n); %d connections and the daemon's "
            "own files need %d: beyond that, the oldest unauthenticated connections are "
            "closed to make room; raise the hard limit (LimitNOFILE= in a systemd unit)",
            target,
            max_connections,
            wanted,
        )


async def _close_all(resources: Sequence[trio.SocketListener | trio.SocketStream]) -> None:
    """Close sockets even when cancelled; closing a socket never blocks, so the shield is safe."""
    with trio.CancelScope(shield=True):
        for resource_ in resources:
            await resource_.aclose()


@attrs.define(eq=False)
class _Handle:
    """What the connection table holds for one connection: enough to shed it."""

    stream: trio.SocketStream
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)

    def shed(self) -> None:
        """Close the socket now (its descriptor is free at once) and cancel its task."""
        self.scope.cancel()
        self.stream.socket.close()


class _Server:
    """The connection table and counters shared by one server's listeners."""

    def __init__(self, app: App, limits: TransportLimits, stats: TransportStats) -> None:
        self.app = app
        self.limits = limits
        self.stats = stats
        self.table: ConnectionTable[_Handle] = ConnectionTable()
        self._shed_since_warning = 0
        self._next_warning = 0.0

    async def accept_connections(
        self, listener: trio.SocketListener, nursery: trio.Nursery
    ) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                    raise
                if self._shed_one(f"accept failed: {exc.strerror or exc}"):
                    continue
                logger.error("accept failed (%s); retrying in %.1f s", exc, _ACCEPT_RETRY_S)
                await trio.sleep(_ACCEPT_RETRY_S)
                continue
            if len(self.table) >= self.limits.max_connections and not self._shed_one(
                f"at the limit of {self.limits.max_connections} connections"
            ):
                self.stats._refused_one()
                await _refuse_busy(stream, self.limits.max_connections)
                continue
            slot = self.table.add(_Handle(stream))
            self.stats._opened()
            nursery.start_soon(self.serve_connection, slot)

    def _shed_one(self, why: str) -> bool:
        handle = self.table.shed_one()
        if handle is None:
            return False
        handle.shed()
        self.stats._closed(shed=True)
        self._shed_since_warning += 1
        now = trio.current_time()
        if now >= self._next_warning:
            logger.warning(
                "%s: closed %d connection(s) that showed no token, or were idle, to make room "
                "(the oldest first); authenticated requests in progress are kept",
                why,
                self._shed_since_warning,
            )
            self._shed_since_warning = 0
            self._next_warning = now + _SHED_WARNING_EVERY_S
        return True

    async def serve_connection(self, slot: Slot[_Handle]) -> None:
        """One connection's supervision boundary: whatever happens inside ends it alone."""
        handle = slot.value
        try:
            with handle.scope:
                async with trio.open_nursery() as nursery:
                    await HttpConnection(handle.stream, self.app, self.limits, nursery, slot).serve()
                    nursery.cancel_scope.cancel()
        except* _PEER_ENDINGS as group:
            logger.debug("connection ended by the peer: %r", group.exceptions)
        except* Exception:
            logger.exception("connection failed; closing it")
        finally:
            await _close_all([handle.stream])
            if slot.leave():
                self.stats._closed()


async def _refuse_busy(stream: trio.SocketStream, max_connections: int) -> None:
    response = error_response(
        503,
        "server_busy",
        f"the server already has {max_connections} open connections, all authenticated "
        "and busy; close idle connections or retry shortly",
    )
    data = encode_response(h11.Connection(h11.SERVER), response, close=True)
    try:
        with trio.move_on_after(_REFUSAL_SEND_S):
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass
    finally:
        await _close_all([stream])
