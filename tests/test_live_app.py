"""Live delivery through the real API app, store and sockets, in-process (tests/live_support.py).

Threads are seeded by committing domain commands to the real store, so sizes
are exact and no provider runs; clients are real WebSocket and HTTP clients on
127.0.0.1. Each test states the behaviour it pins.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import RpcClient, RpcFailed, http, wait_until
from live_support import (
    Served,
    loads,
    merge_chunks,
    notes_until,
    open_raw,
    raw_notes,
    raw_ws_first_message,
    reset,
    seed_thread,
    serve_app,
    stored_snapshot,
    thread_events,
    ws_client,
)

from t3d.api.http1 import HttpRequest
from t3d.domain import commands as c
from t3d.domain.model import TurnItem
from t3d.live.chunks import CHUNK_BYTES
from t3d.live.wire import HEAD_BYTES

INVALID_PARAMS, NOT_FOUND = -32602, -32001


def position_of(notes: list[dict[str, Any]]) -> int:
    return max(n["seq"] for n in notes)


def the_item(snapshot: dict[str, Any], item_id: str) -> dict[str, Any]:
    [item] = [i for i in snapshot["items"] if i["id"] == item_id]
    return item


# --- large fields and item.detail ----------------------------------------------------------


async def test_large_fields_are_summarized_on_the_wire_and_item_detail_returns_them(tmp_path: Path) -> None:
    """A 200 KiB command output goes out as its first 4 KiB with ``truncated`` naming the path
    and the full size, in the subscription snapshot, in live events, in thread.snapshot and
    over HTTP alike; item.detail (JSON-RPC and GET /api/items/{id}) returns the full value,
    by path or whole; a bad path gets -32602, an unknown item -32001."""
    with trio.fail_after(20):
        async with serve_app(tmp_path / "state") as served:
            await seed_thread(served.store, tmp_path, "t", turns=1, items=1, output_bytes=200_000)
            item_id = "t-u0-200000-1-i0"
            full = "0:" + "o" * 200_000
            async with ws_client(served) as client:
                sub = (await client.call("subscribe.thread", thread_id="t"))["sub"]
                notes = [n for _, n in await raw_notes(client, sub, "snapshot.end")]
                in_snapshot = the_item(merge_chunks(notes), item_id)
                over_rpc = the_item(await client.call("thread.snapshot", thread_id="t"), item_id)
                status, body = await http(served, "GET", "/api/threads/t")
                over_http = the_item(body, item_id)
                for item in (in_snapshot, over_rpc, over_http):
                    assert item["data"]["output"] == full[:HEAD_BYTES]
                    assert item["truncated"] == [{"path": ["data", "output"], "bytes": len(full)}]
                    assert item["data"]["command"] == "make"

                # A live update of the item is summarized the same way.
                await served.store.execute(c.StartTurn("t", "u-live", "again"))
                from t3d.domain.model import TurnItem

                big = TurnItem("live-item", "t", "u-live", 0, "command", "running", None, "é" * 20_000, None, 0.0)
                await served.store.execute(c.RecordItems("u-live", (big,)))
                event = await client.wait_event(lambda d: d["entity"]["id"] == "live-item")
                assert event["entity"]["text"] == "é" * (HEAD_BYTES // 2)
                assert event["entity"]["truncated"] == [{"path": ["text"], "bytes": 40_000}]

                detail = await client.call("item.detail", item_id=item_id, path=["data", "output"])
                assert detail == {"id": item_id, "path": ["data", "output"], "value": full}
                whole = await client.call("item.detail", item_id=item_id)
                assert whole["value"]["data"]["output"] == full and "truncated" not in whole["value"]
                assert (await client.call("item.detail", item_id="live-item", path=["text"]))["value"] == "é" * 20_000
                status, body = await http(served, "GET", f"/api/items/{item_id}?path=%5B%22data%22%2C%22output%22%5D")
                assert status == 200 and body["value"] == full

                with pytest.raises(RpcFailed) as failed:
                    await client.call("item.detail", item_id=item_id, path=["data", "nope"])
                assert failed.value.code == INVALID_PARAMS and "nope" in failed.value.message
                with pytest.raises(RpcFailed) as failed:
                    await client.call("item.detail", item_id="no-such-item")
                assert failed.value.code == NOT_FOUND
                with pytest.raises(RpcFailed) as failed:
                    await client.call("item.detail")
                assert failed.value.code == INVALID_PARAMS


# --- chunked snapshots --------------------------------------------------------------------


async def test_snapshot_chunks_are_bounded_and_the_snapshot_is_bounded_by_turn_limit(tmp_path: Path) -> None:
    """A thread of 15 turns x 40 large items: the WebSocket snapshot holds the last 10 turns
    (turn_limit's default) and arrives in several chunks, each frame at most 256 KiB;
    snapshot.end counts them; merged, the chunks equal thread.snapshot and GET
    /api/threads/{id}; before= pages back; a turn's items arrive no later than the turn."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            await seed_thread(served.store, tmp_path, "t", turns=15, items=40, output_bytes=30_000)
            async with ws_client(served) as client:
                sub = (await client.call("subscribe.thread", thread_id="t"))["sub"]
                sized = await raw_notes(client, sub, "snapshot.end")
                chunks = [n for _, n in sized[:-1]]
                assert {n["kind"] for n in chunks} == {"snapshot.chunk"}
                assert len(chunks) >= 4
                assert all(size <= CHUNK_BYTES for size, _ in sized)
                assert sized[-1][1]["data"]["chunks"] == len(chunks)
                seen_turns: set[str] = set()
                for note in chunks:  # every item's turn is still to come, or in this chunk
                    for item in note["data"]["items"]:
                        assert item["turn_id"] not in seen_turns
                    seen_turns |= {t["id"] for t in note["data"]["turns"]}
                merged = merge_chunks(chunks)
                assert [t["ordinal"] for t in merged["turns"]] == list(range(6, 16))
                assert merged["has_more"] is True and merged["before"] == 6

                rpc = await client.call("thread.snapshot", thread_id="t")
                status, body = await http(served, "GET", "/api/threads/t")
                assert status == 200
                assert merged == rpc == body
                older = await client.call("thread.snapshot", thread_id="t", before=6, turn_limit=3)
                assert [t["ordinal"] for t in older["turns"]] == [3, 4, 5]


async def test_thread_snapshot_replies_are_streamed_in_bounded_chunks(tmp_path: Path) -> None:
    """A thread whose last 10 turns hold about 4.7 MiB (600 items of 8 KB, under the summary
    limit, so the wire carries them whole). On a WebSocket, thread.snapshot is answered by
    ``snapshot.chunk`` notifications naming the request id, every frame at most 256 KiB, then
    the response ``{sequence, chunks}``; through POST /api/dispatch the JSON-RPC response is
    written in pieces of at most 256 KiB. Both reassemble to exactly the thread, turns and
    items the store holds; turn_limit and before page as before; an unknown thread gets
    -32001 and no chunk."""
    with trio.fail_after(60):
        async with serve_app(tmp_path / "state") as served:
            await seed_thread(served.store, tmp_path, "t", turns=12, items=60, output_bytes=8_000)
            stored = await stored_snapshot(tmp_path / "state" / "t3d.sqlite", "t", range(3, 13))
            async with ws_client(served) as client:
                await client.send_raw('{"jsonrpc":"2.0","id":"snap-1","method":"thread.snapshot","params":{"thread_id":"t"}}')
                sized: list[tuple[int, dict[str, Any]]] = []
                while True:
                    text = await client.ws.get_message()
                    message = loads(text.encode() if isinstance(text, str) else text)
                    sized.append((len(text.encode() if isinstance(text, str) else text), message))
                    if message.get("id") == "snap-1":
                        break
                *chunks, (_, reply) = sized
                assert len(chunks) >= 16 and all(size <= CHUNK_BYTES for size, _ in sized)
                assert all(m["method"] == "snapshot.chunk" and m["params"]["id"] == "snap-1" for _, m in chunks)
                sequence = reply["result"]["sequence"]
                assert reply["result"] == {"sequence": sequence, "chunks": len(chunks)}
                assert {m["params"]["seq"] for _, m in chunks} == {sequence}
                merged = merge_chunks([{"kind": "snapshot.chunk", "data": m["params"]["data"]} for _, m in chunks])
                assert {k: merged[k] for k in ("thread", "turns", "items")} == stored
                assert merged["requests"] == [] and merged["has_more"] is True and merged["before"] == 3
                assert sum(len(i["data"]["output"]) for i in merged["items"] if i["data"]) > 4_500_000

                older = await client.call("thread.snapshot", thread_id="t", before=3, turn_limit=2)
                assert [t["ordinal"] for t in older["turns"]] == [1, 2] and older["has_more"] is False
                with pytest.raises(RpcFailed) as failed:
                    await client.call("thread.snapshot", thread_id="nope")
                assert failed.value.code == NOT_FOUND

            request = b'{"jsonrpc":"2.0","id":7,"method":"thread.snapshot","params":{"thread_id":"t"}}'
            response = await served.app.handle_http(HttpRequest("POST", "/api/dispatch", {}, {"authorization": f"Bearer {served.token}"}, request))
            assert response.status == 200 and len(response.parts) >= 16
            assert all(len(piece) <= CHUNK_BYTES for piece in (response.body, *response.parts))
            whole = loads(response.body + b"".join(response.parts))
            assert whole["id"] == 7 and {k: whole["result"][k] for k in ("thread", "turns", "items")} == stored
            status, body = await http(served, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 8, "method": "thread.snapshot", "params": {"thread_id": "t", "turn_limit": 1, "before": 2}})
            assert status == 200 and [t["ordinal"] for t in body["result"]["turns"]] == [1]
            status, body = await http(served, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 9, "method": "thread.snapshot", "params": {"thread_id": "nope"}})
            assert body["error"]["code"] == NOT_FOUND


