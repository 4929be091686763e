"""``requests.wait`` and ``GET /api/requests/wait``: the long-poll for runtime requests.

The API is served in-process (tests/live_support.py) on the real store and real sockets;
requests are opened and answered by committing the domain's own commands, so each test
controls exactly when a request opens. Each test states the behaviour it pins.
"""

from __future__ import annotations

import gc
import os
import random
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import trio
from harness import RpcFailed, http, wait_until
from live_support import Served, open_raw, reset, serve_app, ws_client

from t3d.api.methods import Methods
from t3d.domain import commands as c
from t3d.domain.model import TurnItem

INVALID_PARAMS, UNAVAILABLE = -32602, -32003


async def open_thread(served: Served, project_dir: Path, thread_id: str) -> str:
    """A thread with a turn in progress (no provider runs: requests are opened by hand)."""
    if not await served.store.projects():
        await served.store.execute(c.CreateProject("p", str(project_dir)))
    await served.store.execute(c.CreateThread(thread_id, "p", "replay"))
    turn_id = f"{thread_id}-turn"
    await served.store.execute(c.StartTurn(thread_id, turn_id, "go"))
    return turn_id


async def open_request(served: Served, thread_id: str, request_id: str) -> int:
    """Open a permission request on the thread's turn; return its opening sequence."""
    item = TurnItem(f"{request_id}-item", thread_id, "", 0, "approval_request", "pending", "Edit", None, None, 0.0)
    data = {"tool_name": "Edit", "input": {"file_path": "notes.txt"}}
    committed = await served.store.execute(c.OpenRequest(f"{thread_id}-turn", request_id, "permission", item, data))
    return next(e.sequence for e in committed.events if e.kind == "request.updated")


def waiting(served: Served) -> int:
    return served.app.methods.waiters.statistics().waiters


async def test_a_pending_request_is_returned_at_once_and_its_cursor_skips_it_next_time(tmp_path: Path) -> None:
    """server.hello lists requests.wait. With a request pending, it (after 0) returns the
    request at once with the cursor of its opening; waiting again from that cursor times out with no request and a cursor at
    least as far, over the WebSocket, POST /api/dispatch and GET /api/requests/wait alike."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            await open_thread(served, tmp_path, "t")
            sequence = await open_request(served, "t", "r1")
            async with ws_client(served) as client:
                assert "requests.wait" in (await client.call("server.hello"))["methods"]
                first = await client.call("requests.wait")
                assert [r["id"] for r in first["requests"]] == ["r1"] and first["cursor"] == sequence
                assert first["requests"][0]["data"]["tool_name"] == "Edit"
                again = await client.call("requests.wait", after=first["cursor"], timeout=1)
                assert again["requests"] == [] and again["cursor"] >= sequence
            status, body = await http(served, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 7, "method": "requests.wait", "params": {}})
            assert status == 200 and body["id"] == 7 and body["result"]["cursor"] == sequence
            status, body = await http(served, "GET", f"/api/requests/wait?after={sequence}&timeout=0")
            assert (status, body["requests"]) == (200, [])
            status, body = await http(served, "GET", "/api/requests/wait?thread_id=t&limit=1")
            assert status == 200 and [r["id"] for r in body["requests"]] == ["r1"]
            assert waiting(served) == 0


async def test_a_waiting_long_poll_returns_as_soon_as_a_matching_request_opens(tmp_path: Path) -> None:
    """Long-polls over HTTP and WebSocket sleep until a request of their thread (or of any
    thread, without thread_id) opens, then return it with its cursor; one that waits for
    another thread keeps waiting and times out empty."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            await open_thread(served, tmp_path, "t")
            await open_thread(served, tmp_path, "other")
            replies: dict[str, Any] = {}

            async def over_http(name: str, query: str) -> None:
                replies[name] = (await http(served, "GET", f"/api/requests/wait?{query}"))[1]

            async with ws_client(served) as client, trio.open_nursery() as nursery:
                nursery.start_soon(over_http, "any", "timeout=20")
                nursery.start_soon(over_http, "mine", "timeout=20&thread_id=t")
                nursery.start_soon(over_http, "other", "timeout=2&thread_id=other")
                await wait_until(lambda: waiting(served) == 3)
                sequence = await open_request(served, "t", "r1")
                over_ws = await client.call("requests.wait")  # the request is pending now: at once
            assert [r["id"] for r in replies["any"]["requests"]] == ["r1"] and replies["any"]["cursor"] == sequence
            assert [r["id"] for r in replies["mine"]["requests"]] == ["r1"]
            assert replies["other"]["requests"] == [] and replies["other"]["cursor"] >= sequence
            assert [r["id"] for r in over_ws["requests"]] == ["r1"]


