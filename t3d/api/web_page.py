"""The web page's routes: its static files, sign-in by one-time link, sign-out.

Routes (each answered here; everything else falls through to the API's own routes):
- ``GET /`` and ``GET /static/<file>``: the page (t3d/web/static), public: it holds no data;
  what it shows comes through the API with the session cookie.
- ``GET /auth?code=``: trades a one-time link for a session cookie and redirects to ``/``, so
  the code leaves the address bar; a used, expired or unknown code gets a page saying to run
  ``t3d ctl open``.
- ``POST /api/auth/link`` (bearer token only): a new one-time link, ``{url, expires_in_s}``.
- ``GET /api/auth/session``: 200 while the request's cookie names a live session, else 401.
- ``POST /api/auth/logout``: ends the cookie's session (its WebSockets close) and clears it.

Every answer here says ``Referrer-Policy: no-referrer`` and ``X-Content-Type-Options:
nosniff``; pages add a Content-Security-Policy that allows only the daemon's own scripts,
styles and connections, and no framing. The code, the cookie and the token are never logged.
"""

from __future__ import annotations

import html
import ipaddress
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import orjson
import trio

from t3d.api.auth import bearer_ok
from t3d.api.transport import HttpRequest, HttpResponse
from t3d.api.web_auth import (
    WebAuth,
    browser_request_ok,
    clear_cookie,
    session_cookie,
    set_cookie,
)
from t3d.web import StaticFiles, load_static

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_COMMON = (
    ("referrer-policy", "no-referrer"),
    ("x-content-type-options", "nosniff"),
)
_PAGE = (*_COMMON, ("content-security-policy", CSP), ("x-frame-options", "DENY"))
_NO_STORE = (("cache-control", "no-store"),)
_HTML = "text/html; charset=utf-8"
OPEN_HINT = "run `t3d ctl open` in a terminal on this machine for a new sign-in link"


