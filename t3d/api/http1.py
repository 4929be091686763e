"""HTTP/1.1 without I/O: the App's request and response values, and their bytes.

Pure: no sockets, no trio. The transport feeds in request heads h11 has
already parsed and gets back values or bytes to send.

Rules:
- Every failure is an :class:`HttpResponse` built by :func:`error_response`:
  a JSON error that names what went wrong and what to do.
- Framing (Content-Length, Transfer-Encoding, Connection) is set here, from
  the response and the connection's state, never by the App.
- A WebSocket upgrade is checked here for everything wsproto would reject, so
  the client gets an HTTP answer rather than a silently closed stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs
import h11
import orjson

# wsproto parses the replayed upgrade request with h11's default head limit.
_WSPROTO_MAX_HEAD_BYTES = 16 * 1024


@attrs.frozen
class HttpRequest:
    method: str  # "GET"
    path: str  # percent-decoded, without the query: "/api/threads/abc"
    query: Mapping[str, str]  # first value per key
    headers: Mapping[str, str]  # lower-case name -> value; repeats joined with ", "
    body: bytes
    peer: str = ""  # the client's IP address, as the socket says ("" when unknown)


@attrs.frozen
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    # More body, sent piece by piece after ``body`` (the length covers all), so a large
    # body is never joined into one buffer and a hang-up is noticed between pieces.
    parts: tuple[bytes, ...] = ()
    # Extra headers. Framing (Content-Length, Transfer-Encoding, Connection)
    # belongs to the transport, so those names are dropped.
    headers: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class HeadCheck:
    """The App's verdict on a request head, given before any of its body is read."""

    # The request carries valid credentials. Its connection is then not shed to make
    # room while the request is served, and its body may be as large as the limit allows.
    trusted: bool = False
    # Answer this at once, read none of the body, and close the connection.
    refusal: HttpResponse | None = None
    # The answer may be long in coming (a long-poll, a heavy read): the transport watches
    # the socket meanwhile and drops the work if the peer resets. False: it comes from
    # memory, or from one small read or command, and is made unwatched.
    watch: bool = True


def error_response(status: int, code: str, message: str) -> HttpResponse:
    """The JSON error every failure is reported with."""
    return HttpResponse(status, orjson.dumps({"error": {"code": code, "message": message}}))


def parse_request(head: h11.Request) -> HttpRequest:
    """The App's view of a request head h11 has validated (its target is visible ASCII)."""
    target = urlsplit(head.target.decode("ascii"))
    query: dict[str, str] = {}
    for key, value in parse_qsl(target.query, keep_blank_values=True):
        query.setdefault(key, value)
    headers: dict[str, str] = {}
    for raw_name, raw_value in head.headers:
        name, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return HttpRequest(
        method=head.method.decode("ascii"),
        path=unquote(target.path),
        query=query,
        headers=headers,
        body=b"",
    )


def is_websocket_upgrade(request: HttpRequest) -> bool:
    headers = request.headers
    connection = {token.strip().lower() for token in headers.get("connection", "").split(",")}
    return (
        request.method == "GET"
        and "upgrade" in connection
        and "websocket" in headers.get("upgrade", "").lower()
    )


def handshake_problem(request: HttpRequest, head_size: int) -> HttpResponse | None:
    """What wsproto would reject in this upgrade request, answered before handing it over.

    Past this check the handshake belongs to trio-websocket, which closes the
    stream on a rejection without telling us.
    """
    headers = request.headers
    if head_size > _WSPROTO_MAX_HEAD_BYTES:
        return error_response(
            431,
            "header_too_large",
            f"a WebSocket upgrade request is limited to {_WSPROTO_MAX_HEAD_BYTES} bytes; "
            "send fewer or shorter headers",
        )
    if headers.get("sec-websocket-version") != "13":
        return error_response(
            426 if "sec-websocket-version" in headers else 400,
            "bad_websocket_version",
            "this server speaks WebSocket version 13; send Sec-WebSocket-Version: 13",
        )
    if not headers.get("sec-websocket-key"):
        return error_response(
            400, "bad_websocket_handshake", "the upgrade lacks Sec-WebSocket-Key; add it"
        )
    if headers.get("upgrade", "").lower() != "websocket":
        return error_response(
            400, "bad_websocket_handshake", "send exactly 'Upgrade: websocket' to open a WebSocket"
        )
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        return error_response(
            400, "bad_websocket_handshake", "a WebSocket upgrade must not have a body; drop it"
        )
    try:
        host_ok = bool(headers.get("host", "").encode("latin-1").decode("idna"))
    except UnicodeError:
        host_ok = False
    if not host_ok:
        return error_response(400, "bad_host", "send a Host header with a valid host name")
    return None


def announces_body(head: h11.Request) -> bool:
    """Does the request head announce a body (a Content-Length other than 0, or a
    Transfer-Encoding)? If not, h11 has parsed its end already."""
    return any(name == b"transfer-encoding" or (name == b"content-length" and value != b"0") for name, value in head.headers)


def declared_length(head: h11.Request) -> int | None:
    for name, value in head.headers:
        if name == b"content-length":
            return int(value)  # h11 has checked it is digits, and one value
    return None


def unsupported_version(version: bytes) -> HttpResponse:
    return error_response(
        505,
        "http_version_not_supported",
        f"this server speaks HTTP/1.1, not HTTP/{version.decode()}; "
        "connect with HTTP/1.1 (or a WebSocket upgrade)",
    )


def body_too_large(limit: int, *, trusted: bool = True) -> HttpResponse:
    if not trusted:
        return error_response(
            413,
            "body_too_large",
            f"a request without credentials may carry at most {limit} bytes of body; "
            "authenticate, or send no body",
        )
    return error_response(
        413, "body_too_large", f"the request body is over {limit} bytes; send a smaller body"
    )


def request_timeout(part: str, seconds: float) -> HttpResponse:
    """408 for a request whose ``part`` ("head", "body") did not arrive in time."""
    return error_response(
        408,
        "request_timeout",
        f"the request {part} did not arrive within {seconds:g} s of the request's start; "
        "send the whole request at once",
    )


_FRAMING_HEADERS = frozenset({"content-length", "content-type", "transfer-encoding", "connection"})


def encode_response(
    conn: h11.Connection, response: HttpResponse, *, close: bool, with_body: bool = True
) -> bytes:
    """The response's bytes; without its body (but with its length) when answering HEAD."""
    return b"".join(encode_response_pieces(conn, response, close=close, with_body=with_body))


def encode_response_pieces(
    conn: h11.Connection, response: HttpResponse, *, close: bool, with_body: bool = True
) -> list[bytes]:
    """The response's bytes in pieces to send in order: head and ``body``, then each part."""
    length = len(response.body) + sum(len(part) for part in response.parts)
    headers = [
        ("content-type", response.content_type),
        ("content-length", str(length)),
        *(
            (name, value)
            for name, value in response.headers
            if name.lower() not in _FRAMING_HEADERS
        ),
    ]
    if close:
        headers.append(("connection", "close"))
    pieces = [conn.send(h11.Response(status_code=response.status, headers=headers)) or b""]
    if response.body and with_body:
        pieces.append(conn.send(h11.Data(data=response.body)) or b"")
    if with_body:
        pieces += [conn.send(h11.Data(data=part)) or b"" for part in response.parts if part]
    pieces.append(conn.send(h11.EndOfMessage()) or b"")
    return [piece for piece in pieces if piece]
