"""``/mcp``: the Model Context Protocol over streamable HTTP (t3d/api/mcp.py, mcp_tools.py).

The transport's rules are pinned with raw HTTP against the API served in-process; the
tools with the official ``mcp`` SDK's streamable HTTP client (both eras: the 2026-07-28
per-request envelope it probes for first, and the 2025-11-25 ``initialize`` handshake)
against a real daemon whose replay agent asks a real permission prompt. Each test states
the behaviour it pins.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
import trio
from harness import Daemon, http, start_daemon, wait_until
from live_support import serve_app
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from t3d.api.mcp_tools import TOOLS

READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}


def modern_headers(method: str, name: str | None = None, version: str = MODERN) -> list[tuple[str, str]]:
    headers = [("Accept", "application/json, text/event-stream"), ("MCP-Protocol-Version", version), ("Mcp-Method", method)]
    return headers + ([("Mcp-Name", name)] if name is not None else [])


def rpc(method: str, params: dict[str, Any] | None = None, request_id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if request_id is not None:
        message["id"] = request_id
    return message


# --- the transport, over raw HTTP --------------------------------------------------------------


async def test_the_endpoint_checks_origin_then_token_and_serves_only_post(tmp_path: Path) -> None:
    """A foreign Origin gets 403 even with the token; no token or a wrong one gets 401 with
    WWW-Authenticate; GET (no SSE stream offered) and DELETE (no sessions) get 405 with Allow:
    POST; an Accept without JSON gets 406. Each body is a JSON-RPC error naming the fix."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            status, body = await http(served, "POST", "/mcp", rpc("tools/list"), headers=[("Origin", "https://evil.example")])
            assert status == 403 and "foreign Origin" in body["error"]["message"] and body["id"] is None
            for token in (False, "wrong"):
                status, body = await http(served, "POST", "/mcp", rpc("tools/list"), token=token)
                assert status == 401 and "Authorization: Bearer" in body["error"]["message"]
            assert await _header(served, "POST", "www-authenticate", token=False) == 'Bearer realm="t3d"'
            for method in ("GET", "DELETE"):
                status, body = await http(served, method, "/mcp")
                assert status == 405 and "POST" in body["error"]["message"]
                assert await _header(served, method, "allow") == "POST"
            status, body = await http(served, "POST", "/mcp", rpc("tools/list"), headers=[("Accept", "text/html")])
            assert status == 406 and "Accept: application/json" in body["error"]["message"]
            status, _ = await http(served, "POST", "/mcp", rpc("ping"), headers=[("Origin", f"http://127.0.0.1:{served.port}")])
            assert status == 200


