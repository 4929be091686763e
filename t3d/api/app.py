"""The API application: HTTP routes, and WebSocket connections with subscriptions.

Rules:
- Every request's ``Host`` must name the daemon as bound (t3d/api/auth.py);
  else 421. Everything but ``GET /api/health`` and the web page's own routes
  needs ``Authorization: Bearer <token>``, or the page's session cookie from
  its own origin (t3d/api/web_page.py), checked on the request head before
  any body is read (``GET /metrics`` is also open to loopback scrapers with
  ``--metrics-open loopback``; ``/mcp`` checks Origin, then the token,
  itself); health without credentials tells only its public part
  (`PUBLIC_HEALTH`). A known path with a method it does not take gets 405
  with ``Allow``; HEAD is answered wherever GET is. WebSocket upgrades are
  accepted only on ``/ws``, with the token or the cookie, and from no Origin
  or a loopback one.
- On a WebSocket each request runs in its own task (at most
  `MAX_IN_FLIGHT` per connection; beyond that the connection stops reading).
  A bad frame gets an error reply; the connection stays up.
- Subscriptions are served by `Feeds` (t3d/api/feeds.py): join the hub,
  read a base (snapshot or replay), reply, send the base, go live; resync on
  overflow. Closing the connection releases them all at once.
- Snapshots over HTTP (``GET /api/threads/{id}``, ``thread.snapshot`` via
  ``POST /api/dispatch``) are one JSON object written in pieces of at most
  256 KiB; on a WebSocket ``thread.snapshot`` is streamed as
  ``snapshot.chunk`` notifications, then the response (`Feeds.reply_snapshot`).
  Every route refuses query parameters it does not take, on the head and
  whatever the method (a misspelled ``turnLimit`` must not silently return
  the whole thread).
- Each WebSocket connection holds at most ``connection_budget`` bytes for its
  client (t3d/live/budget.py).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs
import orjson
import trio
import trio_websocket

from t3d import waits
from t3d.api import jsonrpc as rpc
from t3d.api.auth import bearer_ok, host_allowed, origin_allowed
from t3d.api.feeds import Feeds
from t3d.api.http1 import is_websocket_upgrade
from t3d.api.methods import Methods, thread_not_found
from t3d.api.prefixed_stream import PrefixedStream
from t3d.api.transport import HeadCheck, HttpRequest, HttpResponse
from t3d.api.web_page import WebPage
from t3d.api.ws_frames import MessageWriter
from t3d.errors import DatabaseUnavailableError, SpawnerError, T3dError
from t3d.live.budget import CONNECTION_BYTES
from t3d.live.hub import Hub
from t3d.live.reads import BaseReader
from t3d.pressure.sampler import PressureListener, PressureSampler
from t3d.spawn.child import Spawner
from t3d.store.queries import DEFAULT_TURN_LIMIT, MAX_TURN_LIMIT

if TYPE_CHECKING:  # imported on first use: the schema on GET /api/schema, MCP on /mcp
    from t3d.api.mcp import McpServer

log = logging.getLogger("t3d.api")

MAX_IN_FLIGHT = 32
# subscribe.server subscriptions a connection may hold at once.
MAX_SERVER_SUBS = 8

# What GET /api/health tells a client without the token (the rest names agents and processes).
PUBLIC_HEALTH = ("status", "reasons", "version", "uptime_s")

RouteHandler = Callable[[HttpRequest, re.Match[str]], Awaitable[HttpResponse]]


class Route:
    """One HTTP path (a regular expression matched whole) and its handler per method."""

    def __init__(
        self,
        path: str,
        handlers: dict[str, RouteHandler],
        *,
        public: bool = False,
        query: tuple[str, ...] | None = (),
        head: Callable[[HttpRequest, bool], HttpResponse | None] | None = None,
        quick: bool = False,
    ) -> None:
        self.pattern = re.compile(path)
        self.handlers = handlers
        self.public = public  # answered without the token
        # The query parameters it takes; any other gets a 400 on the head, whatever the method.
        # None: the handler checks the query itself (the web page answers in HTML).
        self.query = query
        # The route's own check of a request head, given whether it carries the token;
        # it replaces the token and method checks (a refusal, or None to go on).
        self.head = head
        # Answered from memory, or by one small read or command: no task watches the peer
        # for a reset meanwhile (`HeadCheck.watch`); the routes bots poll are.
        self.quick = quick

    def unknown_query(self, request: HttpRequest) -> HttpResponse | None:
        """A 400 naming the query parameters this route does not take, and those it does."""
        if self.query is None:
            return None
        unknown = sorted(set(request.query) - set(self.query))
        if not unknown:
            return None
        takes = f"it takes {', '.join(self.query)}" if self.query else "it takes none"
        message = f"unknown query parameter {', '.join(unknown)} for {request.path}; {takes}"
        return _json(400, {"error": {"code": rpc.INVALID_PARAMS, "message": message, "data": None}})

    def allow(self) -> str:
        """The methods for an ``Allow`` header: HEAD wherever GET."""
        methods = sorted(self.handlers)
        return ", ".join([*methods, "HEAD"] if "GET" in methods else methods)


def _json(status: int, value: Any) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(value))


def _error(status: int, code: str, message: str) -> HttpResponse:
    return _json(status, {"error": {"code": code, "message": message}})


def _unavailable(exc: DatabaseUnavailableError, request_id: rpc.RequestId = None) -> rpc.RpcError:
    """A write the database could not take now (full, locked): JSON-RPC ``UNAVAILABLE``
    (HTTP 503), the message naming the fix, ``data.reason`` its machine name."""
    return rpc.RpcError(rpc.UNAVAILABLE, str(exc), {"reason": exc.reason}, request_id)


def _rpc_status(exc: rpc.RpcError) -> int:
    return {rpc.NOT_FOUND: 404, rpc.CONFLICT: 409, rpc.METHOD_NOT_FOUND: 404, rpc.UNAVAILABLE: 503}.get(exc.code, 400)


class ApiApp:
    def __init__(
        self,
        methods: Methods,
        hub: Hub,
        token: str,
        *,
        health: Callable[[], dict[str, Any]],
        bound: Callable[[], tuple[str, int]],
        spawner: Spawner,
        pressure: PressureSampler | None = None,
        connection_budget: int = CONNECTION_BYTES,
        metrics: Callable[[], Awaitable[bytes]] | None = None,
        metrics_open: str = "none",
    ) -> None:
        self.methods = methods
        # The /metrics body (t3d/observe/metrics.py); none: the route is not served.
        self._metrics = metrics
        self._metrics_open = metrics_open
        self.pressure = pressure
        # Bytes one WebSocket connection may hold for its client (t3d/live/budget.py).
        self.connection_budget = connection_budget
        # Open WebSocket connections (statistics, tests).
        self.connections: set[WsConnection] = set()
        self._spawner = spawner
        self.hub = hub
        # Subscription bases; fresh snapshots shared per wave unless the hub projects per
        # subscriber (the setting that turns project-once off turns this off too).
        # The shell is served from the hub's in-memory rows (t3d/live/shell_rows.py).
        self.bases = BaseReader(
            methods.store, share=hub.encode_once, workspaces=self._workspace_rows, shell_rows=hub.shell_rows
        )
        self._token = token
        self._health = health
        self._bound = bound
        self._schema: bytes | None = None
        self._mcp: McpServer | None = None
        # The web page, its sign-in links and cookie sessions (t3d/api/web_page.py).
        self.web = WebPage(token, bound)
        # Every HTTP route: the path, the methods it takes (HEAD wherever GET), whether it
        # is answered without the token, the query parameters it takes, and whether it is
        # quick (`Route.quick`). check_head refuses the rest before any body.
        self.routes: tuple[Route, ...] = (
            Route("/api/health", {"GET": self._get_health}, public=True),
            # The web page's routes: public, since the page checks its own credentials (the
            # one-time link, the session cookie, the token for a new link), queries and HEADs.
            Route("/", {"GET": self._page}, public=True, query=None),
            Route("/static/.*", {"GET": self._page}, public=True, query=None),
            Route("/auth", {"GET": self._page}, public=True, query=None),
            Route("/api/auth/link", {"POST": self._page}, public=True),
            Route("/api/auth/session", {"GET": self._page}, public=True, query=None),
            Route("/api/auth/logout", {"POST": self._page}, public=True),
            Route("/api/shell", {"GET": self._get_shell}, quick=True),
            Route("/api/threads/([^/]+)", {"GET": self._get_thread}, query=("turn_limit", "before")),
            Route("/api/items/([^/]+)", {"GET": self._get_item}, query=("path",)),
            Route("/api/requests/pending", {"GET": self._get_pending}, query=("thread_id",), quick=True),
            Route("/api/requests/wait", {"GET": self._get_wait}, query=("after", "thread_id", "thread_ids", "timeout", "limit")),
            Route("/api/requests/([^/]+)/respond", {"POST": self._post_respond}, quick=True),
            Route("/api/spawner", {"GET": self._get_spawner}),
            Route("/api/dispatch", {"POST": self._post_dispatch}),
            Route("/api/schema", {"GET": self._get_schema}, quick=True),
            Route("/mcp", {"POST": self._post_mcp}, head=self._mcp_head),
            Route("/ws", {"GET": self._get_ws}),
        )
        if metrics is not None:  # else /metrics is not served (404)
            self.routes += (Route("/metrics", {"GET": self._get_metrics}, head=self._metrics_head),)

    @property
    def mcp(self) -> McpServer:
        """The MCP endpoint (t3d/api/mcp.py), made on the first ``/mcp`` request, so a daemon
        no MCP client talks to never imports it."""
        if self._mcp is None:
            from t3d.api.mcp import McpServer
            from t3d.api.mcp_tools import McpTools

            self._mcp = McpServer(McpTools(self.methods, self._shell_json))
        return self._mcp

    def _workspace_rows(self) -> Mapping[str, bytes]:
        """Thread id -> workspace status, for the shell rows a read is about to return."""
        return self.hub.workspaces.rows() if self.hub.workspaces is not None else {}

    def live_statistics(self) -> dict[str, int]:
        """For /api/health: what the open WebSocket connections hold for their clients,
        against what their budgets allow (t3d/live/budget.py), and how many subscriptions
        those connections resynced to stay within them."""
        budgets = [connection.feeds.budget for connection in self.connections]
        return {
            "websockets": len(budgets),
            "buffered_bytes": sum(b.buffered for b in budgets),
            "held_bytes": sum(b.held for b in budgets),
            "budget_bytes": sum(b.limit for b in budgets),
            "resynced_for_budget": sum(b.relieved for b in budgets),
            "request_waiters": self.methods.waiters.statistics().waiters,
        }

    async def _shell_json(self) -> dict[str, Any]:
        """The shell as GET /api/shell serves it (for MCP's list_threads)."""
        return orjson.loads(b"".join(await self.bases.shell_pieces()))  # type: ignore[no-any-return]

    # --- HTTP ----------------------------------------------------------------------

    def check_head(self, request: HttpRequest) -> HeadCheck:
        """Before any body is read: the Host must name this daemon, an upgrade's Origin must
        be no browser's or a loopback one, the token (or the page's session cookie) must be
        there unless the route is public, and the route must take the method and its query
        parameters."""
        host, port = self._bound()
        if not host_allowed(request.headers.get("host"), host, port):
            return HeadCheck(refusal=_wrong_host(request.headers.get("host", ""), port))
        if is_websocket_upgrade(request) and not origin_allowed(request.headers.get("origin"), host, port):
            return HeadCheck(refusal=_foreign_origin())  # before the token, as on every upgrade
        found = self._find(request.path)
        if found is not None and found[0].head is not None:  # the token alone: no cookie here
            route = found[0]
            assert route.head is not None
            trusted = bearer_ok(request.headers, self._token)
            return HeadCheck(trusted=trusted, refusal=route.head(request, trusted) or route.unknown_query(request))
        trusted = self._trusted(request)
        if not trusted and (found is None or not found[0].public):
            return HeadCheck(refusal=_unauthorized())
        if found is None:
            return HeadCheck(trusted=trusted, refusal=_error(404, "not_found", f"no route for {request.method} {request.path}; see the README for the HTTP API"))
        route = found[0]
        if _route_method(request) not in route.handlers:
            allow = route.allow()
            refusal = _error(405, "method_not_allowed", f"{request.path} takes {allow}, not {request.method}")
            return HeadCheck(trusted=trusted, refusal=attrs.evolve(refusal, headers=(("allow", allow),)))
        return HeadCheck(trusted=trusted, refusal=route.unknown_query(request), watch=not route.quick)

    def answer_now(self, request: HttpRequest) -> HttpResponse | None:
        """``GET /api/health`` (and its HEAD) is answered from memory, at once (no task to
        watch the peer); every other request is `handle_http`'s."""
        if request.path != "/api/health" or _route_method(request) != "GET":
            return None
        check = self.check_head(request)  # the transport asked already; cheap to repeat
        return check.refusal or self._health_response(check.trusted)

    async def handle_http(self, request: HttpRequest) -> HttpResponse:
        refusal = self.check_head(request).refusal  # the transport asked already; cheap to repeat
        if refusal is not None:
            return refusal
        found = self._find(request.path)
        assert found is not None
        route, match = found
        try:
            try:
                return await route.handlers[_route_method(request)](request, match)
            except DatabaseUnavailableError as exc:
                raise _unavailable(exc) from exc
        except rpc.RpcError as exc:
            return _json(_rpc_status(exc), {"error": {"code": exc.code, "message": exc.message, "data": exc.data}})

    def _trusted(self, request: HttpRequest) -> bool:
        """The token, or the web page's session cookie sent from the page itself."""
        return bearer_ok(request.headers, self._token) or self.web.session_ok(
            request, upgrade=is_websocket_upgrade(request)
        )

    async def _page(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        """A web page route (t3d/api/web_page.py)."""
        page = await self.web.handle(r)
        assert page is not None, r.path  # the route table lists only the page's paths
        return page

    def _find(self, path: str) -> tuple[Route, re.Match[str]] | None:
        for route in self.routes:
            if match := route.pattern.fullmatch(path):
                return route, match
        return None

    async def _get_health(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        return self._health_response(self._trusted(r))

    def _health_response(self, trusted: bool) -> HttpResponse:
        """The whole report with the token; without it only its public part."""
        report = self._health()
        status = 503 if report["status"] == "failing" else 200
        if not trusted:
            report = {key: report[key] for key in PUBLIC_HEALTH if key in report}
        return _json(status, report)

    async def _get_shell(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        return _pieces(await self.bases.shell_pieces())

    async def _get_thread(self, r: HttpRequest, m: re.Match[str]) -> HttpResponse:
        params = rpc.Params({"thread_id": m.group(1), **_int_query(r.query, ("turn_limit", "before"))})
        thread_id, turn_limit, before, children = self.methods.snapshot_params(params)
        pieces = await self.bases.thread_snapshot_pieces(thread_id, turn_limit, before, children)
        if pieces is None:
            raise thread_not_found(thread_id)
        return _pieces(pieces)

    async def _get_item(self, r: HttpRequest, m: re.Match[str]) -> HttpResponse:
        path = _json_query(r.query, "path")
        return _json(200, await self.methods.call("item.detail", {"item_id": m.group(1), "path": path}))

    async def _get_pending(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        return _json(200, await self.methods.call("requests.pending", {"thread_id": r.query.get("thread_id")}))

    async def _get_wait(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        """A long-poll for runtime requests (``requests.wait``)."""
        thread_ids = r.query.get("thread_ids")
        wait = {
            "thread_id": r.query.get("thread_id"),
            "thread_ids": None if thread_ids is None else thread_ids.split(","),
            **_int_query(r.query, ("after", "timeout", "limit")),
        }
        return _json(200, await self.methods.call("requests.wait", wait))

    async def _post_respond(self, r: HttpRequest, m: re.Match[str]) -> HttpResponse:
        body = _body_object(r.body)
        return _json(200, await self.methods.call("request.respond", {**body, "request_id": m.group(1)}))

    async def _get_spawner(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        try:
            return _json(200, await self._spawner.describe())
        except SpawnerError as exc:
            return _error(503, "spawner_unavailable", str(exc))

    async def _post_dispatch(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        return await self._dispatch(r.body)

    async def _get_ws(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        """A plain GET of /ws (upgrades never reach handle_http)."""
        refusal = _error(426, "upgrade_required", "/ws speaks WebSocket; send a WebSocket upgrade (Connection: Upgrade, Upgrade: websocket)")
        return attrs.evolve(refusal, headers=(("upgrade", "websocket"),))

    async def _get_schema(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        if self._schema is None:  # imported and built once, on first ask (t3d/api/schema.py)
            from t3d.api import schema

            self._schema = orjson.dumps(schema.document())
        return HttpResponse(200, self._schema)

    def _mcp_head(self, request: HttpRequest, token_ok: bool) -> HttpResponse | None:
        """MCP checks its own head (t3d/api/mcp.py): Origin (403), then the token (401), then
        the method and Accept, each answered the way MCP clients expect."""
        from t3d.api.mcp import refuse  # MCP is imported on its first request

        origin_ok = origin_allowed(request.headers.get("origin"), *self._bound())
        return refuse(request, origin_ok=origin_ok, token_ok=token_ok)

    async def _post_mcp(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        origin_ok = origin_allowed(r.headers.get("origin"), *self._bound())
        return await self.mcp.handle(r, origin_ok=origin_ok, token_ok=bearer_ok(r.headers, self._token))

    def _metrics_head(self, request: HttpRequest, token_ok: bool) -> HttpResponse | None:
        """/metrics: GET with the token, or from loopback when ``--metrics-open loopback``."""
        if _route_method(request) != "GET":
            refusal = _error(405, "method_not_allowed", f"/metrics takes GET, HEAD, not {request.method}")
            return attrs.evolve(refusal, headers=(("allow", "GET, HEAD"),))
        if not (self._metrics_open == "loopback" and _loopback(request.peer)) and not token_ok:
            return _error(
                401, "unauthorized",
                "missing or wrong bearer token; send 'Authorization: Bearer <token>' with the token from "
                "<state-dir>/auth/token (Prometheus: authorization.credentials_file), or start the daemon "
                "with --metrics-open loopback to let loopback scrapers in without it",
            )  # fmt: skip
        return None

    async def _get_metrics(self, r: HttpRequest, _: re.Match[str]) -> HttpResponse:
        """The Prometheus exposition (t3d/observe/metrics.py)."""
        assert self._metrics is not None
        return HttpResponse(200, await self._metrics(), content_type="text/plain; version=0.0.4; charset=utf-8")

    async def _dispatch(self, frame: bytes) -> HttpResponse:
        try:
            request = rpc.parse_request(frame)
        except rpc.RpcError as exc:
            return HttpResponse(200, rpc.error_frame(exc.request_id, exc.code, exc.message, exc.data))
        if request.method.startswith(("subscribe.", "unsubscribe")):
            return HttpResponse(200, rpc.error_frame(request.id, rpc.INVALID_REQUEST, f"{request.method} needs a WebSocket; connect to /ws"))
        if request.method == "thread.snapshot":
            return await self._dispatch_snapshot(request)
        return HttpResponse(200, await self.answer(request))

    async def _dispatch_snapshot(self, request: rpc.Request) -> HttpResponse:
        """``thread.snapshot`` over HTTP: one JSON-RPC response whose body is streamed in pieces
        of at most 256 KiB (the snapshot itself is never joined into one buffer)."""
        try:
            thread_id, turn_limit, before, children = self.methods.snapshot_params(rpc.Params(request.params, request.method))
            pieces = await self.bases.thread_snapshot_pieces(thread_id, turn_limit, before, children)
            if pieces is None:
                raise thread_not_found(thread_id)
        except rpc.RpcError as exc:
            return HttpResponse(200, rpc.error_frame(request.id, exc.code, exc.message, exc.data))
        except T3dError as exc:
            return HttpResponse(200, rpc.error_frame(request.id, rpc.INTERNAL_ERROR, str(exc)))
        head = b'{"jsonrpc":"2.0","id":%s,"result":' % orjson.dumps(request.id)
        return HttpResponse(200, head, parts=(*pieces, b"}"))

    async def answer(self, request: rpc.Request, *, owner: object | None = None) -> bytes:
        try:
            result = await self.methods.call(request.method, request.params, owner=owner)
        except rpc.RpcError as exc:
            return rpc.error_frame(request.id, exc.code, exc.message, exc.data)
        except DatabaseUnavailableError as exc:
            error = _unavailable(exc)
            return rpc.error_frame(request.id, error.code, error.message, error.data)
        except T3dError as exc:
            return rpc.error_frame(request.id, rpc.INTERNAL_ERROR, str(exc))
        return rpc.result_frame(request.id, result)

    # --- WebSocket ------------------------------------------------------------------

    def check_websocket(self, request: HttpRequest) -> HttpResponse | None:
        if request.path != "/ws":
            return _error(404, "not_found", "WebSocket connections are served on /ws")
        host, port = self._bound()
        if not origin_allowed(request.headers.get("origin"), host, port):
            return _foreign_origin()
        if not self._trusted(request):
            return _unauthorized()
        return None

    async def handle_websocket(self, ws: trio_websocket.WebSocketConnection, request: HttpRequest, stream: PrefixedStream) -> None:
        connection = WsConnection(self, ws, MessageWriter(ws, stream))
        self.connections.add(connection)
        try:
            with self.web.held(request):  # a browser's connection ends with its session
                await connection.run()
        finally:
            self.connections.discard(connection)


def _loopback(peer: str) -> bool:
    """Is ``peer`` (an IP address as the socket gave it) a loopback address? Pure."""
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _unauthorized() -> HttpResponse:
    return _error(401, "unauthorized", "missing or wrong bearer token; send 'Authorization: Bearer <token>' with the token from <state-dir>/auth/token")


def _foreign_origin() -> HttpResponse:
    return _error(403, "forbidden_origin", "WebSocket upgrades from a foreign Origin are refused; connect from a loopback page or a non-browser client")


def _wrong_host(host: str, port: int) -> HttpResponse:
    return _error(
        421,
        "wrong_host",
        f"this server does not answer to Host {host!r}: it answers to 127.0.0.1, localhost and ::1 "
        f"(or the address it listens on) at port {port}, so that a web page reaching it under another "
        "name (DNS rebinding) is refused; connect by one of those names",
    )


def _route_method(request: HttpRequest) -> str:
    """HEAD is answered as GET (the transport then sends no body)."""
    return "GET" if request.method == "HEAD" else request.method


def _pieces(pieces: list[bytes]) -> HttpResponse:
    """A JSON body sent piece by piece (each at most 256 KiB)."""
    return HttpResponse(200, parts=tuple(pieces))


def _json_query(query: Any, name: str) -> Any:
    raw = query.get(name)
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f'{name} must be a JSON array such as ["data","result"], not {raw!r}') from None


def _int_query(query: Any, names: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        raw = query.get(name)
        if raw is not None:
            try:
                out[name] = int(raw)
            except ValueError:
                raise rpc.RpcError(rpc.INVALID_PARAMS, f"{name} must be an integer, not {raw!r}") from None
    return out


def _body_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise rpc.RpcError(rpc.PARSE_ERROR, f"the body is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise rpc.RpcError(rpc.INVALID_PARAMS, "the body must be a JSON object")
    return value


class WsConnection:
    def __init__(self, app: ApiApp, ws: trio_websocket.WebSocketConnection, writer: MessageWriter) -> None:
        self.app = app
        self.ws = ws
        self._writer = writer
        self.feeds = Feeds(app.hub, app.bases, self.send, budget=app.connection_budget, send_many=writer.send, direct=writer)
        self._in_flight = trio.Semaphore(MAX_IN_FLIGHT)
        self._nursery: trio.Nursery | None = None
        # subscribe.server subscriptions: id -> the scope of its delivery task (if it has one).
        self._server_subs: dict[str, trio.CancelScope | None] = {}
        self._next_server_sub = 0

    async def send(self, frame: bytes) -> None:
        await self._writer.send((frame,))

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.feeds.run)
                while True:
                    message = await self.ws.get_message()
                    await waits.acquire(self._in_flight)
                    nursery.start_soon(self._handle, message)
        finally:
            self.feeds.close()

    async def _handle(self, message: str | bytes) -> None:
        request: rpc.Request | None = None
        try:
            request = rpc.parse_request(message)
            if request.method in ("subscribe.thread", "subscribe.shell"):
                await self._subscribe(request)
            elif request.method == "subscribe.server":
                await self._subscribe_server(request)
            elif request.method == "unsubscribe":
                p = rpc.Params(request.params, request.method)
                sub_id = p.str("sub", max_len=50)
                p.check()
                if sub_id in self._server_subs:
                    scope = self._server_subs.pop(sub_id)
                    if scope is not None:
                        scope.cancel()
                else:
                    self.feeds.unsubscribe(sub_id)
                await self.send(rpc.result_frame(request.id, {"sub": sub_id}))
            elif request.method == "thread.snapshot" and not request.is_notification:
                thread_id, turn_limit, before, children = self.app.methods.snapshot_params(rpc.Params(request.params, request.method))
                await self.feeds.reply_snapshot(request.id, thread_id, turn_limit, before, children)
            else:
                reply = await self.app.answer(request, owner=self)
                if not request.is_notification:
                    await self.feeds.send_reply(reply)
        except rpc.RpcError as exc:
            request_id = exc.request_id if request is None else request.id
            await self.send(rpc.error_frame(request_id, exc.code, exc.message, exc.data))
        except DatabaseUnavailableError as exc:
            assert request is not None
            error = _unavailable(exc)
            await self.send(rpc.error_frame(request.id, error.code, error.message, error.data))
        except T3dError as exc:
            assert request is not None
            await self.send(rpc.error_frame(request.id, rpc.INTERNAL_ERROR, str(exc)))
        finally:
            self._in_flight.release()

    async def _subscribe_server(self, request: rpc.Request) -> None:
        """``subscribe.server {memory_pressure?: bool}``: server-wide notices. Opted in, the
        reply is followed by the current ``memory_pressure`` value, then by each change."""
        p = rpc.Params(request.params, request.method)
        opted = p.opt_bool("memory_pressure", default=False)
        p.check()
        if len(self._server_subs) >= MAX_SERVER_SUBS:
            raise rpc.RpcError(rpc.INVALID_REQUEST, f"a connection may hold at most {MAX_SERVER_SUBS} server subscriptions; unsubscribe first")
        self._next_server_sub += 1
        sub_id = f"m{self._next_server_sub}"
        pressure = self.app.pressure if opted else None
        if pressure is None or self._nursery is None:
            self._server_subs[sub_id] = None
            await self.send(rpc.result_frame(request.id, {"sub": sub_id, "memory_pressure": False}))
            return
        listener = await pressure.listen()
        scope = trio.CancelScope()
        try:
            await self.send(rpc.result_frame(request.id, {"sub": sub_id, "memory_pressure": True}))
        except BaseException:
            pressure.unlisten(listener)
            raise
        self._server_subs[sub_id] = scope
        self._nursery.start_soon(self._deliver_pressure, sub_id, scope, pressure, listener)

    async def _deliver_pressure(self, sub_id: str, scope: trio.CancelScope, pressure: PressureSampler, listener: PressureListener) -> None:
        try:
            with scope:
                while True:
                    value = await listener.receive()
                    await self.send(rpc.notification_frame(sub_id, "memory_pressure", 0, value))
        finally:
            pressure.unlisten(listener)

    async def _subscribe(self, request: rpc.Request) -> None:
        p = rpc.Params(request.params, request.method)
        thread_id = p.str("thread_id", max_len=200) if request.method == "subscribe.thread" else None
        turn_limit = (  # the shell has no turns to limit: subscribe.shell refuses turn_limit
            p.opt_int("turn_limit", default=DEFAULT_TURN_LIMIT, low=1, high=MAX_TURN_LIMIT)
            if request.method == "subscribe.thread"
            else DEFAULT_TURN_LIMIT
        )
        after = p.opt_int("after_sequence", default=None, low=0, high=1 << 62)
        workspace = p.opt_bool("workspace", default=False)
        asked = isinstance(request.params, dict) and "workspace" in request.params
        p.check()
        topic: Literal["thread", "shell"] = "thread" if request.method == "subscribe.thread" else "shell"
        await self.feeds.subscribe(request.id, topic, thread_id, turn_limit, after, workspace=workspace if asked else None)

