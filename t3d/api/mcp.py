"""MCP (the Model Context Protocol) on ``/mcp``, over its streamable HTTP transport.

Written by hand on the daemon's own transport, not with the official ``mcp`` SDK's server:
that server is an ASGI (Starlette) application, and the daemon speaks HTTP through its own
h11 transport (t3d/api/transport.py), which already gives every request its bounds, its
cancellation when the client hangs up, and its supervision. Bridging ASGI would bring
Starlette, pydantic and the SDK's task machinery into the daemon for what is here a small,
fixed part of MCP: JSON-RPC over POST answered with ``application/json``, tools only, no
sessions. The tests drive this module with the SDK's own client, in both eras.

What it speaks (dual-era, as the 2026-07-28 specification's versioning page allows):

- Modern, ``2026-07-28``: every request carries ``_meta`` with
  ``io.modelcontextprotocol/protocolVersion`` and ``.../clientCapabilities`` (else -32602),
  and the ``MCP-Protocol-Version``, ``Mcp-Method`` and (``tools/call``) ``Mcp-Name`` headers
  must match the body (else -32020 HeaderMismatch); an unsupported version gets -32022 with
  ``supported``. Methods: ``server/discover``, ``tools/list``, ``tools/call``. Results carry
  ``resultType`` and the server's identity in ``_meta``; cacheable ones ``ttlMs`` and
  ``cacheScope``. JSON-RPC errors get the HTTP status the transport page assigns (400; 404
  for an unknown method).
- Legacy, ``2025-06-18`` and ``2025-11-25`` (chosen when the ``MCP-Protocol-Version``
  header names one of them or is absent, as the ``initialize`` request's is): ``initialize``
  with version negotiation (an unknown version is answered with ``2025-11-25``),
  ``notifications/initialized``, ``ping``, ``tools/list``, ``tools/call``; errors of a
  well-formed request come back with HTTP 200. No session is issued (the transport makes
  sessions optional), so an ``Mcp-Session-Id`` a client sends is ignored; and a
  ``notifications/cancelled`` cannot be matched to a request of another POST, so a
  ``wait_for_request`` it names ends at its ``timeout_s`` or when its connection closes.
- Both: one JSON-RPC message per POST (batches were removed in 2025-06-18: 400); a
  notification or a client's response gets 202 and no body (modern: a response is refused);
  GET gets 405 (no SSE stream is offered) and DELETE 405 (no session to end). A foreign
  ``Origin`` gets 403 and a missing or wrong bearer token 401, before anything else.

Pure but for `McpServer.handle`, which awaits the tool call; the tools are in mcp_tools.py.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import orjson

import t3d
from t3d.api.http1 import HttpRequest, HttpResponse

MODERN_VERSIONS = ("2026-07-28",)
LEGACY_VERSIONS = ("2025-06-18", "2025-11-25")
SUPPORTED_VERSIONS = (*LEGACY_VERSIONS, *MODERN_VERSIONS)
LATEST_LEGACY = LEGACY_VERSIONS[-1]

VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022
_STATUS = {PARSE_ERROR: 400, INVALID_REQUEST: 400, INVALID_PARAMS: 400, HEADER_MISMATCH: 400, UNSUPPORTED_VERSION: 400, METHOD_NOT_FOUND: 404}

# How long a client may cache what never changes while this daemon runs.
CACHE_TTL_MS = 300_000

INSTRUCTIONS = (
    "t3d runs and supervises coding-agent sessions (threads of turns). Look with list_threads "
    "and get_thread; start work with delegate_task or start_turn and follow it with task_status; "
    "answer the permission prompts agents raise with wait_for_request (a long-poll: pass back "
    "its cursor as after) and respond_to_request."
)

RequestId = str | int


class Tools(Protocol):
    """What the server calls for ``tools/list`` and ``tools/call`` (mcp_tools.McpTools)."""

    def listing(self) -> list[dict[str, Any]]: ...

    def has(self, name: str) -> bool: ...

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The tool's result: ``content``, ``structuredContent``, ``isError``."""
        ...


@attrs.frozen
class Call:
    """A request that passed every check: what to answer, and in which era."""

    request_id: RequestId
    method: str
    params: dict[str, Any]
    modern: bool


