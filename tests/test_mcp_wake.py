"""``wait_for_request`` on ``/mcp`` when one commit wakes many bots (t3d/api/mcp_tools.py).

The API is served in-process (tests/live_support.py) on the real store and real sockets;
requests are opened by committing the domain's own commands (as in
tests/test_requests_wait.py), so each test controls when a request opens, and the bots
are raw MCP POSTs at 2026-07-28. Each test states the behaviour it pins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import trio
from harness import http, wait_until
from live_support import Served, serve_app
from test_mcp import META, modern_headers, rpc
from test_requests_wait import open_request, open_thread, waiting

from t3d.api import mcp_tools


async def wait_tool(served: Served, request_id: int, **arguments: Any) -> dict[str, Any]:
    """One wait_for_request over /mcp; returns the JSON-RPC reply."""
    message = rpc("tools/call", {"name": "wait_for_request", "arguments": arguments, "_meta": META}, request_id)
    status, body = await http(served, "POST", "/mcp", message, headers=modern_headers("tools/call", "wait_for_request"))
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def woken_together(served: Served, tmp_path: Path) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """Three MCP bots (cursors 0, 0 and the last before the request) and one JSON-RPC
    long-poll wait; one request opens. Returns the bots' replies, the JSON-RPC reply and the
    request's opening sequence."""
    await open_thread(served, tmp_path, "t")
    before = served.app.methods.waiters.last_sequence
    replies: dict[int, dict[str, Any]] = {}
    plain: dict[str, Any] = {}

    async def bot(request_id: int, after: int) -> None:
        replies[request_id] = await wait_tool(served, request_id, after=after, timeout_s=20)

    async def over_rpc() -> None:
        plain.update((await http(served, "GET", f"/api/requests/wait?after={before}&timeout=20"))[1])

    async with trio.open_nursery() as nursery:
        for request_id, after in ((1, 0), (2, 0), (3, before)):
            nursery.start_soon(bot, request_id, after)
        nursery.start_soon(over_rpc)
        await wait_until(lambda: waiting(served) == 4)
        sequence = await open_request(served, "t", "r1")
    return [replies[i] for i in (1, 2, 3)], plain, sequence


async def test_bots_woken_by_one_commit_share_one_encoding_and_differ_only_by_id(tmp_path: Path) -> None:
    """Every bot a commit wakes with the same request gets the same result (only the JSON-RPC
    id differs), encoded once for all of them; its structuredContent is what requests.wait
    returns, its text names the request and the cursor to pass next. The shared encodings
    are bounded: past WAKE_REPLIES sets of requests, the oldest is dropped."""
    with trio.fail_after(60):
        async with serve_app(tmp_path / "state") as served:
            bots, plain, sequence = await woken_together(served, tmp_path)
            assert [reply["id"] for reply in bots] == [1, 2, 3]
            results = [reply["result"] for reply in bots]
            assert results[0] == results[1] == results[2]
            result = results[0]
            assert result["structuredContent"] == plain and plain["cursor"] == sequence
            assert [r["id"] for r in plain["requests"]] == ["r1"]
            text, data = result["content"]
            assert "r1 on thread t" in text["text"] and f"after={sequence}" in text["text"]
            assert orjson.loads(data["text"]) == plain and result["isError"] is False
            tools = served.app.mcp.tools
            assert isinstance(tools, mcp_tools.McpTools) and len(tools.wake_replies) == 1
            for i in range(mcp_tools.WAKE_REPLIES + 3):
                tools.wake_reply([(i, f"x{i}", b'{"id":"x","thread_id":"t","kind":"permission"}')])
            assert len(tools.wake_replies) == mcp_tools.WAKE_REPLIES
            assert waiting(served) == 0