async def test_http_routes_refuse_query_parameters_they_do_not_know(tmp_path: Path) -> None:
    """``?turnLimit=1`` is not silently ignored (the whole thread would come back): it gets a
    400 naming the parameters the route takes; known ones are honoured."""
    with trio.fail_after(20):
        async with serve_app(tmp_path / "state") as served:
            await seed_thread(served.store, tmp_path, "t", turns=3, items=1, output_bytes=10)
            status, body = await http(served, "GET", "/api/threads/t?turnLimit=1")
            assert status == 400
            message = body["error"]["message"]
            assert "turnLimit" in message and "turn_limit" in message and "before" in message
            status, body = await http(served, "GET", "/api/shell?all=1")
            assert status == 400 and "all" in body["error"]["message"]
            status, body = await http(served, "GET", "/api/threads/t?turn_limit=1")
            assert status == 200 and [t["ordinal"] for t in body["turns"]] == [3]
            status, body = await http(served, "GET", "/api/shell")
            assert status == 200 and [t["id"] for t in body["threads"]] == ["t"]


# --- a wave of shell resyncs --------------------------------------------------------------

SHELL_SUBSCRIBERS = 6
RENAMES = 1300


async def test_shell_subscribers_that_overflow_together_share_one_base_read(tmp_path: Path) -> None:
    """Six shell subscribers stop reading while 1,300 renames commit: each overflows its
    1,000-frame buffer, gets ``resync`` and a fresh snapshot with the last title, then live
    events again; the six fresh snapshots come from one database read."""
    with trio.fail_after(60):
        async with serve_app(tmp_path / "state") as served:
            await seed_thread(served.store, tmp_path, "t", turns=0, items=0, output_bytes=0)
            async with trio.open_nursery() as nursery:
                clients: list[RpcClient] = []
                subs: list[str] = []
                ready = trio.Event()
                stop = trio.Event()

                async def subscriber() -> None:
                    async with ws_client(served, receive_buffer=4096) as client:
                        subs.append((await client.call("subscribe.shell"))["sub"])
                        clients.append(client)
                        if len(clients) == SHELL_SUBSCRIBERS:
                            ready.set()
                        await stop.wait()

                for _ in range(SHELL_SUBSCRIBERS):
                    nursery.start_soon(subscriber)
                await ready.wait()
                before = served.app.bases._snapshots.statistics()  # type: ignore[attr-defined]
                for n in range(RENAMES):  # nobody reads meanwhile
                    await served.store.execute(c.RenameThread("t", f"title {n} " + "x" * 300))
                assert served.hub.statistics().resyncs >= SHELL_SUBSCRIBERS

                async def catch_up(client: RpcClient, sub: str) -> None:
                    notes: list[dict[str, Any]] = []
                    while True:
                        note = await client.next_notification()
                        if note["sub"] == sub:
                            notes.append(note)
                        if note["kind"] == "snapshot.end" and any(n["kind"] == "resync" for n in notes):
                            break
                    resync = next(i for i, n in enumerate(notes) if n["kind"] == "resync")
                    fresh = merge_chunks(notes[resync:])
                    assert fresh["threads"][0]["title"].startswith(f"title {RENAMES - 1} ")

                async with trio.open_nursery() as readers:
                    for client, sub in zip(clients, subs, strict=True):
                        readers.start_soon(catch_up, client, sub)
                after = served.app.bases._snapshots.statistics()  # type: ignore[attr-defined]
                assert after.served - before.served == SHELL_SUBSCRIBERS
                assert after.reads - before.reads == 1

                await served.store.execute(c.RenameThread("t", "after the wave"))
                for client in clients:
                    live = await client.wait_event(lambda d: d["kind"] == "shell.updated" and d["entity"]["title"] == "after the wave")
                    assert live["entity"]["id"] == "t"
                stop.set()


