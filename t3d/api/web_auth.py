"""Browser sign-in: one-time links, cookie sessions, and the checks a cookie request passes. Pure.

A browser never sees the daemon's token. A client that holds the token (``t3d ctl open``)
asks for a one-time link; the page at ``/auth?code=`` trades it for a session, held in an
HttpOnly cookie; the page then uses the public API (the WebSocket, mostly) with that cookie.

Rules:
- A link's code is random (24 bytes), kept only as its SHA-256, valid `LINK_TTL_S` seconds
  and once. At most `MAX_LINKS` are outstanding: one more drops the oldest.
- A session id is random (32 bytes), sent only in a ``Set-Cookie`` (HttpOnly, SameSite=Strict,
  Path=/) and kept only as its SHA-256, in memory: a restart of the daemon signs every browser
  out. A session ends after `SESSION_IDLE_S` without use (never while one of its WebSockets is
  open), on sign-out, or when `MAX_SESSIONS` are held and a new one is made (the least
  recently used goes first). Whoever holds a session is told when it ends (`attach`), so its
  live connections close with it.
- Cookies do not keep ports apart, so the cookie's name carries the daemon's port.
- A request that relies on the cookie must come from the daemon's own page
  (`browser_request_ok`): an ``Origin``, when sent, must be the origin the request is
  addressed to (scheme http, its Host), and is required on every request that can change
  something and on WebSocket upgrades; ``Sec-Fetch-Site``, when sent, must be ``same-origin``
  (or ``none``: the user typed the address). SameSite=Strict is the first line; these checks
  hold against another local port's page, which counts as the same site.
- Nothing here logs, and no code or session id leaves it but to the one who asked.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import attrs

LINK_TTL_S = 60.0
MAX_LINKS = 16
SESSION_IDLE_S = 12 * 3600.0
MAX_SESSIONS = 64
COOKIE_PREFIX = "t3d_session_"

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


@attrs.define
class _Session:
    last_used: float
    open_connections: int = 0
    on_end: list[Callable[[], None]] = attrs.Factory(list)


class WebAuth:
    """The outstanding links and the live sessions of one daemon."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        link_ttl_s: float = LINK_TTL_S,
        session_idle_s: float = SESSION_IDLE_S,
        max_links: int = MAX_LINKS,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self._clock = clock
        self.link_ttl_s = link_ttl_s
        self.session_idle_s = session_idle_s
        self._max_links = max_links
        self._max_sessions = max_sessions
        # digest -> expiry time, oldest first
        self._links: OrderedDict[bytes, float] = OrderedDict()
        # digest -> session, least recently used first
        self._sessions: OrderedDict[bytes, _Session] = OrderedDict()

    # --- links ---------------------------------------------------------------------------

    def new_link(self) -> str:
        """A fresh one-time code. Beyond `MAX_LINKS` outstanding, the oldest stops working."""
        now = self._clock()
        self._drop_expired_links(now)
        while len(self._links) >= self._max_links:
            self._links.popitem(last=False)
        code = secrets.token_urlsafe(24)
        self._links[_digest(code)] = now + self.link_ttl_s
        return code

    def redeem(self, code: str) -> str | None:
        """Trade a code for a new session id; None when the code is unknown, used or expired."""
        now = self._clock()
        self._drop_expired_links(now)
        if self._links.pop(_digest(code), None) is None:
            return None
        self._drop_idle_sessions(now)
        while len(self._sessions) >= self._max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            _ended(oldest)
        session_id = secrets.token_urlsafe(32)
        self._sessions[_digest(session_id)] = _Session(now)
        return session_id

    def _drop_expired_links(self, now: float) -> None:
        while self._links and next(iter(self._links.values())) <= now:
            self._links.popitem(last=False)

    # --- sessions ------------------------------------------------------------------------

    def valid(self, session_id: str | None) -> bool:
        """True (and the session counts as used now) when ``session_id`` names a live session."""
        if not session_id:
            return False
        now = self._clock()
        self._drop_idle_sessions(now)
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is None:
            return False
        session.last_used = now
        self._sessions.move_to_end(key)
        return True

    def attach(self, session_id: str, on_end: Callable[[], None]) -> Callable[[], None] | None:
        """Hold the session open (a WebSocket of it): it does not go idle while held, and
        ``on_end`` runs if it ends meanwhile. Returns the release function, or None when
        the session is not live."""
        if not self.valid(session_id):
            return None
        key = _digest(session_id)
        session = self._sessions[key]
        session.open_connections += 1
        session.on_end.append(on_end)

        def release() -> None:
            session.open_connections -= 1
            if on_end in session.on_end:
                session.on_end.remove(on_end)
            session.last_used = self._clock()

        return release

    def end(self, session_id: str | None) -> bool:
        """Sign out: end the session now. False when there was none."""
        if not session_id:
            return False
        session = self._sessions.pop(_digest(session_id), None)
        if session is None:
            return False
        _ended(session)
        return True

    def _drop_idle_sessions(self, now: float) -> None:
        idle = [
            key
            for key, s in self._sessions.items()
            if not s.open_connections and now - s.last_used >= self.session_idle_s
        ]
        for key in idle:
            _ended(self._sessions.pop(key))

    def statistics(self) -> dict[str, int]:
        now = self._clock()
        self._drop_expired_links(now)
        self._drop_idle_sessions(now)
        return {"links": len(self._links), "sessions": len(self._sessions)}


