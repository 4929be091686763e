"""The API application: HTTP routes, and WebSocket connections with subscriptions.

Rules:
- Everything but ``GET /api/health`` needs ``Authorization: Bearer <token>``.
  WebSocket upgrades are accepted only on ``/ws``, with the token, and from no
  Origin or a loopback one.
- On a WebSocket each request runs in its own task (at most
  `MAX_IN_FLIGHT` per connection; beyond that the connection stops reading).
  A bad frame gets an error reply; the connection stays up.
- Subscriptions: join the hub first, then read the snapshot, reply, send the
  snapshot, and only then deliver live frames newer than it. Nothing falls
  between snapshot and live, nothing is sent twice. One sender task per
  connection drains its subscriptions; an overflowed subscription gets
  ``resync`` and a fresh snapshot.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import orjson
import trio
import trio_websocket

import t3d
from t3d.api import jsonrpc as rpc
from t3d.api.auth import bearer_ok, origin_allowed
from t3d.api.methods import Methods
from t3d.api.transport import HttpRequest, HttpResponse
from t3d.errors import SpawnerError, T3dError
from t3d.live.hub import Hub, Subscription
from t3d.spawn.child import Spawner
from t3d.store.queries import MAX_TURN_LIMIT

log = logging.getLogger("t3d.api")

MAX_IN_FLIGHT = 32
MAX_SUBSCRIPTIONS = 256

_THREAD_PATH = re.compile(r"^/api/threads/([^/]+)$")
_RESPOND_PATH = re.compile(r"^/api/requests/([^/]+)/respond$")


def _json(status: int, value: Any) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(value))


def _error(status: int, code: str, message: str) -> HttpResponse:
    return _json(status, {"error": {"code": code, "message": message}})


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
    ) -> None:
        self.methods = methods
        self._spawner = spawner
        self.hub = hub
        self._token = token
        self._health = health
        self._bound = bound

    # --- HTTP ----------------------------------------------------------------------

    async def handle_http(self, request: HttpRequest) -> HttpResponse:
        if request.path == "/api/health" and request.method == "GET":
            return _json(200, self._health())
        if not bearer_ok(request.headers, self._token):
            return _error(401, "unauthorized", "missing or wrong bearer token; send 'Authorization: Bearer <token>' with the token from <state-dir>/auth/token")
        try:
            return await self._route(request)
        except rpc.RpcError as exc:
            return _json(_rpc_status(exc), {"error": {"code": exc.code, "message": exc.message, "data": exc.data}})

    async def _route(self, r: HttpRequest) -> HttpResponse:
        if r.method == "GET" and r.path == "/api/shell":
            return _json(200, await self.methods.store_shell())
        if r.method == "GET" and (m := _THREAD_PATH.match(r.path)):
            params = rpc.Params({"thread_id": m.group(1), **_int_query(r.query, ("turn_limit", "before"))})
            return _json(200, await self.methods.thread_snapshot(params))
        if r.method == "GET" and r.path == "/api/requests/pending":
            return _json(200, await self.methods.call("requests.pending", {"thread_id": r.query.get("thread_id")}))
        if r.method == "POST" and (m := _RESPOND_PATH.match(r.path)):
            body = _body_object(r.body)
            return _json(200, await self.methods.call("request.respond", {**body, "request_id": m.group(1)}))
        if r.method == "GET" and r.path == "/api/spawner":
            try:
                return _json(200, await self._spawner.describe())
            except SpawnerError as exc:
                return _error(503, "spawner_unavailable", str(exc))
        if r.method == "POST" and r.path == "/api/dispatch":
            return HttpResponse(200, await self._dispatch_frame(r.body))
        return _error(404, "not_found", f"no route for {r.method} {r.path}; see the README for the HTTP API")

    async def _dispatch_frame(self, frame: bytes) -> bytes:
        try:
            request = rpc.parse_request(frame)
        except rpc.RpcError as exc:
            return rpc.error_frame(exc.request_id, exc.code, exc.message, exc.data)
        if request.method.startswith(("subscribe.", "unsubscribe")):
            return rpc.error_frame(request.id, rpc.INVALID_REQUEST, f"{request.method} needs a WebSocket; connect to /ws")
        return await self.answer(request)

    async def answer(self, request: rpc.Request) -> bytes:
        try:
            result = await self.methods.call(request.method, request.params)
        except rpc.RpcError as exc:
            return rpc.error_frame(request.id, exc.code, exc.message, exc.data)
        except T3dError as exc:
            return rpc.error_frame(request.id, rpc.INTERNAL_ERROR, str(exc))
        return rpc.result_frame(request.id, result)

    # --- WebSocket ------------------------------------------------------------------

    def check_websocket(self, request: HttpRequest) -> HttpResponse | None:
        if request.path != "/ws":
            return _error(404, "not_found", "WebSocket connections are served on /ws")
        host, port = self._bound()
        if not origin_allowed(request.headers.get("origin"), host, port):
            return _error(403, "forbidden_origin", "WebSocket upgrades from a foreign Origin are refused; connect from a loopback page or a non-browser client")
        if not bearer_ok(request.headers, self._token):
            return _error(401, "unauthorized", "missing or wrong bearer token; send 'Authorization: Bearer <token>' with the token from <state-dir>/auth/token")
        return None

    async def handle_websocket(self, ws: trio_websocket.WebSocketConnection, request: HttpRequest) -> None:
        await WsConnection(self, ws).run()


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
    def __init__(self, app: ApiApp, ws: trio_websocket.WebSocketConnection) -> None:
        self.app = app
        self.ws = ws
        self.subs: dict[str, Subscription] = {}
        self._next_sub = 0
        self._wake = trio.Event()
        self._in_flight = trio.Semaphore(MAX_IN_FLIGHT)

    def wake(self) -> None:
        self._wake.set()

    async def send(self, frame: bytes) -> None:
        await self.ws.send_message(frame.decode())

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_sender)
                while True:
                    message = await self.ws.get_message()
                    await self._in_flight.acquire()
                    nursery.start_soon(self._handle, message)
        finally:
            for sub in self.subs.values():
                self.app.hub.unsubscribe(sub)
            self.subs.clear()

    async def _handle(self, message: str | bytes) -> None:
        try:
            try:
                request = rpc.parse_request(message)
            except rpc.RpcError as exc:
                await self.send(rpc.error_frame(exc.request_id, exc.code, exc.message, exc.data))
                return
            if request.method in ("subscribe.thread", "subscribe.shell"):
                await self._subscribe(request)
            elif request.method == "unsubscribe":
                await self._unsubscribe(request)
            else:
                reply = await self.app.answer(request)
                if not request.is_notification:
                    await self.send(reply)
        finally:
            self._in_flight.release()

    # --- subscriptions ------------------------------------------------------------------

    async def _subscribe(self, request: rpc.Request) -> None:
        p = rpc.Params(request.params)
        thread_id = p.str("thread_id", max_len=200) if request.method == "subscribe.thread" else None
        turn_limit = p.opt_int("turn_limit", default=10, low=1, high=MAX_TURN_LIMIT)
        p.opt_int("after_sequence", default=None, low=0, high=1 << 62)
        try:
            p.check()
            if len(self.subs) >= MAX_SUBSCRIPTIONS:
                raise rpc.RpcError(rpc.INVALID_REQUEST, f"a connection may hold at most {MAX_SUBSCRIPTIONS} subscriptions; unsubscribe first")
            self._next_sub += 1
            sub = Subscription(f"s{self._next_sub}", "thread" if thread_id else "shell", thread_id, self.wake, turn_limit=turn_limit)
            self.app.hub.subscribe(sub)  # join first, then read: nothing falls in between
            self.subs[sub.sub_id] = sub
            try:
                snapshot = await self._read_snapshot(sub)
            except BaseException:
                self.app.hub.unsubscribe(sub)
                del self.subs[sub.sub_id]
                raise
        except rpc.RpcError as exc:
            await self.send(rpc.error_frame(request.id, exc.code, exc.message, exc.data))
            return
        await self.send(rpc.result_frame(request.id, {"sub": sub.sub_id, "sequence": snapshot["sequence"]}))
        await self._send_snapshot(sub, snapshot)

    async def _read_snapshot(self, sub: Subscription) -> dict[str, Any]:
        if sub.thread_id is None:
            return await self.app.methods.store_shell()
        return await self.app.methods.snapshot(sub.thread_id, sub.turn_limit, None)

    async def _send_snapshot(self, sub: Subscription, snapshot: dict[str, Any]) -> None:
        seq = snapshot["sequence"]
        await self.send(rpc.notification_frame(sub.sub_id, "snapshot.chunk", seq, orjson.dumps(snapshot)))
        await self.send(rpc.notification_frame(sub.sub_id, "snapshot.end", seq, b'{"sequence":%d}' % seq))
        sub.base_seq = seq
        sub.live = True
        self.wake()

    async def _unsubscribe(self, request: rpc.Request) -> None:
        p = rpc.Params(request.params)
        sub_id = p.str("sub", max_len=50)
        try:
            p.check()
            sub = self.subs.pop(sub_id, None)
            if sub is None:
                raise rpc.RpcError(rpc.NOT_FOUND, f"no subscription {sub_id!r} on this connection")
        except rpc.RpcError as exc:
            await self.send(rpc.error_frame(request.id, exc.code, exc.message, exc.data))
            return
        self.app.hub.unsubscribe(sub)
        await self.send(rpc.result_frame(request.id, {"sub": sub_id}))

    async def _run_sender(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            for sub in list(self.subs.values()):
                if not sub.live:
                    continue
                if sub.needs_resync:
                    await self._resync(sub)
                    continue
                for seq, data in sub.take():
                    if seq > sub.base_seq:
                        await self.send(rpc.notification_frame(sub.sub_id, "event", seq, data))

    async def _resync(self, sub: Subscription) -> None:
        sub.live = False
        sub.needs_resync = False
        sub.take()
        await self.send(rpc.notification_frame(sub.sub_id, "resync", sub.base_seq, b'{"reason":"overflow"}'))
        try:
            snapshot = await self._read_snapshot(sub)
        except rpc.RpcError:  # the thread is gone: say so, and the subscription ends
            self.app.hub.unsubscribe(sub)
            self.subs.pop(sub.sub_id, None)
            gone = orjson.dumps({"kind": "thread.deleted", "sequence": None, "entity": {"id": sub.thread_id}})
            await self.send(rpc.notification_frame(sub.sub_id, "event", sub.base_seq, gone))
            return
        await self._send_snapshot(sub, snapshot)


def health_payload(started: float, extra: dict[str, Any]) -> dict[str, Any]:
    return {"status": "ok", "version": t3d.__version__, "uptime_s": round(time.monotonic() - started, 3), **extra}