async def test_a_long_poll_of_several_threads_returns_theirs_and_sleeps_through_the_others(tmp_path: Path) -> None:
    """thread_ids (a list over JSON-RPC, comma-separated in the HTTP query) watches exactly
    those threads: a request of another thread neither wakes nor is returned; one of either
    watched thread is, in opening order. Giving thread_id and thread_ids, an empty list, an
    empty id or more than 100 ids is refused by name."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            for thread_id in ("a", "b", "c"):
                await open_thread(served, tmp_path, thread_id)
            replies: dict[str, Any] = {}

            async def over_http() -> None:
                replies["http"] = (await http(served, "GET", "/api/requests/wait?timeout=20&thread_ids=a,b"))[1]

            async def over_ws(client: Any) -> None:
                replies["ws"] = await client.call("requests.wait", thread_ids=["b", "a"], timeout=20)

            async with ws_client(served) as client, trio.open_nursery() as nursery:
                nursery.start_soon(over_http)
                nursery.start_soon(over_ws, client)
                await wait_until(lambda: waiting(served) == 2)
                await open_request(served, "c", "rc")
                await trio.sleep(0.2)
                assert waiting(served) == 2 and replies == {}  # c's request woke neither
                sequence = await open_request(served, "b", "rb")
            for name in ("http", "ws"):
                assert [r["id"] for r in replies[name]["requests"]] == ["rb"] and replies[name]["cursor"] == sequence
            await open_request(served, "a", "ra")
            status, body = await http(served, "GET", "/api/requests/wait?timeout=0&thread_ids=a,b")
            assert status == 200 and [r["id"] for r in body["requests"]] == ["rb", "ra"]
            status, body = await http(served, "GET", "/api/requests/wait?timeout=0&thread_ids=a,,b")
            assert status == 400 and "non-empty" in body["error"]["message"]
            async with ws_client(served) as client:
                for params, problem in (
                    ({"thread_id": "a", "thread_ids": ["b"]}, "not both"),
                    ({"thread_ids": []}, "thread_ids must hold 1 to 100 strings, not 0"),
                    ({"thread_ids": [f"t{n}" for n in range(101)]}, "not 101"),
                    ({"thread_ids": "a,b"}, "thread_ids must be a list of strings"),
                    ({"thread_ids": ["a", ""]}, "thread_ids must hold only non-empty strings"),
                ):
                    try:
                        await client.call("requests.wait", timeout=0, **params)
                        raise AssertionError(f"{params} was accepted")
                    except RpcFailed as exc:
                        assert exc.code == INVALID_PARAMS and problem in str(exc.message), exc.message
            assert waiting(served) == 0


async def test_no_request_opened_between_two_waits_is_missed(tmp_path: Path) -> None:
    """A bot that long-polls with the cursor it was given, and answers what it gets, while
    60 requests open on two threads at random moments, sees every one exactly once."""
    with trio.fail_after(60):
        async with serve_app(tmp_path / "state") as served:
            for thread_id in ("a", "b"):
                await open_thread(served, tmp_path, thread_id)
            opened = [f"r{n}" for n in range(60)]
            seen: list[str] = []

            async def bot() -> None:
                cursor = 0
                async with ws_client(served) as client:
                    while len(seen) < len(opened):
                        reply = await client.call("requests.wait", after=cursor, timeout=10)
                        cursor = reply["cursor"]
                        for r in reply["requests"]:
                            seen.append(r["id"])
                            await client.call("request.respond", request_id=r["id"], decision="allow")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(bot)
                rng = random.Random(17)
                for n, request_id in enumerate(opened):
                    await open_request(served, "ab"[n % 2], request_id)
                    await trio.sleep(rng.choice((0, 0, 0.001, 0.01)))
            assert sorted(seen) == sorted(opened) and len(seen) == len(set(seen))


async def test_bad_params_and_query_parameters_are_refused_by_name(tmp_path: Path) -> None:
    """A timeout over 60 s, a negative cursor or an unknown param gets an invalid-params error
    naming each; a misspelled query parameter of the HTTP route gets a 400 naming the ones it
    takes."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            async with ws_client(served) as client:
                try:
                    await client.call("requests.wait", timeout=61, after=-1, thread="t")
                    raise AssertionError("refused params were accepted")
                except RpcFailed as exc:
                    assert exc.code == INVALID_PARAMS
                    assert "timeout must be between 0 and 60" in str(exc.message)
                    assert "after must be between" in str(exc.message) and "'thread'" in str(exc.message)
            status, body = await http(served, "GET", "/api/requests/wait?timout=5")
            assert status == 400 and "after, thread_id, thread_ids, timeout, limit" in body["error"]["message"]
            status, body = await http(served, "GET", "/api/requests/wait?timeout=soon")
            assert status == 400 and "timeout must be an integer" in body["error"]["message"]


