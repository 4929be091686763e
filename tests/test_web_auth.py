"""Sign-in for the web page: one-time links, cookie sessions and the checks a cookie request
passes (t3d/api/web_auth.py, t3d/api/web_page.py), on a real daemon over real sockets; the
pure parts with a fake clock."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11
import orjson
import pytest
import trio
import trio_websocket
from harness import Daemon, open_client, start_daemon

from t3d.api.web_auth import (
    WebAuth,
    browser_request_ok,
    clear_cookie,
    cookie_name,
    same_origin,
    session_cookie,
    set_cookie,
)

# --- the pure core -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_link_works_once_and_only_within_its_time() -> None:
    """A code is traded for a session once; the same code again, an unknown one, or one
    redeemed after its 60 s are refused."""
    clock = Clock()
    auth = WebAuth(clock=clock)
    code = auth.new_link()
    session = auth.redeem(code)
    assert session is not None and auth.valid(session)
    assert auth.redeem(code) is None
    assert auth.redeem("not-a-code") is None
    late = auth.new_link()
    clock.now += 60.0
    assert auth.redeem(late) is None
    assert auth.statistics() == {"links": 0, "sessions": 1}


def test_links_and_sessions_are_bounded() -> None:
    """Beyond 16 outstanding links the oldest stops working; beyond 64 sessions the least
    recently used ends (and whoever holds it is told)."""
    clock = Clock()
    auth = WebAuth(clock=clock)
    codes = [auth.new_link() for _ in range(17)]
    assert auth.redeem(codes[0]) is None
    assert auth.redeem(codes[1]) is not None
    auth = WebAuth(clock=clock, max_sessions=3)
    sessions = []
    for _ in range(3):
        sessions.append(auth.redeem(auth.new_link()))
        clock.now += 1
    ended: list[str] = []
    assert auth.attach(sessions[0], lambda: ended.append("first")) is not None
    assert auth.valid(sessions[1]) and auth.valid(sessions[2])  # the first is now the least recently used
    auth.redeem(auth.new_link())
    assert ended == ["first"]
    assert not auth.valid(sessions[0])
    assert auth.valid(sessions[1]) and auth.valid(sessions[2])


def test_sessions_end_after_12_hours_unused_but_not_while_held() -> None:
    """Idle for 12 hours a session ends; one with an open connection does not, and its idle
    time counts from when the connection closes; signing out ends it at once."""
    clock = Clock()
    auth = WebAuth(clock=clock)
    idle = auth.redeem(auth.new_link())
    held = auth.redeem(auth.new_link())
    assert idle and held
    release = auth.attach(held, lambda: None)
    assert release is not None
    clock.now += 12 * 3600 - 1
    assert auth.valid(idle)
    clock.now += 12 * 3600
    assert not auth.valid(idle)
    assert auth.valid(held)
    release()
    clock.now += 12 * 3600
    assert not auth.valid(held)
    signed = auth.redeem(auth.new_link())
    assert auth.end(signed) and not auth.valid(signed) and not auth.end(signed)
    assert auth.attach("gone", lambda: None) is None


def test_cookie_helpers() -> None:
    """The cookie carries the port in its name, is HttpOnly, SameSite=Strict and Path=/, and
    is read back from a Cookie header among others."""
    assert cookie_name(3774) == "t3d_session_3774"
    assert set_cookie(3774, "abc") == "t3d_session_3774=abc; Path=/; HttpOnly; SameSite=Strict"
    assert "Max-Age=0" in clear_cookie(3774)
    headers = {"cookie": "other=1; t3d_session_9=nine; t3d_session_3774=mine"}
    assert session_cookie(headers, 3774) == "mine"
    assert session_cookie(headers, 1) is None
    assert session_cookie({}, 3774) is None


@pytest.mark.parametrize(
    ("headers", "method", "upgrade", "ok"),
    [
        ({"host": "127.0.0.1:3774"}, "GET", False, True),  # a same-origin GET sends no Origin
        ({"host": "127.0.0.1:3774"}, "POST", False, False),  # a change needs an Origin
        ({"host": "127.0.0.1:3774"}, "GET", True, False),  # so does a WebSocket upgrade
        ({"host": "127.0.0.1:3774", "origin": "http://127.0.0.1:3774"}, "POST", False, True),
        ({"host": "127.0.0.1:3774", "origin": "http://127.0.0.1:3774"}, "GET", True, True),
        ({"host": "127.0.0.1:3774", "origin": "http://127.0.0.1:8080"}, "POST", False, False),  # another port
        ({"host": "127.0.0.1:3774", "origin": "http://localhost:3774"}, "POST", False, False),
        ({"host": "127.0.0.1:3774", "origin": "https://127.0.0.1:3774"}, "POST", False, False),
        ({"host": "127.0.0.1:3774", "origin": "null"}, "POST", False, False),
        ({"host": "127.0.0.1:3774", "sec-fetch-site": "same-site"}, "GET", False, False),
        ({"host": "127.0.0.1:3774", "sec-fetch-site": "none"}, "GET", False, True),
    ],
)
def test_browser_request_checks(headers: dict[str, str], method: str, upgrade: bool, ok: bool) -> None:
    """A cookie request is the page's own only when its Origin (required for changes and
    upgrades) is the address it went to, and Sec-Fetch-Site, if sent, says same-origin."""
    assert browser_request_ok(headers, method, upgrade=upgrade) is ok


def test_same_origin_compares_scheme_host_and_port() -> None:
    """http + the Host header's name and port, with 80 for a Host without a port."""
    assert same_origin("http://[::1]:9", "[::1]:9")
    assert same_origin("http://localhost", "localhost:80")
    assert not same_origin("http://localhost:9", None)
    assert not same_origin("http://evil:9", "localhost:9")