# --- a connection-wide budget -------------------------------------------------------------

BUDGET = 2 * 1024 * 1024
FLOOD_THREADS = ("a", "b", "c", "d")
FLOOD_COMMITS = 200  # per thread: 8 MB in all, 2 MB per subscription


async def test_a_client_that_never_reads_stays_within_its_connection_budget(tmp_path: Path) -> None:
    """With a 2 MiB connection budget (each subscription alone may still hold 8 MiB), a client
    that never reads, on a socket with a 4 KiB receive buffer, subscribes to the shell and four
    threads while a healthy client follows the same four threads; 800 commits of 10 KB items
    follow. The never-reading connection never holds more than its budget (its high-water
    mark), stays there by resyncing its fullest subscriptions (none reached its own bound),
    and is not closed; the healthy client receives every event of the four threads, in
    order, with no resync."""
    db_path = tmp_path / "state" / "t3d.sqlite"
    with trio.fail_after(50):
        async with serve_app(tmp_path / "state", connection_budget=BUDGET) as served:
            for thread_id in FLOOD_THREADS:
                await seed_thread(served.store, tmp_path, thread_id, turns=1, items=1, output_bytes=10)
            async with ws_client(served, receive_buffer=4096) as stuck:
                await wait_until(lambda: served.app.connections)
                [never_reads] = served.app.connections
                await stuck.send_raw('{"jsonrpc":"2.0","id":0,"method":"subscribe.shell"}')
                for n, thread_id in enumerate(FLOOD_THREADS, 1):
                    await stuck.send_raw(f'{{"jsonrpc":"2.0","id":{n},"method":"subscribe.thread","params":{{"thread_id":"{thread_id}"}}}}')
                await wait_until(lambda: len(never_reads.feeds.subs) == 1 + len(FLOOD_THREADS))

                async with ws_client(served) as healthy:
                    subs = {}
                    positions = {}
                    for thread_id in FLOOD_THREADS:
                        subs[thread_id] = (await healthy.call("subscribe.thread", thread_id=thread_id))["sub"]
                        positions[thread_id] = position_of(await notes_until(healthy, subs[thread_id], "snapshot.end"))
                    received: dict[str, list[dict[str, Any]]] = {t: [] for t in FLOOD_THREADS}
                    threads_of = {sub: thread_id for thread_id, sub in subs.items()}

                    async def follow() -> None:
                        while True:
                            note = await healthy.next_notification()
                            assert note["kind"] == "event", note
                            received[threads_of[note["sub"]]].append(note["data"])

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(follow)
                        for thread_id in FLOOD_THREADS:
                            await served.store.execute(c.StartTurn(thread_id, f"{thread_id}-flood", "flood"))
                        for n in range(FLOOD_COMMITS):
                            for thread_id in FLOOD_THREADS:
                                item = TurnItem(f"{thread_id}-i{n}", thread_id, f"{thread_id}-flood", 0, "command", "completed", "make", None, {"output": "o" * 10_000}, 0.0)
                                await served.store.execute(c.RecordItems(f"{thread_id}-flood", (item,)))
                        for thread_id in FLOOD_THREADS:
                            await served.store.execute(c.FinishTurn(f"{thread_id}-flood", "completed"))
                        expected = {}
                        for thread_id in FLOOD_THREADS:
                            events = await thread_events(db_path, thread_id)
                            expected[thread_id] = [e for e in events if e["sequence"] > positions[thread_id]]
                        await wait_until(lambda: all(len(received[t]) >= len(expected[t]) for t in FLOOD_THREADS))
                        nursery.cancel_scope.cancel()

                    for thread_id in FLOOD_THREADS:
                        assert received[thread_id] == expected[thread_id]
                        assert len(received[thread_id]) > FLOOD_COMMITS

                budget = never_reads.feeds.budget.statistics()
                print(f"never-reading connection: {budget}")
                assert budget.high_water <= BUDGET
                assert budget.relieved > 0
                assert never_reads in served.app.connections
                live = served.app.live_statistics()  # what /api/health reports under "live"
                assert live["websockets"] == 1 and live["budget_bytes"] == BUDGET
                assert live["buffered_bytes"] + live["held_bytes"] == never_reads.feeds.budget.used <= BUDGET
                assert live["resynced_for_budget"] == budget.relieved
                assert all(len(sub.frames) < sub.max_items and sub.buffered_bytes < sub.max_bytes for sub in never_reads.feeds.subs.values())