async def _header(served: Any, method: str, name: str, *, token: bool = True) -> str | None:
    stream = await trio.open_tcp_stream("127.0.0.1", served.port)
    async with stream:
        auth = f"Authorization: Bearer {served.token}\r\n" if token else ""
        await stream.send_all(f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    for line in data.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        key, _, value = line.decode().partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None


async def test_one_message_per_post_notifications_get_202_and_bad_bodies_400(tmp_path: Path) -> None:
    """A notification gets 202 and no body; so does a client's response in the legacy era,
    while a modern one is refused; a batch (removed in 2025-06-18), a non-object or invalid
    JSON gets 400 with the JSON-RPC error that says so."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            assert await http(served, "POST", "/mcp", rpc("notifications/initialized", request_id=None)) == (202, None)
            assert await http(served, "POST", "/mcp", {"jsonrpc": "2.0", "id": 5, "result": {}}) == (202, None)
            status, body = await http(served, "POST", "/mcp", {"jsonrpc": "2.0", "id": 5, "result": {}}, headers=modern_headers("x"))
            assert (status, body["error"]["code"]) == (400, -32600)
            status, body = await http(served, "POST", "/mcp", [rpc("ping")])
            assert (status, body["error"]["code"]) == (400, -32600) and "batches" in body["error"]["message"]
            status, body = await http(served, "POST", "/mcp", b"{nope")
            assert (status, body["error"]["code"], body["id"]) == (400, -32700, None)
            status, body = await http(served, "POST", "/mcp", b"[]")
            assert status == 400


async def test_the_legacy_handshake_negotiates_a_version_and_answers_ping(tmp_path: Path) -> None:
    """initialize answers with the version asked for when it is 2025-06-18 or 2025-11-25, and
    with 2025-11-25 for any other; it names the server and its tools capability and issues no
    session; ping answers {}; an unknown method is a JSON-RPC error (-32601) with HTTP 200."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            for asked, answered in (("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"), ("2024-11-05", "2025-11-25"), (MODERN, "2025-11-25")):
                params = {"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
                status, body = await http(served, "POST", "/mcp", rpc("initialize", params))
                assert status == 200 and body["result"]["protocolVersion"] == answered
                assert body["result"]["serverInfo"]["name"] == "t3d" and body["result"]["capabilities"] == {"tools": {"listChanged": False}}
            assert await http(served, "POST", "/mcp", rpc("ping", request_id="p")) == (200, {"jsonrpc": "2.0", "id": "p", "result": {}})
            status, body = await http(served, "POST", "/mcp", rpc("resources/list"), headers=[("MCP-Protocol-Version", "2025-11-25")])
            assert (status, body["error"]["code"]) == (200, -32601) and "tools/list" in body["error"]["message"]
            status, body = await http(served, "POST", "/mcp", rpc("initialize", {"protocolVersion": 7}))
            assert body["error"]["code"] == -32602


async def test_a_modern_request_needs_its_envelope_and_matching_headers(tmp_path: Path) -> None:
    """At 2026-07-28 a request without params._meta's version and capabilities gets -32602;
    an MCP-Protocol-Version, Mcp-Method or Mcp-Name header that is missing or disagrees with
    the body gets -32020 (a base64-sentinel Mcp-Name is decoded first); an unknown version gets
    -32022 listing the supported ones; an unknown method 404 with -32601; all with HTTP 400
    otherwise. server/discover names the versions, and every result carries resultType and
    the server's identity."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:

            async def post(message: dict[str, Any], headers: list[tuple[str, str]]) -> tuple[int, Any]:
                return await http(served, "POST", "/mcp", message, headers=headers)

            status, body = await post(rpc("tools/list"), modern_headers("tools/list"))
            assert (status, body["error"]["code"]) == (400, -32602) and "_meta" in body["error"]["message"]
            status, body = await post(rpc("tools/list", {"_meta": META}), modern_headers("tools/call"))
            assert (status, body["error"]["code"]) == (400, -32020) and "Mcp-Method" in body["error"]["message"]
            call = rpc("tools/call", {"name": "list_threads", "arguments": {}, "_meta": META})
            status, body = await post(call, modern_headers("tools/call", "list_requests"))
            assert (status, body["error"]["code"]) == (400, -32020) and "Mcp-Name" in body["error"]["message"]
            status, body = await post(call, modern_headers("tools/call"))
            assert (status, body["error"]["code"]) == (400, -32020)
            encoded = "=?base64?" + base64.b64encode(b"list_threads").decode() + "?="
            status, body = await post(call, modern_headers("tools/call", encoded))
            assert status == 200 and body["result"]["isError"] is False
            status, body = await http(served, "POST", "/mcp", {**call, "params": {**call["params"], "_meta": META}}, headers=[("Mcp-Method", "tools/call"), ("Mcp-Name", "list_threads")])
            assert (status, body["error"]["code"]) == (400, -32020) and "MCP-Protocol-Version" in body["error"]["message"]
            old = {"io.modelcontextprotocol/protocolVersion": "2099-01-01", "io.modelcontextprotocol/clientCapabilities": {}}
            status, body = await post(rpc("tools/list", {"_meta": old}), modern_headers("tools/list", version="2099-01-01"))
            assert (status, body["error"]["code"]) == (400, -32022)
            assert body["error"]["data"] == {"supported": ["2025-06-18", "2025-11-25", MODERN], "requested": "2099-01-01"}
            status, body = await post(rpc("ping", {"_meta": META}), modern_headers("ping"))
            assert (status, body["error"]["code"]) == (404, -32601)
            status, body = await post(rpc("server/discover", {"_meta": META}), modern_headers("server/discover"))
            result = body["result"]
            assert status == 200 and result["resultType"] == "complete" and MODERN in result["supportedVersions"]
            assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "t3d" and result["ttlMs"] >= 0
            status, body = await post(rpc("tools/list", {"_meta": META}), modern_headers("tools/list"))
            assert [t["name"] for t in body["result"]["tools"]] == [t.name for t in TOOLS] and body["result"]["cacheScope"] == "private"
            status, body = await post(rpc("tools/call", {"name": "nope", "_meta": META}), modern_headers("tools/call", "nope"))
            assert (status, body["error"]["code"]) == (400, -32602) and "tools/list" in body["error"]["message"]


# --- the tools, with the official SDK client -------------------------------------------------


@asynccontextmanager
async def mcp_client(daemon: Daemon, mode: str, token: str | None = None) -> AsyncIterator[Client]:
    """The SDK's Client over its streamable HTTP transport, with the bearer token."""
    http_client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token or daemon.token}"}, timeout=httpx2.Timeout(30, read=90))
    async with http_client, Client(streamable_http_client(f"http://127.0.0.1:{daemon.info.port}/mcp", http_client=http_client), mode=mode) as client:
        yield client


async def call(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structuredContent; the call must not be a tool error, and its text must be
    the same data as JSON after a line a model can read."""
    result = await client.call_tool(name, arguments)
    assert not result.is_error, result.content
    summary, data = (block.text for block in result.content)  # type: ignore[union-attr]
    assert summary and orjson.loads(data) == result.structured_content
    return result.structured_content  # type: ignore[return-value]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_stock_client_delegates_a_task_and_answers_its_permission_prompt(tmp_path: Path, nursery: trio.Nursery, mode: str) -> None:
    """With nothing but the token, the SDK client connects (auto: the 2026-07-28 envelope it
    probes for; legacy: the 2025-11-25 initialize handshake), lists the tools with their
    input schemas, delegates a task to a replay agent, sees it complete with its assistant
    text, starts the second turn, waits for the permission request it raises, allows it, and
    sees the turn complete; list_threads and get_thread show the thread."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with mcp_client(daemon, mode) as client:
            assert client.protocol_version == (MODERN if mode == "auto" else "2025-11-25")
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert list(tools) == [t.name for t in TOOLS]
            assert tools["respond_to_request"].input_schema["properties"]["decision"]["enum"] == ["allow", "allow_session", "deny", "cancel"]
            assert all(t.input_schema["type"] == "object" and t.description for t in tools.values())

            started = await call(client, "delegate_task", text=READ, project_path=str(tmp_path), provider="replay")
            thread_id = started["thread_id"]
            done: dict[str, Any] = {}

            async def finished() -> bool:
                done.update(await call(client, "task_status", thread_id=thread_id))
                return bool(done["done"])

            await wait_until(finished)
            assert done["turn"]["status"] == "completed" and done["assistant_text"]

            cursor = (await call(client, "wait_for_request", timeout_s=0))["cursor"]
            turn = await call(client, "start_turn", thread_id=thread_id, text=EDIT)
            waited = await call(client, "wait_for_request", after=cursor, thread_ids=[thread_id], timeout_s=30)
            [request] = waited["requests"]
            assert request["turn_id"] == turn["turn_id"] and request["data"]["tool_name"] == "Edit"
            assert [r["id"] for r in (await call(client, "list_requests", thread_id=thread_id))["requests"]] == [request["id"]]
            await call(client, "respond_to_request", request_id=request["id"], decision="allow")
            await wait_until(finished)
            assert (done["turn"]["id"], done["turn"]["status"]) == (turn["turn_id"], "completed")

            listed = await call(client, "list_threads", status="idle")
            assert [t["id"] for t in listed["threads"]] == [thread_id] and listed["threads"][0]["project_path"] == str(tmp_path)
            shown = await call(client, "get_thread", thread_id=thread_id)
            assert shown["thread"]["id"] == thread_id and [t["ordinal"] for t in shown["turns"]] == [1, 2]
            assert shown["last_turn_assistant_text"] == done["assistant_text"]
        daemon.stop()


async def test_failures_are_tool_errors_that_name_the_problem_and_the_fix(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A bad argument, an unknown thread, an answer to a request that does not exist, or a
    task with neither project comes back as a tool result with isError and a text naming the
    problem and the fix (never a dropped connection); an unknown tool is a protocol error;
    a wrong token is refused before anything runs."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with mcp_client(daemon, "auto") as client:
            cases = [
                ("get_thread", {"thread_id": "nope"}, "thread 'nope' does not exist"),
                ("get_thread", {"thread": "x"}, "unknown param 'thread'"),
                ("wait_for_request", {"timeout_s": 61}, "timeout_s must be between 0 and 60"),
                ("wait_for_request", {"thread_id": "a", "thread_ids": ["b"]}, "give thread_id (one thread) or thread_ids (several), not both"),
                ("respond_to_request", {"request_id": "r", "decision": "maybe"}, "decision must be one of allow"),
                ("respond_to_request", {"request_id": "r", "decision": "allow"}, "request 'r' does not exist"),
                ("delegate_task", {"text": "go"}, "give exactly one of project_id and project_path"),
                ("task_status", {"thread_id": "nope"}, "does not exist"),
            ]
            for name, arguments, expected in cases:
                result = await client.call_tool(name, arguments)
                assert result.is_error, (name, arguments)
                assert expected in result.content[0].text, result.content  # type: ignore[union-attr]
            with pytest.raises(MCPError) as raised:
                await client.call_tool("no_such_tool", {})
            assert raised.value.error.code == -32602
        with pytest.raises(BaseExceptionGroup) as refused:
            async with mcp_client(daemon, "legacy", token="wrong"):
                pass
        [error] = leaves(refused.value)
        assert isinstance(error, MCPError) and "missing or wrong bearer token" in error.error.message
        daemon.stop()


def leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    return [leaf for e in group.exceptions for leaf in (leaves(e) if isinstance(e, BaseExceptionGroup) else [e])]