async def test_long_polls_are_bounded_per_connection_and_in_all(tmp_path: Path) -> None:
    """A WebSocket connection holds at most 16 long-polls; the 17th is refused (-32003) with a
    message naming the bound and the fix, and the connection keeps working. Past the total
    bound an HTTP long-poll gets 503 naming that bound. Closing the connection releases its
    long-polls at once."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            waiters = served.app.methods.waiters
            async with ws_client(served) as client:
                for n in range(waiters.max_per_owner):
                    await client.send_raw(orjson.dumps({"jsonrpc": "2.0", "id": 100 + n, "method": "requests.wait", "params": {"timeout": 30}}).decode())
                await wait_until(lambda: waiting(served) == waiters.max_per_owner)
                try:
                    await client.call("requests.wait", timeout=30)
                    raise AssertionError("a 17th long-poll was accepted")
                except RpcFailed as exc:
                    assert exc.code == UNAVAILABLE and "16 requests.wait long-polls, the bound per connection" in str(exc.message)
                assert (await client.call("project.list"))["projects"] == []
                waiters.max_waiters = waiters.max_per_owner
                status, body = await http(served, "GET", "/api/requests/wait?timeout=30")
                assert status == 503 and f"already holds {waiters.max_per_owner} requests.wait long-polls, its bound" in body["error"]["message"]
            await wait_until(lambda: waiting(served) == 0)


async def test_requests_pending_before_the_index_existed_are_found_by_its_first_read(tmp_path: Path) -> None:
    """A registry that starts after requests opened (a second Methods on the same store, as
    after a start with requests still pending) reads them, with their opening sequences, on
    its first long-poll, and forgets one a read finds answered."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            await open_thread(served, tmp_path, "t")
            first = await open_request(served, "t", "r1")
            second = await open_request(served, "t", "r2")
            late = Methods(served.store)
            reply = orjson.loads(orjson.dumps(await late.call("requests.wait", {"timeout": 0})))
            assert [r["id"] for r in reply["requests"]] == ["r1", "r2"] and reply["cursor"] == second
            assert [r.sequence for r in late.waiters.pending_after(0, None, 10)] == [first, second]
            await served.store.execute(c.RespondToRequest("r1", "allow"))
            reply = orjson.loads(orjson.dumps(await late.call("requests.wait", {"timeout": 0})))
            assert [r["id"] for r in reply["requests"]] == ["r2"]