# --- nothing outlives its connection ------------------------------------------------------


async def test_a_closed_connections_buffers_are_freed_at_once_not_at_a_full_collection(tmp_path: Path) -> None:
    """A client that never reads holds buffered frames in four thread subscriptions; when it
    goes away, its subscriptions drop their frames and no longer refer to themselves, so
    reference counting frees them then. With the collector paused, nothing waits for it."""
    with trio.fail_after(30):
        async with serve_app(tmp_path / "state") as served:
            for thread_id in FLOOD_THREADS:
                await seed_thread(served.store, tmp_path, thread_id, turns=1, items=1, output_bytes=10)
                await served.store.execute(c.StartTurn(thread_id, f"{thread_id}-live", "go"))
            gc.disable()
            try:
                async with ws_client(served, receive_buffer=4096) as stuck:
                    await wait_until(lambda: served.app.connections)
                    [never_reads] = served.app.connections
                    for n, thread_id in enumerate(FLOOD_THREADS, 1):
                        await stuck.send_raw(f'{{"jsonrpc":"2.0","id":{n},"method":"subscribe.thread","params":{{"thread_id":"{thread_id}"}}}}')
                    await wait_until(lambda: len(never_reads.feeds.subs) == len(FLOOD_THREADS))
                    for n in range(40):
                        for thread_id in FLOOD_THREADS:
                            item = TurnItem(f"{thread_id}-i{n}", thread_id, f"{thread_id}-live", 0, "command", "completed", "make", None, {"output": "o" * 10_000}, 0.0)
                            await served.store.execute(c.RecordItems(f"{thread_id}-live", (item,)))
                    subs = list(never_reads.feeds.subs.values())
                    assert sum(sub.buffered_bytes for sub in subs) > 100_000, "the client should be holding frames"
                await wait_until(lambda: not served.app.connections)
                assert all(not sub.frames and sub.buffered_bytes == 0 for sub in subs)
                assert all(gc.get_referrers(sub) == [subs] for sub in subs), "only this test still refers to them"
            finally:
                gc.enable()