class WebPage:
    def __init__(self, token: str, bound: Callable[[], tuple[str, int]], auth: WebAuth | None = None) -> None:
        self.auth = auth or WebAuth()
        self._token = token
        self._bound = bound
        self._static: StaticFiles | None = None

    # --- what the rest of the API asks ---------------------------------------------------

    def session_ok(self, request: HttpRequest, *, upgrade: bool = False) -> bool:
        """True when the request carries a live session cookie and comes from the page."""
        cookie = session_cookie(request.headers, self._bound()[1])
        if cookie is None or not browser_request_ok(request.headers, request.method, upgrade=upgrade):
            return False
        return self.auth.valid(cookie)

    @contextmanager
    def held(self, request: HttpRequest) -> Iterator[None]:
        """Around a WebSocket connection: one that signed in with the cookie (not the token) is
        cancelled when its session ends, and keeps the session from going idle meanwhile."""
        with trio.CancelScope() as scope:
            release = None
            cookie = session_cookie(request.headers, self._bound()[1])
            if cookie is not None and not bearer_ok(request.headers, self._token):
                release = self.auth.attach(cookie, scope.cancel)
            try:
                yield
            finally:
                if release is not None:
                    release()

    def sign_in_url(self) -> str:
        """A new one-time link (for the banner of `t3d serve` on a terminal)."""
        return self._url(self.auth.new_link())

    def _url(self, code: str) -> str:
        host, port = self._bound()
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is not None and address.is_unspecified:
            host = "::1" if address.version == 6 else "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/auth?code={code}"

    # --- routes --------------------------------------------------------------------------

    async def handle(self, r: HttpRequest) -> HttpResponse | None:
        """The answer to a page route, or None when ``r`` is not one."""
        get = r.method in ("GET", "HEAD")
        if r.path == "/" or r.path.startswith("/static/"):
            if not get:
                return _not_allowed("GET, HEAD")
            return await self._static_file(r)
        if r.path == "/auth":
            if r.method == "HEAD":  # asks nothing of the link: a HEAD must not use it up
                return HttpResponse(200, b"", content_type=_HTML, headers=(*_PAGE, *_NO_STORE))
            return self._redeem(r) if get else _not_allowed("GET, HEAD")
        if r.path == "/api/auth/link":
            return self._new_link(r) if r.method == "POST" else _not_allowed("POST")
        if r.path == "/api/auth/session":
            return self._session(r) if get else _not_allowed("GET, HEAD")
        if r.path == "/api/auth/logout":
            return self._logout(r) if r.method == "POST" else _not_allowed("POST")
        return None

    async def _static_file(self, r: HttpRequest) -> HttpResponse:
        if r.query:
            return _html(400, "Unknown query", f"{r.path} takes no query parameters; open {r.path} without them.")
        if self._static is None:  # read once, off the loop
            self._static = await trio.to_thread.run_sync(load_static)
        name = "index.html" if r.path == "/" else r.path.removeprefix("/static/")
        found = self._static.get(name)
        if found is None:
            return _html(404, "Not found", f"there is no file {r.path} in the page; open / instead.")
        headers = (*_PAGE, ("cache-control", "no-cache"), ("etag", found.etag))
        if r.headers.get("if-none-match") == found.etag:
            return HttpResponse(304, b"", content_type=found.content_type, headers=headers)
        return HttpResponse(200, found.body, content_type=found.content_type, headers=headers)

    def _redeem(self, r: HttpRequest) -> HttpResponse:
        unknown = sorted(set(r.query) - {"code"})
        code = r.query.get("code")
        if unknown or not code:
            return _html(400, "Not a sign-in link", f"a sign-in link looks like /auth?code=...; {OPEN_HINT}.")
        purpose = r.headers.get("sec-purpose", "") + r.headers.get("purpose", "")
        if "prefetch" in purpose:  # a browser guessing ahead must not use up the link
            return HttpResponse(503, b"", content_type=_HTML, headers=(*_PAGE, *_NO_STORE))
        session_id = self.auth.redeem(code)
        port = self._bound()[1]
        if session_id is None:
            signed_in = self.session_ok(r)
            more = ' You are signed in already in this browser: <a href="/">open the page</a>.' if signed_in else ""
            return _html(
                410,
                "This sign-in link no longer works",
                f"A sign-in link works once, within {self.auth.link_ttl_s:g} seconds, and this one "
                f"has been used or has expired. To sign in, {OPEN_HINT}.",
                raw_extra=more,
            )
        headers = (*_PAGE, *_NO_STORE, ("location", "/"), ("set-cookie", set_cookie(port, session_id)))
        return HttpResponse(303, b"signed in; continue at /\n", content_type="text/plain; charset=utf-8", headers=headers)

    def _new_link(self, r: HttpRequest) -> HttpResponse:
        if not bearer_ok(r.headers, self._token):
            return _json(
                401,
                {"error": {"code": "unauthorized", "message": "a sign-in link is made only for the token's holder; send 'Authorization: Bearer <token>' (t3d ctl open does)"}},
            )
        url = self._url(self.auth.new_link())
        return _json(200, {"url": url, "expires_in_s": self.auth.link_ttl_s})

    def _session(self, r: HttpRequest) -> HttpResponse:
        if r.query:
            return _json(400, {"error": {"code": "invalid_params", "message": "/api/auth/session takes no query parameters"}})
        if not self.session_ok(r):
            return _json(401, {"error": {"code": "unauthorized", "message": f"not signed in; {OPEN_HINT}"}})
        return _json(200, {"signed_in": True, "idle_timeout_s": self.auth.session_idle_s})

    def _logout(self, r: HttpRequest) -> HttpResponse:
        port = self._bound()[1]
        if not browser_request_ok(r.headers, r.method):
            return _json(403, {"error": {"code": "forbidden_origin", "message": "sign out from the page itself (the request's Origin must be the page's)"}})
        ended = self.auth.end(session_cookie(r.headers, port))
        return _json(200, {"signed_out": ended}, extra=(("set-cookie", clear_cookie(port)),))


def _json(status: int, value: object, *, extra: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(value), headers=(*_COMMON, *_NO_STORE, *extra))


def _not_allowed(allow: str) -> HttpResponse:
    body = {"error": {"code": "method_not_allowed", "message": f"this path takes {allow}"}}
    return HttpResponse(405, orjson.dumps(body), headers=(*_COMMON, ("allow", allow)))


def _html(status: int, title: str, text: str, *, raw_extra: str = "") -> HttpResponse:
    """A small page of its own (the page's stylesheet, no script): what went wrong, what to do."""
    body = (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)} · t3d</title>"
        '<link rel="stylesheet" href="/static/app.css"><link rel="icon" href="data:,"></head>'
        f'<body class="notice-page"><main><h1>{html.escape(title)}</h1>'
        f"<p>{_code_spans(html.escape(text))}{raw_extra}</p></main></body></html>"
    )
    return HttpResponse(status, body.encode(), content_type=_HTML, headers=(*_PAGE, *_NO_STORE))


def _code_spans(text: str) -> str:
    """`like this` (already escaped) as <code>."""
    parts = text.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