# --- on a real daemon ----------------------------------------------------------------------


async def raw(
    daemon: Any, method: str, target: str, *, headers: list[tuple[str, str]] | None = None, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection to a daemon (anything with ``info.port``, or a port):
    (status, headers with lower-case names, body)."""
    port = daemon if isinstance(daemon, int) else daemon.info.port
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        hdrs = [("Host", f"127.0.0.1:{port}"), ("Content-Length", str(len(body))), ("Connection", "close"), *(headers or [])]
        await stream.send_all(conn.send(h11.Request(method=method, target=target, headers=hdrs)) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
        status, got, chunks = 0, {}, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                for name, value in event.headers:
                    key = name.decode()
                    got[key] = f"{got[key]}\n{value.decode()}" if key in got else value.decode()
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
        return status, got, b"".join(chunks)


def bearer(daemon: Daemon) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {daemon.token}")]


async def sign_in(daemon: Daemon) -> tuple[str, dict[str, str]]:
    """A link from the token holder, traded at /auth: the session cookie and the headers."""
    status, _, body = await raw(daemon, "POST", "/api/auth/link", headers=bearer(daemon))
    assert status == 200
    url = orjson.loads(body)["url"]
    parts = urlsplit(url)
    status, headers, _ = await raw(daemon, "GET", f"{parts.path}?{parts.query}")
    assert status == 303, headers
    cookie = headers["set-cookie"].split(";", 1)[0]
    return cookie, headers


def origin(daemon: Daemon) -> tuple[str, str]:
    return ("Origin", f"http://127.0.0.1:{daemon.info.port}")


async def test_a_link_signs_in_once_with_a_strict_httponly_cookie(tmp_path: Path, nursery: trio.Nursery) -> None:
    """POST /api/auth/link needs the token and gives a link to this daemon; the link answers
    303 to / with an HttpOnly, SameSite=Strict, Path=/ session cookie and no-referrer; used
    again it gets an HTML page (410) that says to run `t3d ctl open`."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        status, _, body = await raw(daemon, "POST", "/api/auth/link")
        assert status == 401 and b"t3d ctl open" in body
        status, headers, body = await raw(daemon, "POST", "/api/auth/link", headers=bearer(daemon))
        assert status == 200 and headers["cache-control"] == "no-store"
        link = orjson.loads(body)
        assert link["expires_in_s"] == 60
        parts = urlsplit(link["url"])
        assert (parts.scheme, parts.hostname, parts.port, parts.path) == ("http", "127.0.0.1", daemon.info.port, "/auth")
        target = f"{parts.path}?{parts.query}"
        status, headers, _ = await raw(daemon, "GET", target)
        assert status == 303 and headers["location"] == "/"
        assert headers["referrer-policy"] == "no-referrer"
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"t3d_session_{daemon.info.port}=")
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {p.strip() for p in cookie.split(";")}
        status, headers, body = await raw(daemon, "GET", target)
        assert status == 410 and headers["content-type"].startswith("text/html")
        page = body.decode()
        assert "no longer works" in page and "<code>t3d ctl open</code>" in page
        assert "signed in already" not in page
        # With the session's cookie, the same page says the browser is signed in already.
        _, _, body = await raw(daemon, "GET", target, headers=[("Cookie", cookie.split(";")[0])])
        assert "signed in already" in body.decode()
        status, _, body = await raw(daemon, "GET", "/auth")
        assert status == 400 and b"t3d ctl open" in body
        daemon.stop()