# CI runs a few hundred; `T3D_TEST_DISCONNECTS=10000` runs the full count.
DISCONNECTS = int(os.environ.get("T3D_TEST_DISCONNECTS", "300"))


def _settle_heap() -> None:
    """Collect garbage, and drop the deadlines of cancel scopes that have exited: trio keeps
    each in its deadline heap until the deadline passes or stale entries pass a thousand
    (trio/_core/_run.py, Deadlines), which is bounded but would count each connection's
    10-60 s deadlines as growth here."""
    gc.collect()
    runner = getattr(trio._core._run.GLOBAL_RUN_CONTEXT, "runner", None)
    prune = getattr(getattr(runner, "deadlines", None), "_prune", None)
    if prune is not None:
        prune()
    gc.collect()


async def _disconnect_once(served: Served, n: int) -> None:
    """One client that goes away mid-response, four ways in turn: HTTP while the body is being
    sent, HTTP while the handler still runs, WebSocket mid-snapshot, WebSocket right after
    subscribing; each one closes with a reset."""
    stream = await open_raw(served)
    way = n % 4
    if way in (0, 1):
        request = b"GET /api/threads/t HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n" % served.token.encode()
        await stream.send_all(request)
        if way == 0:
            assert (await stream.receive_some(1024)).startswith(b"HTTP/1.1 200")
    else:
        subscribe = b'{"jsonrpc":"2.0","id":1,"method":"subscribe.thread","params":{"thread_id":"t"}}'
        if way == 2:
            assert '"result"' in await raw_ws_first_message(served, stream, subscribe)
        else:
            with trio.move_on_after(0):
                await raw_ws_first_message(served, stream, subscribe)
    await reset(stream)
    with trio.fail_after(5):
        await served.transport.wait_open_connections(0)
    assert served.hub.statistics().thread_subscriptions == 0