def _ended(session: _Session) -> None:
    for callback in list(session.on_end):
        callback()
    session.on_end.clear()


# --- cookies -------------------------------------------------------------------------------


def cookie_name(port: int) -> str:
    return f"{COOKIE_PREFIX}{port}"


def session_cookie(headers: Mapping[str, str], port: int) -> str | None:
    """The session id the request's ``Cookie`` header carries for this daemon, if any."""
    name = cookie_name(port)
    # Browsers send one Cookie header ("a=1; b=2"); repeated headers arrive joined with ", ".
    for part in headers.get("cookie", "").replace(",", ";").split(";"):
        key, eq, value = part.strip().partition("=")
        if eq and key == name and value:
            return value
    return None


def set_cookie(port: int, session_id: str) -> str:
    """The ``Set-Cookie`` value of a new session: for this host only, never sent cross-site,
    unreadable by scripts; it lasts as long as the browser keeps it, the daemon decides."""
    return f"{cookie_name(port)}={session_id}; Path=/; HttpOnly; SameSite=Strict"


def clear_cookie(port: int) -> str:
    return f"{cookie_name(port)}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"


# --- the request checks --------------------------------------------------------------------


def browser_request_ok(headers: Mapping[str, str], method: str, *, upgrade: bool = False) -> bool:
    """True when a request that carries a session cookie comes from the daemon's own page.

    ``headers`` has lower-case names. A request that can change something (any method but
    GET, HEAD, OPTIONS) and a WebSocket upgrade must carry an ``Origin`` naming the address the
    request is sent to; any request that carries one must match it; ``Sec-Fetch-Site`` must
    be ``same-origin`` or ``none`` when present.
    """
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None:
        return method.upper() in _SAFE_METHODS and not upgrade
    return same_origin(origin, headers.get("host"))


def same_origin(origin: str, host_header: str | None) -> bool:
    """True when ``origin`` is ``http://`` + the request's own ``Host``: the page that sent the
    request was served from the address the request went to."""
    if not host_header:
        return False
    try:
        parts = urlsplit(origin)
        origin_port = parts.port or 80
        target = urlsplit("//" + host_header.strip())
        target_port = target.port or 80
    except ValueError:
        return False
    if parts.scheme != "http" or parts.username is not None or parts.path or parts.query:
        return False
    return (parts.hostname or "") == (target.hostname or "") and origin_port == target_port