async def test_the_cookie_authenticates_the_api_only_from_the_page(tmp_path: Path, nursery: trio.Nursery) -> None:
    """With the session cookie, a GET from the page reads the API; a POST needs the page's
    own Origin (another port's page or none is refused); a cookie of no session is refused."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        cookie, _ = await sign_in(daemon)
        status, _, body = await raw(daemon, "GET", "/api/shell", headers=[("Cookie", cookie)])
        assert status == 200 and "threads" in orjson.loads(body)
        status, _, _ = await raw(daemon, "GET", "/api/shell", headers=[("Cookie", cookie), ("Sec-Fetch-Site", "same-site")])
        assert status == 401
        hello = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "server.hello"})
        status, _, _ = await raw(daemon, "POST", "/api/dispatch", headers=[("Cookie", cookie)], body=hello)
        assert status == 401
        foreign = ("Origin", f"http://127.0.0.1:{daemon.info.port + 1}")
        status, _, _ = await raw(daemon, "POST", "/api/dispatch", headers=[("Cookie", cookie), foreign], body=hello)
        assert status == 401
        status, _, body = await raw(daemon, "POST", "/api/dispatch", headers=[("Cookie", cookie), origin(daemon)], body=hello)
        assert status == 200 and orjson.loads(body)["result"]["server"] == "t3d"
        name = cookie.split("=")[0]
        status, _, _ = await raw(daemon, "GET", "/api/shell", headers=[("Cookie", f"{name}=forged")])
        assert status == 401
        status, _, body = await raw(daemon, "GET", "/api/auth/session", headers=[("Cookie", cookie)])
        assert status == 200 and orjson.loads(body)["signed_in"] is True
        daemon.stop()


@asynccontextmanager
async def open_cookie_ws(daemon: Daemon, cookie: str, origin_header: str | None) -> AsyncIterator[Any]:
    """A WebSocket with the cookie (and an Origin), on a socket the test owns (trio-websocket
    leaks its own when the handshake is refused)."""
    headers = [(b"Cookie", cookie.encode())]
    if origin_header is not None:
        headers.append((b"Origin", origin_header.encode()))
    async with await trio.open_tcp_stream("127.0.0.1", daemon.info.port) as stream, trio.open_nursery() as nursery:
        host = f"127.0.0.1:{daemon.info.port}"  # as a browser sends it
        ws = await trio_websocket.wrap_client_stream(nursery, stream, host, "/ws", extra_headers=headers)
        yield ws
        await ws.aclose()


async def refused(daemon: Daemon, cookie: str, origin_header: str | None) -> int:
    """The status a refused upgrade got."""
    rejections: list[trio_websocket.ConnectionRejected] = []
    try:
        async with open_cookie_ws(daemon, cookie, origin_header):
            pytest.fail("the upgrade was accepted")
    except* trio_websocket.ConnectionRejected as group:
        rejections.extend(group.exceptions)  # type: ignore[arg-type]
    [rejection] = rejections
    return rejection.status_code


async def test_websocket_with_the_cookie_and_sign_out(tmp_path: Path, nursery: trio.Nursery) -> None:
    """The WebSocket takes the cookie from the page's Origin (not without one, not from
    another origin); signing out ends the session, closes its WebSocket and clears the
    cookie; afterwards the cookie opens nothing."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        cookie, _ = await sign_in(daemon)
        mine = f"http://127.0.0.1:{daemon.info.port}"
        assert await refused(daemon, cookie, None) == 401
        assert await refused(daemon, cookie, f"http://localhost:{daemon.info.port + 1}") == 403
        assert await refused(daemon, cookie, f"http://localhost:{daemon.info.port}") == 401  # not where it went
        async with open_cookie_ws(daemon, cookie, mine) as ws:
            await ws.send_message(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "server.hello"}).decode())
            assert orjson.loads(await ws.get_message())["result"]["server"] == "t3d"
            status, _, _ = await raw(daemon, "POST", "/api/auth/logout", headers=[("Cookie", cookie)])
            assert status == 403  # no Origin: not the page
            status, headers, body = await raw(daemon, "POST", "/api/auth/logout", headers=[("Cookie", cookie), origin(daemon)])
            assert status == 200 and orjson.loads(body) == {"signed_out": True}
            assert "Max-Age=0" in headers["set-cookie"]
            with pytest.raises(trio_websocket.ConnectionClosed):
                await ws.get_message()
        status, _, body = await raw(daemon, "GET", "/api/auth/session", headers=[("Cookie", cookie)])
        assert status == 401 and b"t3d ctl open" in body
        assert await refused(daemon, cookie, mine) == 401
        # Token clients are untouched by all this.
        async with open_client(daemon) as client:
            assert (await client.call("server.hello"))["server"] == "t3d"
        daemon.stop()