class McpError(Exception):
    """A JSON-RPC error to send for the request (``request_id`` None: it could not be read)."""

    def __init__(self, code: int, message: str, data: Any = None, request_id: RequestId | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data, self.request_id = code, message, data, request_id


def server_info() -> dict[str, str]:
    return {"name": "t3d", "version": t3d.__version__}


class McpServer:
    def __init__(self, tools: Tools) -> None:
        self.tools = tools

    async def handle(self, request: HttpRequest, *, origin_ok: bool, token_ok: bool) -> HttpResponse:
        refusal = refuse(request, origin_ok=origin_ok, token_ok=token_ok)
        if refusal is not None:
            return refusal
        try:
            step = receive(request)
        except McpError as exc:
            return error_response(exc, modern=True)  # a body that cannot be served: 400
        if not isinstance(step, Call):
            return step
        try:
            if step.method == "tools/call":
                name, arguments = tool_call_params(step, self.tools)
                result = await self.tools.call(name, arguments)
            else:
                result = answer(step, self.tools)
        except McpError as exc:
            return error_response(exc, modern=step.modern)
        return result_response(step, result)


# --- the pure core -------------------------------------------------------------------------


def refuse(request: HttpRequest, *, origin_ok: bool, token_ok: bool) -> HttpResponse | None:
    """403, 401 or 405 before the body is looked at; None: go on."""
    if not origin_ok:
        return _error_body(403, INVALID_REQUEST, "requests from a foreign Origin are refused; call /mcp from a loopback page or a non-browser client")
    if not token_ok:
        response = _error_body(401, INVALID_REQUEST, "missing or wrong bearer token; send 'Authorization: Bearer <token>' with the token from <state-dir>/auth/token")
        return attrs.evolve(response, headers=(("www-authenticate", 'Bearer realm="t3d"'),))
    if request.method == "GET":
        return _not_allowed("this server offers no SSE stream on GET; POST each JSON-RPC message to /mcp")
    if request.method == "DELETE":
        return _not_allowed("this server issues no sessions, so there is none to end; POST JSON-RPC messages to /mcp")
    if request.method != "POST":
        return _not_allowed(f"{request.method} is not served on /mcp; POST JSON-RPC messages to it")
    if not _accepts_json(request.headers.get("accept")):
        return _error_body(406, INVALID_REQUEST, "this server answers with application/json; send 'Accept: application/json, text/event-stream'")
    return None


def receive(request: HttpRequest) -> Call | HttpResponse:
    """A POST's body as a checked `Call`, or the response it gets without one (202 for a
    notification). Raises `McpError` for a message that cannot be served."""
    try:
        message = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise McpError(PARSE_ERROR, f"the body is not valid JSON ({exc}); send one JSON-RPC 2.0 message") from None
    if isinstance(message, list):
        raise McpError(INVALID_REQUEST, "JSON-RPC batches are not supported (MCP removed them in 2025-06-18); send one message per POST")
    if not isinstance(message, dict):
        raise McpError(INVALID_REQUEST, "the body must be one JSON-RPC 2.0 request or notification object")
    version = request.headers.get("mcp-protocol-version")
    modern = version not in (None, *LEGACY_VERSIONS) or (version is None and _meta_version(message) is not None)
    if "method" not in message:
        if "id" in message and ("result" in message or "error" in message) and not modern:
            return HttpResponse(202)  # a response to a request this server never sends: dropped
        raise McpError(INVALID_REQUEST, "the body must be a JSON-RPC request or notification (with a method); clients send no responses here")
    if "id" not in message:
        if modern and version is not None and version not in MODERN_VERSIONS:
            raise _unsupported(version)
        return HttpResponse(202)  # notifications/initialized, notifications/cancelled...: nothing to do
    request_id = message["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
        raise McpError(INVALID_REQUEST, "id must be a string or an integer")
    method, params = message.get("method"), message.get("params", {})
    if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
        raise McpError(INVALID_REQUEST, 'the request needs "jsonrpc": "2.0" and a "method" string', request_id=request_id)
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise McpError(INVALID_PARAMS, "params must be an object", request_id=request_id)
    if modern:
        _check_modern(request.headers, method, params, request_id)
    return Call(request_id, method, params, modern)


def _check_modern(headers: Mapping[str, str], method: str, params: dict[str, Any], request_id: RequestId) -> None:
    """The per-request envelope of 2026-07-28: ``_meta`` fields, then headers, then version."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or VERSION_KEY not in meta or CAPABILITIES_KEY not in meta:
        raise McpError(INVALID_PARAMS, f"params._meta must carry {VERSION_KEY!r} and {CAPABILITIES_KEY!r} (every 2026-07-28 request does)", request_id=request_id)
    version = meta[VERSION_KEY]
    if headers.get("mcp-protocol-version") != version:
        raise McpError(HEADER_MISMATCH, "the MCP-Protocol-Version header is missing or does not match params._meta's protocol version; send the same version in both", request_id=request_id)
    if headers.get("mcp-method") != method:
        raise McpError(HEADER_MISMATCH, f"the Mcp-Method header is missing or does not match the method {method!r}; send Mcp-Method: {method}", request_id=request_id)
    if method == "tools/call" and params.get("name") is not None and decode_header_value(headers.get("mcp-name")) != params.get("name"):
        raise McpError(HEADER_MISMATCH, "the Mcp-Name header is missing or does not match params.name; send the tool's name in it", request_id=request_id)
    if not isinstance(version, str):
        raise McpError(INVALID_PARAMS, "the protocol version in params._meta must be a string", request_id=request_id)
    if version not in MODERN_VERSIONS:
        raise _unsupported(version, request_id)


def _unsupported(version: Any, request_id: RequestId | None = None) -> McpError:
    return McpError(
        UNSUPPORTED_VERSION,
        f"protocol version {version!r} is not supported; this server speaks {', '.join(SUPPORTED_VERSIONS)} "
        f"({', '.join(LEGACY_VERSIONS)} through initialize)",
        {"supported": list(SUPPORTED_VERSIONS), "requested": version if isinstance(version, str) else str(version)},
        request_id,
    )


def answer(call: Call, tools: Tools) -> dict[str, Any]:
    """The result of every method but ``tools/call``."""
    capabilities = {"tools": {"listChanged": False}}
    if call.modern and call.method == "server/discover":
        return {"supportedVersions": list(SUPPORTED_VERSIONS), "capabilities": capabilities, "instructions": INSTRUCTIONS, "ttlMs": CACHE_TTL_MS, "cacheScope": "private"}
    if call.method == "tools/list":
        if call.params.get("cursor") is not None:
            raise McpError(INVALID_PARAMS, "this cursor was not issued by this server: tools/list returns every tool in one page", request_id=call.request_id)
        listing: dict[str, Any] = {"tools": tools.listing()}
        if call.modern:
            listing.update(ttlMs=CACHE_TTL_MS, cacheScope="private")
        return listing
    if not call.modern and call.method == "initialize":
        requested = call.params.get("protocolVersion")
        if not isinstance(requested, str):
            raise McpError(INVALID_PARAMS, "initialize needs params.protocolVersion, a string such as '2025-11-25'", request_id=call.request_id)
        version = requested if requested in LEGACY_VERSIONS else LATEST_LEGACY
        return {"protocolVersion": version, "capabilities": capabilities, "serverInfo": server_info(), "instructions": INSTRUCTIONS}
    if not call.modern and call.method == "ping":
        return {}
    offered = "server/discover, tools/list and tools/call" if call.modern else "initialize, ping, tools/list and tools/call"
    raise McpError(METHOD_NOT_FOUND, f"method {call.method!r} is not offered; this server answers {offered}", request_id=call.request_id)


def tool_call_params(call: Call, tools: Tools) -> tuple[str, dict[str, Any]]:
    name, arguments = call.params.get("name"), call.params.get("arguments")
    if not isinstance(name, str) or not tools.has(name):
        raise McpError(INVALID_PARAMS, f"unknown tool {name!r}; tools/list names the tools", request_id=call.request_id)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise McpError(INVALID_PARAMS, "arguments must be an object", request_id=call.request_id)
    return name, arguments


def result_response(call: Call, result: dict[str, Any]) -> HttpResponse:
    if call.modern:
        result = {"resultType": "complete", **result, "_meta": {SERVER_INFO_KEY: server_info()}}
    return HttpResponse(200, orjson.dumps({"jsonrpc": "2.0", "id": call.request_id, "result": result}))


def error_response(exc: McpError, *, modern: bool) -> HttpResponse:
    status = _STATUS.get(exc.code, 500) if modern or exc.request_id is None else 200
    return _error_body(status, exc.code, exc.message, exc.data, exc.request_id)


def _error_body(status: int, code: int, message: str, data: Any = None, request_id: RequestId | None = None) -> HttpResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return HttpResponse(status, orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}))


def _not_allowed(message: str) -> HttpResponse:
    return attrs.evolve(_error_body(405, INVALID_REQUEST, message), headers=(("allow", "POST"),))


def _accepts_json(accept: str | None) -> bool:
    """No Accept header, or one that takes application/json (``*/*``, ``application/*``)."""
    if accept is None:
        return True
    types = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return bool(types & {"application/json", "application/*", "*/*"})


def _meta_version(message: dict[str, Any]) -> Any:
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(VERSION_KEY) if isinstance(meta, dict) else None


def decode_header_value(value: str | None) -> str | None:
    """A header value, its ``=?base64?...?=`` form decoded (None if malformed)."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