async def test_clients_that_leave_mid_response_leave_nothing_behind(tmp_path: Path) -> None:
    """Clients disconnect mid-response over and over (see _disconnect_once): each connection is
    gone at once (no open connection, no subscription before the next starts), and the heap
    does not grow: tracemalloc snapshots before and after the second half of the loop differ
    by less than 64 KiB in all (about 200 bytes per disconnect at CI's count)."""
    with trio.fail_after(60 + DISCONNECTS * 0.05):
        async with serve_app(tmp_path / "state") as served:
            # About 600 KiB on the wire: larger than the socket buffers, so sends stall.
            await seed_thread(served.store, tmp_path, "t", turns=3, items=50, output_bytes=20_000)
            for n in range(40):  # warm-up: caches, first-use allocations
                await _disconnect_once(served, n)
            tracemalloc.start(1)
            try:
                for n in range(DISCONNECTS // 2):
                    await _disconnect_once(served, n)
                _settle_heap()
                first = tracemalloc.take_snapshot()
                for n in range(DISCONNECTS // 2):
                    await _disconnect_once(served, n)
                _settle_heap()
                second = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            growth = sum(stat.size_diff for stat in second.compare_to(first, "filename"))
            top = second.compare_to(first, "lineno")[:5]
            print(f"{DISCONNECTS} disconnects; heap growth over the last {DISCONNECTS // 2}: {growth} bytes; top: {top}")
            assert growth < 64 * 1024, top
            assert served.hub.statistics().buffered_bytes == 0


async def test_concurrent_shell_polls_share_reads_and_each_sees_what_came_before_it(tmp_path: Path) -> None:
    """Thirty GET /api/shell at once: one shell read runs at a time and the polls that arrive
    meanwhile share the next, so there are far fewer reads than polls; every reply holds the
    rename committed before the polls began, and the counts are spliced in right."""
    with trio.fail_after(60):
        async with serve_app(tmp_path / "state") as served:
            await seed_thread(served.store, tmp_path, "t", turns=2, items=3, output_bytes=0)
            await served.store.execute(c.RenameThread("t", "renamed before the polls"))
            replies: list[Any] = []

            async def poll() -> None:
                replies.append(await http(served, "GET", "/api/shell"))

            async with trio.open_nursery() as nursery:
                for _ in range(30):
                    nursery.start_soon(poll)
            reads = served.app.bases._shell_reads.statistics().reads  # type: ignore[attr-defined]
            assert len(replies) == 30 and reads < 30, reads
            for status, body in replies:
                assert status == 200
                [thread] = body["threads"]
                assert thread["title"] == "renamed before the polls"
                assert (thread["turn_count"], thread["item_count"]) == (2, 2 * (3 + 1))