async def test_no_code_or_cookie_in_the_log(tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    """Through a whole sign-in, use and sign-out at debug level, neither the code nor the
    session id appears in any log record."""
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", log_level="debug")
        _, _, body = await raw(daemon, "POST", "/api/auth/link", headers=bearer(daemon))
        code = urlsplit(orjson.loads(body)["url"]).query.removeprefix("code=")
        _, headers, _ = await raw(daemon, "GET", f"/auth?code={code}")
        cookie = headers["set-cookie"].split(";", 1)[0]
        session = cookie.split("=", 1)[1]
        await raw(daemon, "GET", f"/auth?code={code}")
        await raw(daemon, "GET", "/api/shell", headers=[("Cookie", cookie)])
        async with open_cookie_ws(daemon, cookie, f"http://127.0.0.1:{daemon.info.port}") as ws:
            await ws.send_message("not json")
            await ws.get_message()
        await raw(daemon, "POST", "/api/auth/logout", headers=[("Cookie", cookie), origin(daemon)])
        daemon.stop()
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert caplog.records  # the daemon did log, at debug level
    assert code not in text and session not in text


async def test_the_page_is_served_with_a_strict_policy(tmp_path: Path, nursery: trio.Nursery) -> None:
    """/ and /static/ serve the packaged files without the token, each with its type, a
    Content-Security-Policy of the daemon's own scripts, styles and connections, nosniff and
    no-referrer; an unchanged file answers 304 to its ETag; nothing outside the files is
    served, and unknown query parameters are refused."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        status, headers, body = await raw(daemon, "GET", "/")
        assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
        assert b'<script type="module" src="/static/js/main.js">' in body
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
        status, headers, body = await raw(daemon, "GET", "/static/js/main.js")
        assert status == 200 and headers["content-type"] == "text/javascript; charset=utf-8"
        status, again, _ = await raw(daemon, "GET", "/static/js/main.js", headers=[("If-None-Match", headers["etag"])])
        assert status == 304 and again["etag"] == headers["etag"]
        status, headers, _ = await raw(daemon, "HEAD", "/static/app.css")
        assert status == 200 and headers["content-type"] == "text/css; charset=utf-8"
        for missing in ("/static/../api/app.py", "/static/%2e%2e/__init__.py", "/static/nothing.js", "/static/"):
            status, _, _ = await raw(daemon, "GET", missing)
            assert status == 404, missing
        status, _, _ = await raw(daemon, "GET", "/?x=1")
        assert status == 400
        status, headers, _ = await raw(daemon, "POST", "/")
        assert status == 405 and headers["allow"] == "GET, HEAD"
        daemon.stop()