async def test_requests_pending_answers_from_memory_what_a_read_of_the_database_finds(tmp_path: Path) -> None:
    """requests.pending (and GET /api/requests/pending) answers from the long-poll index when
    it holds every pending request's wire JSON: the same list, in the same order, with the
    same summarized large fields (one over the store-once size among them), as a read of
    the database, for every thread or one; a registry that has only read them (a second
    Methods, as after a start) reads them for it."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            methods, reader = served.app.methods, served.app.bases
            for thread_id in ("t", "u"):
                await open_thread(served, tmp_path, thread_id)
            await open_request(served, "t", "r1")
            item = TurnItem("r2-item", "u", "", 0, "approval_request", "pending", "Write", None, None, 0.0)
            large = {"tool_name": "Write", "input": {"content": "x" * (1 << 21)}}
            await served.store.execute(c.OpenRequest("u-turn", "r2", "permission", item, large))
            await open_request(served, "t", "r3")
            await served.store.execute(c.RespondToRequest("r1", "allow"))

            async def both(thread_id: str | None) -> tuple[Any, Any]:
                listed = await methods.call("requests.pending", {"thread_id": thread_id})
                read = await reader.pending_requests_json(thread_id)
                return orjson.loads(orjson.dumps(listed))["requests"], orjson.loads(orjson.dumps(read))

            for thread_id in (None, "t", "u"):
                listed, read = await both(thread_id)  # the first call seeds the index
                assert listed == read and listed
                assert methods.waiters.pending_wires(thread_id) is not None  # answered from memory
            assert [r["id"] for r in (await both(None))[0]] == ["r2", "r3"]
            assert len(orjson.dumps((await both("u"))[0])) < 100_000  # the large field summarized
            status, body = await http(served, "GET", "/api/requests/pending?thread_id=t")
            assert status == 200 and body["requests"] == (await both("t"))[1]

            late = Methods(served.store)
            listed = orjson.loads(orjson.dumps(await late.call("requests.pending", {})))["requests"]
            assert late.waiters.pending_wires(None) is None and listed == (await both(None))[1]


# --- nothing outlives a client that hangs up ------------------------------------------------

DISCONNECTS = int(os.environ.get("T3D_TEST_WAIT_DISCONNECTS", "1000"))


def task_count() -> int:
    """Every task of this Trio run (the daemon's and the test's)."""

    def walk(task: trio.lowlevel.Task) -> int:
        return 1 + sum(walk(child) for nursery in task.child_nurseries for child in nursery.child_tasks)

    return walk(trio.lowlevel.current_root_task())


def mcp_wait(token: str) -> bytes:
    body = orjson.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "wait_for_request", "arguments": {"timeout_s": 60},
                   "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}},
    })  # fmt: skip
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\n"
        f"Mcp-Name: wait_for_request\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _hang_up_mid_wait(served: Served, n: int, requests: tuple[bytes, bytes]) -> None:
    """One client starts a long-poll (GET /api/requests/wait, or MCP's wait_for_request), and
    resets the connection once its waiter is registered."""
    stream = await open_raw(served)
    await stream.send_all(requests[n % 2])
    with trio.fail_after(5):
        await wait_until(lambda: waiting(served) == 1, interval=0.001)
    await reset(stream)
    with trio.fail_after(5):
        await served.transport.wait_open_connections(0)
        await wait_until(lambda: waiting(served) == 0, interval=0.001)


async def test_clients_that_hang_up_mid_wait_leave_nothing_behind(tmp_path: Path) -> None:
    """1,000 long-polls, half over HTTP and half over MCP, each reset by its client while it
    waits: each waiter is gone at once (before the next starts), every task of the run is gone
    (the count returns to what it was), and the heap does not grow: tracemalloc snapshots
    before and after the second half differ by less than 64 KiB in all."""
    with trio.fail_after(120 + DISCONNECTS * 0.1):
        async with serve_app(tmp_path / "state") as served:
            requests = (b"GET /api/requests/wait?timeout=60 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n" % served.token.encode(), mcp_wait(served.token))
            for n in range(40):  # warm-up: caches, first-use allocations
                await _hang_up_mid_wait(served, n, requests)
            await trio.sleep(0.1)
            before = task_count()
            tracemalloc.start(1)
            try:
                for n in range(DISCONNECTS // 2):
                    await _hang_up_mid_wait(served, n, requests)
                gc.collect()
                first = tracemalloc.take_snapshot()
                for n in range(DISCONNECTS // 2):
                    await _hang_up_mid_wait(served, n, requests)
                gc.collect()
                second = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            with trio.fail_after(5):
                await wait_until(lambda: task_count() <= before)
            growth = sum(stat.size_diff for stat in second.compare_to(first, "filename"))
            top = second.compare_to(first, "lineno")[:5]
            print(f"{DISCONNECTS} hang-ups mid-wait; heap growth over the last {DISCONNECTS // 2}: {growth} bytes; top: {top}")
            assert growth < 64 * 1024, top
            stats = served.app.methods.waiters.statistics()
            assert (stats.waiters, stats.pending_indexed) == (0, 0)


async def test_a_long_poll_behind_the_kept_wires_reads_the_older_requests(tmp_path: Path) -> None:
    """A long-poll whose cursor is behind several pending requests gets them all, in opening
    order and whole, whether the index kept their wire JSON (the newest) or they are read
    from the database (older than the kept ones)."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            await open_thread(served, tmp_path, "t")
            served.app.methods.waiters.max_wires = 1
            assert (await http(served, "GET", "/api/requests/wait?timeout=0"))[1]["requests"] == []  # seeds the index
            sequences = [await open_request(served, "t", f"r{i}") for i in range(3)]
            assert served.app.methods.waiters.wire_of("r2") is not None and served.app.methods.waiters.wire_of("r0") is None
            status, body = await http(served, "GET", "/api/requests/wait?timeout=0")
            assert status == 200 and [r["id"] for r in body["requests"]] == ["r0", "r1", "r2"]
            assert all(r["data"]["tool_name"] == "Edit" and r["status"] == "pending" for r in body["requests"])
            assert body["cursor"] == sequences[-1]
