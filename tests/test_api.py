"""The client API of a real daemon: HTTP routes, JSON-RPC over WebSocket, subscriptions.

Every test runs `run_daemon` in-process on 127.0.0.1 port 0 with a temp state
dir, the real SQLite file and the replay provider as real subprocesses
(README "The API"; docs/architecture.md, API). Each test states the behaviour it pins.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import orjson
import pytest
import trio
import trio_websocket
from harness import (
    FIXTURES,
    TERMINAL,
    Daemon,
    RpcClient,
    RpcFailed,
    http,
    new_thread,
    open_client,
    run_turn,
    start_daemon,
)
from live_support import merge_chunks, write_flood_fixture

from t3d import __version__
from t3d.domain.model import PROVIDERS, RUNNABLE_PROVIDERS

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
NOT_FOUND, CONFLICT = -32001, -32002

# One turn per user message: a Bash call that fails, then a short answer (no prompts).
ONE_TURN_FIXTURE = FIXTURES / "claude-2.1.197_oneshot_default_noprompttool.stdout.jsonl"
READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"


async def reply_to_frame(client: RpcClient, frame: str | bytes) -> dict[str, Any]:
    """Send one raw frame; return the next response (whatever its id), keeping notifications."""
    await client.ws.send_message(frame)
    while True:
        message = await client.receive()
        if message.get("method") == "sub":
            client.notifications.append(message["params"])
        else:
            return message


async def wait_pending_request(client: RpcClient, thread_id: str) -> dict[str, Any]:
    data = await client.wait_event(
        lambda d: (
            d["kind"] == "request.updated"
            and d["entity"]["thread_id"] == thread_id
            and d["entity"]["status"] == "pending"
        )
    )
    return data["entity"]  # type: ignore[no-any-return]


async def wait_turn_end(client: RpcClient, turn_id: str) -> dict[str, Any]:
    data = await client.wait_event(
        lambda d: (
            d["kind"] == "turn.updated"
            and d["entity"]["id"] == turn_id
            and d["entity"]["status"] in TERMINAL
        )
    )
    return data["entity"]  # type: ignore[no-any-return]


async def notes_for(
    client: RpcClient, sub: str, until: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """Notifications of subscription ``sub`` up to and including the first that satisfies ``until``."""
    seen: list[dict[str, Any]] = []
    while True:
        note = await client.next_notification()
        if note["sub"] == sub:
            seen.append(note)
            if until(note):
                return seen


def is_turn_end(turn_id: str) -> Callable[[dict[str, Any]], bool]:
    def check(note: dict[str, Any]) -> bool:
        data = note["data"]
        return (
            note["kind"] == "event"
            and data["kind"] == "turn.updated"
            and data["entity"]["id"] == turn_id
            and data["entity"]["status"] in TERMINAL
        )

    return check


@asynccontextmanager
async def open_ws(
    daemon: Daemon,
    headers: list[tuple[str, str]] | None = None,
    *,
    receive_buffer: int | None = None,
) -> AsyncIterator[RpcClient]:
    """A WebSocket client on a socket the test owns (trio-websocket leaks its own socket when
    the handshake is rejected); ``headers`` default to the bearer token."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    async with trio.SocketStream(sock) as stream:
        await sock.connect(("127.0.0.1", daemon.info.port))
        if headers is None:
            headers = [("Authorization", f"Bearer {daemon.token}")]
        async with trio.open_nursery() as nursery:
            ws = await trio_websocket.wrap_client_stream(
                nursery,
                stream,
                "127.0.0.1",
                "/ws",
                extra_headers=[(name.encode(), value.encode()) for name, value in headers],
                max_message_size=64 * 1024 * 1024,
            )
            yield RpcClient(ws)
            await ws.aclose()


async def upgrade_refused(
    daemon: Daemon, headers: list[tuple[str, str]]
) -> trio_websocket.ConnectionRejected:
    rejections: list[trio_websocket.ConnectionRejected] = []
    try:
        async with open_ws(daemon, headers):
            pytest.fail(f"the upgrade with {headers} was accepted")
    except* trio_websocket.ConnectionRejected as group:
        rejections.extend(group.exceptions)  # type: ignore[arg-type]
    [rejection] = rejections
    return rejection


# --- auth ---------------------------------------------------------------------------


async def test_health_needs_no_token_and_everything_else_does(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """GET /api/health answers 200 without auth with only its public part (status, reasons,
    version, uptime); with the token, the whole report (loop lag, writer queue, admission,
    live...); every other route without the bearer token, or with a wrong one, gets 401
    with a message that names the fix."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        status, public = await http(daemon, "GET", "/api/health", token=False)
        assert status == 200
        assert public == {"status": "ok", "reasons": [], "version": __version__, "uptime_s": public["uptime_s"]}
        assert public["uptime_s"] >= 0
        status, health = await http(daemon, "GET", "/api/health")
        assert status == 200
        assert health["status"] == "ok"
        assert set(health["loop_lag_ms"]) >= {"last", "p99"}
        assert health["writer"] == {"queue": 0, "oldest_job_s": 0.0, "unavailable": None, "held": 0, "failed_unavailable": 0}
        assert health["admission"]["state"] == "open"
        assert health["live"] == {"websockets": 0, "buffered_bytes": 0, "held_bytes": 0, "budget_bytes": 0, "resynced_for_budget": 0, "request_waiters": 0}

        routes = [
            ("GET", "/api/shell"),
            ("GET", "/api/threads/x"),
            ("GET", "/api/requests/pending"),
            ("GET", "/api/requests/wait"),
            ("POST", "/api/requests/x/respond"),
            ("POST", "/mcp"),
            ("POST", "/api/dispatch"),
            ("GET", "/api/spawner"),
            ("GET", "/no/such/route"),
        ]
        wrong: list[tuple[str | bool, list[tuple[str, str]]]] = [
            (False, []),
            ("wrong-token", []),
            (False, [("Authorization", f"Basic {daemon.token}")]),  # the right token, wrong scheme
        ]
        for method, path in routes:
            for token, headers in wrong:
                status, body = await http(daemon, method, path, b"{}", token=token, headers=headers)
                assert status == 401, (method, path, token, headers)
                assert "Authorization: Bearer" in body["error"]["message"]
                assert "auth/token" in body["error"]["message"]
        status, _ = await http(daemon, "GET", "/api/shell")
        assert status == 200
        daemon.stop()


async def test_websocket_needs_the_token_and_a_loopback_origin(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A WebSocket upgrade without the token is refused with 401, one from a foreign Origin
    (even with the token) with 403; a loopback Origin with the token is accepted."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        port, bearer = daemon.info.port, ("Authorization", f"Bearer {daemon.token}")
        refused = await upgrade_refused(daemon, [])
        assert refused.status_code == 401
        assert b"Authorization: Bearer" in (refused.body or b"")
        assert (
            await upgrade_refused(daemon, [("Authorization", "Bearer not-the-token")])
        ).status_code == 401
        refused = await upgrade_refused(daemon, [bearer, ("Origin", "http://evil.example")])
        assert refused.status_code == 403
        assert b"Origin" in (refused.body or b"")

        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            async with open_ws(daemon, [bearer, ("Origin", origin)]) as client:
                assert (await client.call("server.hello"))["server"] == "t3d"
        daemon.stop()


# --- malformed input ---------------------------------------------------------------

GARBAGE_1MB = "\x01garbage\xff{[" * (1024 * 1024 // 12)

BAD_FRAMES: list[tuple[str, str | bytes, int, Any]] = [
    ("not JSON", "{not json", PARSE_ERROR, None),
    ("1 MB of garbage", GARBAGE_1MB, PARSE_ERROR, None),
    (
        "a JSON array (batch)",
        '[{"jsonrpc":"2.0","id":1,"method":"server.hello"}]',
        INVALID_REQUEST,
        None,
    ),
    ("a number", "42", INVALID_REQUEST, None),
    ("a string", '"server.hello"', INVALID_REQUEST, None),
    ("null", "null", INVALID_REQUEST, None),
    ("no jsonrpc member", '{"id":5,"method":"server.hello"}', INVALID_REQUEST, 5),
    ("a boolean id", '{"jsonrpc":"2.0","id":true,"method":"server.hello"}', INVALID_REQUEST, None),
    ("no method", '{"jsonrpc":"2.0","id":6}', INVALID_REQUEST, 6),
    ("an unknown method", '{"jsonrpc":"2.0","id":7,"method":"no.such"}', METHOD_NOT_FOUND, 7),
    (
        "params not an object",
        '{"jsonrpc":"2.0","id":8,"method":"thread.create","params":[1]}',
        INVALID_PARAMS,
        8,
    ),
    (
        "a wrong type",
        '{"jsonrpc":"2.0","id":9,"method":"thread.rename","params":{"thread_id":1,"title":"t"}}',
        INVALID_PARAMS,
        9,
    ),
    (
        "a missing field",
        '{"jsonrpc":"2.0","id":10,"method":"turn.start","params":{"thread_id":"t"}}',
        INVALID_PARAMS,
        10,
    ),
    (
        "a command_id not a string",
        '{"jsonrpc":"2.0","id":12,"method":"thread.archive","params":{"thread_id":"t","command_id":[1]}}',
        INVALID_PARAMS,
        12,
    ),
    (
        "bad subscribe params",
        '{"jsonrpc":"2.0","id":11,"method":"subscribe.thread","params":{"turn_limit":"x"}}',
        INVALID_PARAMS,
        11,
    ),
]


async def test_bad_frames_get_errors_and_no_client_is_disturbed(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Malformed JSON, an array, non-objects, a missing jsonrpc member, an unknown method, bad
    params and 1 MB of garbage each get a JSON-RPC error with the right code (and the request's
    id where it has one); the connection stays up (server.hello works after each), and another
    client's subscription keeps receiving the events of a turn that runs meanwhile."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_speed=4)
        async with open_client(daemon) as bad, open_client(daemon) as good:
            thread_id = await new_thread(good, tmp_path)
            turn_running = trio.Event()
            outcome: list[Any] = []

            async def watch(data: dict[str, Any]) -> None:
                if data["kind"] == "item.updated" and data["entity"]["kind"] == "assistant_message":
                    turn_running.set()

            async def run_good_turn() -> None:
                outcome.append(await run_turn(good, thread_id, READ, on_event=watch))

            async with trio.open_nursery() as both:
                both.start_soon(run_good_turn)
                await turn_running.wait()
                for name, frame, code, request_id in BAD_FRAMES:
                    reply = await reply_to_frame(bad, frame)
                    assert reply["jsonrpc"] == "2.0", name
                    assert reply["error"]["code"] == code, (name, reply["error"])
                    assert reply["id"] == request_id, name
                    assert reply["error"]["message"], name
                    assert (await bad.call("server.hello"))["server"] == "t3d", name

            assert outcome[0].turn["status"] == "completed"
            assert outcome[0].assistant_text == [
                "I'll read the file.",
                "Done. The tool returned: 1\thello | 2\t",
            ]
            assert not [n for n in good.notifications if n["kind"] == "resync"]
        daemon.stop()


async def test_one_invalid_params_error_names_every_bad_field(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Params are checked all at once: one -32602 error names each bad field (wrong types,
    a value out of its choices, a missing field, a command_id that is not a string) in its
    message and in data.problems."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            with pytest.raises(RpcFailed) as failed:
                await client.call(
                    "thread.create", provider="nope", title=5, model=["m"], command_id={"a": 1}
                )
            assert failed.value.code == INVALID_PARAMS
            for field in ("project_id", "provider", "title", "model", "command_id"):
                assert field in failed.value.message
            assert len(failed.value.data["problems"]) == 5
            assert f"provider must be one of {', '.join(RUNNABLE_PROVIDERS)}," in failed.value.message
        daemon.stop()


async def test_unknown_params_are_refused_by_name_on_every_method(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A param a method does not take is refused (-32602) with its name and the params the
    method takes, on mutating and read methods alike, over the WebSocket and over HTTP; a
    misspelled field must not silently do nothing. Read methods take no command_id, and
    subscribe.shell no turn_limit."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            project_id = (await client.call("project.create", path=str(tmp_path)))["project_id"]
            with pytest.raises(RpcFailed) as failed:
                await client.call("thread.create", project_id=project_id, provider="replay", titel="x")
            assert failed.value.code == INVALID_PARAMS
            assert "'titel'" in failed.value.message and "title" in failed.value.message
            assert (await http(daemon, "GET", "/api/shell"))[1]["threads"] == []
            for method, params in (
                ("project.list", {"verbose": True}),
                ("server.hello", {"x": 1}),
                ("requests.pending", {"command_id": "c"}),
                ("subscribe.shell", {"after": 3}),
                ("subscribe.shell", {"turn_limit": 3}),  # the shell has no turns to limit
                ("subscribe.server", {"memory": True}),
                ("unsubscribe", {"sub": "s1", "all": True}),
                ("thread.snapshot", {"thread_id": "t", "turnLimit": 1}),
            ):
                with pytest.raises(RpcFailed) as failed:
                    await client.call(method, **params)
                assert failed.value.code == INVALID_PARAMS, method
                bad = next(name for name in params if name not in ("thread_id", "sub"))
                assert f"'{bad}'" in failed.value.message and method in failed.value.message
        status, body = await http(daemon, "POST", "/api/requests/r1/respond", {"decision": "allow", "mesage": "m"})
        assert status == 400 and "'mesage'" in body["error"]["message"]
        daemon.stop()


# --- projects and threads ------------------------------------------------------------


async def test_project_create_and_list(tmp_path: Path, nursery: trio.Nursery) -> None:
    """project.create takes an absolute existing directory and returns the same project id for
    the same path (also spelled with a trailing slash); a relative or missing directory gets a
    -32602 error saying what to pass; project.list lists each project once."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            first = await client.call("project.create", path=str(tmp_path))
            again = await client.call("project.create", path=str(tmp_path) + "/")
            assert again["project_id"] == first["project_id"]

            with pytest.raises(RpcFailed) as failed:
                await client.call("project.create", path="some/relative/dir")
            assert failed.value.code == INVALID_PARAMS
            assert "absolute" in failed.value.message
            with pytest.raises(RpcFailed) as failed:
                await client.call("project.create", path=str(tmp_path / "missing"))
            assert failed.value.code == INVALID_PARAMS
            assert "missing" in failed.value.message and "directory" in failed.value.message

            listed = (await client.call("project.list"))["projects"]
            assert [(p["id"], p["path"]) for p in listed] == [(first["project_id"], str(tmp_path))]
        daemon.stop()


async def test_thread_create_refuses_what_it_cannot_run(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """thread.create on an unknown project gets -32001; a provider this build does not run
    (one of PROVIDERS outside RUNNABLE_PROVIDERS, else an unknown one) a clear error listing
    only the runnable ones, which are what server.hello lists; a worktree workspace outside a
    git repository a clear error naming it."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            with pytest.raises(RpcFailed) as failed:
                await client.call("thread.create", project_id="nope", provider="replay")
            assert failed.value.code == NOT_FOUND
            assert "project.create" in failed.value.message

            project_id = (await client.call("project.create", path=str(tmp_path)))["project_id"]
            assert (await client.call("server.hello"))["providers"] == list(RUNNABLE_PROVIDERS)
            absent = next((p for p in PROVIDERS if p not in RUNNABLE_PROVIDERS), "nope")
            with pytest.raises(RpcFailed) as failed:
                await client.call("thread.create", project_id=project_id, provider=absent)
            assert failed.value.code == INVALID_PARAMS
            assert f"provider must be one of {', '.join(RUNNABLE_PROVIDERS)}, not {absent!r}" in failed.value.message
            with pytest.raises(RpcFailed) as failed:
                await client.call(
                    "thread.create",
                    project_id=project_id,
                    provider="replay",
                    workspace={"worktree": {}},
                )
            assert failed.value.code == INVALID_PARAMS
            assert "worktree" in failed.value.message

            assert (await http(daemon, "GET", "/api/shell"))[1]["threads"] == []
        daemon.stop()


async def test_rename_archive_and_delete_a_thread(tmp_path: Path, nursery: trio.Nursery) -> None:
    """thread.rename changes the title in the shell; an archived thread refuses turn.start with
    -32002; a deleted thread leaves the shell and its snapshot gets -32001 (404 over HTTP)."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path, title="first title")
            await client.call("thread.rename", thread_id=thread_id, title="second title")
            shell = (await http(daemon, "GET", "/api/shell"))[1]
            assert [t["title"] for t in shell["threads"]] == ["second title"]

            await client.call("thread.archive", thread_id=thread_id)
            shell = (await http(daemon, "GET", "/api/shell"))[1]
            assert shell["threads"][0]["archived_at"] is not None
            with pytest.raises(RpcFailed) as failed:
                await client.call("turn.start", thread_id=thread_id, text="hello")
            assert failed.value.code == CONFLICT
            assert "archived" in failed.value.message

            await client.call("thread.delete", thread_id=thread_id)
            shell = (await http(daemon, "GET", "/api/shell"))[1]
            assert shell["threads"] == []
            with pytest.raises(RpcFailed) as failed:
                await client.call("thread.snapshot", thread_id=thread_id)
            assert failed.value.code == NOT_FOUND
            status, body = await http(daemon, "GET", f"/api/threads/{thread_id}")
            assert (status, body["error"]["code"]) == (404, NOT_FOUND)
            with pytest.raises(RpcFailed) as failed:
                await client.call("thread.rename", thread_id=thread_id, title="gone")
            assert failed.value.code == NOT_FOUND
        daemon.stop()


async def test_command_id_makes_a_command_idempotent(tmp_path: Path, nursery: trio.Nursery) -> None:
    """The same command_id twice returns the first result and creates one entity; a rejected
    command retried with the same command_id fails the same way, even once it could succeed."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            project_id = (await client.call("project.create", path=str(tmp_path)))["project_id"]
            first = await client.call(
                "thread.create", project_id=project_id, provider="replay", command_id="cmd-1"
            )
            again = await client.call(
                "thread.create", project_id=project_id, provider="replay", command_id="cmd-1"
            )
            assert again == first and isinstance(first["sequence"], int)
            shell = (await http(daemon, "GET", "/api/shell"))[1]
            assert [t["id"] for t in shell["threads"]] == [first["thread_id"]]

            # A retry returns exactly the first result; the same id with other params is refused.
            thread_id = first["thread_id"]
            renamed = await client.call("thread.rename", thread_id=thread_id, title="A", command_id="r-1")
            assert await client.call("thread.rename", thread_id=thread_id, title="A", command_id="r-1") == renamed
            with pytest.raises(RpcFailed) as reused:
                await client.call("thread.rename", thread_id=thread_id, title="B", command_id="r-1")
            assert reused.value.code == CONFLICT
            assert "r-1" in reused.value.message and "new command_id" in reused.value.message
            with pytest.raises(RpcFailed) as reused:
                await client.call("thread.archive", thread_id=thread_id, command_id="r-1")
            assert reused.value.code == CONFLICT
            shell = (await http(daemon, "GET", "/api/shell"))[1]
            assert [(t["title"], t["archived_at"]) for t in shell["threads"]] == [("A", None)]

            with pytest.raises(RpcFailed) as rejected:
                await client.call(
                    "thread.create", project_id="p-later", provider="replay", command_id="cmd-2"
                )
            assert rejected.value.code == NOT_FOUND
            (tmp_path / "other").mkdir()
            await client.call("project.create", path=str(tmp_path / "other"), project_id="p-later")
            with pytest.raises(RpcFailed) as retried:
                await client.call(
                    "thread.create", project_id="p-later", provider="replay", command_id="cmd-2"
                )
            assert (retried.value.code, retried.value.message) == (
                rejected.value.code,
                rejected.value.message,
            )
            # The same call under a new command_id is a new command.
            await client.call(
                "thread.create", project_id="p-later", provider="replay", command_id="cmd-3"
            )
            assert len((await http(daemon, "GET", "/api/shell"))[1]["threads"]) == 2
        daemon.stop()


# --- snapshots and the shell ----------------------------------------------------------


async def test_snapshot_pages_turns_back_with_turn_limit_and_before(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """thread.snapshot and GET /api/threads/{id}: turn_limit=N gives exactly the last N turns
    and their items, has_more and before (the lowest ordinal returned); before= pages back; the
    default turn_limit is 10; a bad turn_limit (0, -1, "x") gets -32602 / HTTP 400. The shell
    counts every turn and item."""
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery, tmp_path / "state", replay_fixture=str(ONE_TURN_FIXTURE)
        )
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            for n in range(4):
                assert (await run_turn(client, thread_id, f"turn {n + 1}")).turn[
                    "status"
                ] == "completed"
            everything = await client.call("thread.snapshot", thread_id=thread_id)
            assert [t["ordinal"] for t in everything["turns"]] == [1, 2, 3, 4]
            assert everything["has_more"] is False and everything["before"] is None
            items_of = {
                t["id"]: [i for i in everything["items"] if i["turn_id"] == t["id"]]
                for t in everything["turns"]
            }
            assert all(len(items) == 3 for items in items_of.values())

            last_two = await client.call("thread.snapshot", thread_id=thread_id, turn_limit=2)
            status, over_http = await http(daemon, "GET", f"/api/threads/{thread_id}?turn_limit=2")
            assert status == 200
            for page in (last_two, over_http):
                assert [t["ordinal"] for t in page["turns"]] == [3, 4]
                assert page["items"] == [i for t in page["turns"] for i in items_of[t["id"]]]
                assert page["has_more"] is True and page["before"] == 3
                assert page["thread"]["id"] == thread_id

            first_two = await client.call(
                "thread.snapshot", thread_id=thread_id, turn_limit=2, before=3
            )
            status, over_http = await http(
                daemon, "GET", f"/api/threads/{thread_id}?turn_limit=2&before=3"
            )
            assert status == 200
            for page in (first_two, over_http):
                assert [t["ordinal"] for t in page["turns"]] == [1, 2]
                assert page["items"] == [i for t in page["turns"] for i in items_of[t["id"]]]
                assert page["has_more"] is False and page["before"] is None

            for bad in (0, -1, "x"):
                with pytest.raises(RpcFailed) as failed:
                    await client.call("thread.snapshot", thread_id=thread_id, turn_limit=bad)
                assert failed.value.code == INVALID_PARAMS and "turn_limit" in failed.value.message
                status, body = await http(
                    daemon, "GET", f"/api/threads/{thread_id}?turn_limit={bad}"
                )
                assert (status, body["error"]["code"]) == (400, INVALID_PARAMS), bad
                assert "turn_limit" in body["error"]["message"]

            for n in range(4, 12):
                assert (await run_turn(client, thread_id, f"turn {n + 1}")).turn[
                    "status"
                ] == "completed"
            default = await client.call("thread.snapshot", thread_id=thread_id)
            status, over_http = await http(daemon, "GET", f"/api/threads/{thread_id}")
            for page in (default, over_http):
                assert [t["ordinal"] for t in page["turns"]] == list(range(3, 13))
                assert page["has_more"] is True and page["before"] == 3

            status, shell = await http(daemon, "GET", "/api/shell")
            assert status == 200
            assert [p["path"] for p in shell["projects"]] == [str(tmp_path)]
            [row] = shell["threads"]
            assert (row["id"], row["turn_count"], row["item_count"]) == (thread_id, 12, 36)
            assert row["status"] == "idle" and row["provider"] == "replay"
        daemon.stop()


# --- POST /api/dispatch ----------------------------------------------------------------


async def test_dispatch_answers_one_json_rpc_request_over_http(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """POST /api/dispatch with a JSON-RPC request body returns its JSON-RPC response, errors
    included; subscribe methods get an error saying a WebSocket is needed."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")

        async def dispatch(body: Any) -> dict[str, Any]:
            status, reply = await http(daemon, "POST", "/api/dispatch", body)
            assert status == 200
            assert reply["jsonrpc"] == "2.0"
            return reply  # type: ignore[no-any-return]

        reply = await dispatch(
            {
                "jsonrpc": "2.0",
                "id": "a",
                "method": "project.create",
                "params": {"path": str(tmp_path)},
            }
        )
        assert reply["id"] == "a"
        project_id = reply["result"]["project_id"]
        reply = await dispatch({"jsonrpc": "2.0", "id": 2, "method": "project.list"})
        assert [p["id"] for p in reply["result"]["projects"]] == [project_id]

        reply = await dispatch({"jsonrpc": "2.0", "id": 3, "method": "no.such"})
        assert reply["error"]["code"] == METHOD_NOT_FOUND
        reply = await dispatch(
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "thread.create",
                "params": {"project_id": "x", "provider": "replay"},
            }
        )
        assert (reply["id"], reply["error"]["code"]) == (4, NOT_FOUND)
        reply = await dispatch({"jsonrpc": "2.0", "id": 5, "method": "turn.start"})
        assert reply["error"]["code"] == INVALID_PARAMS
        assert (await dispatch(b"{oops"))["error"]["code"] == PARSE_ERROR
        assert (await dispatch([1]))["error"]["code"] == INVALID_REQUEST
        for method in ("subscribe.thread", "subscribe.shell", "unsubscribe"):
            reply = await dispatch({"jsonrpc": "2.0", "id": 6, "method": method, "params": {}})
            assert reply["id"] == 6
            assert "WebSocket" in reply["error"]["message"] and "/ws" in reply["error"]["message"]
        daemon.stop()


# --- approvals over HTTP -------------------------------------------------------------------


async def test_a_permission_request_is_listed_and_answered_over_http(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Turn 2 of the default fixture ("Now EDIT notes.txt") opens a permission request:
    GET /api/requests/pending and requests.pending list it; POST /api/requests/{id}/respond
    with {"decision": "allow"} resolves it; a second answer gets 409 (-32002); bad answers get
    400/404; the turn completes with the request allowed."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
            turn_id = (await client.call("turn.start", thread_id=thread_id, text=EDIT))["turn_id"]
            request = await wait_pending_request(client, thread_id)
            assert request["turn_id"] == turn_id and request["kind"] == "permission"

            status, pending = await http(daemon, "GET", "/api/requests/pending")
            assert status == 200 and [r["id"] for r in pending["requests"]] == [request["id"]]
            assert pending["requests"][0]["data"]["tool_name"] == "Edit"
            status, pending = await http(
                daemon, "GET", f"/api/requests/pending?thread_id={thread_id}"
            )
            assert [r["id"] for r in pending["requests"]] == [request["id"]]
            over_ws = await client.call("requests.pending", thread_id=thread_id)
            assert over_ws["requests"] == pending["requests"]
            assert (await client.call("requests.pending", thread_id="other"))["requests"] == []

            respond = f"/api/requests/{request['id']}/respond"
            status, body = await http(daemon, "POST", respond, {"decision": "maybe"})
            assert (status, body["error"]["code"]) == (400, INVALID_PARAMS) and "decision" in body[
                "error"
            ]["message"]
            status, body = await http(daemon, "POST", respond, b"{not json")
            assert (status, body["error"]["code"]) == (400, PARSE_ERROR)
            status, body = await http(
                daemon, "POST", "/api/requests/no-such/respond", {"decision": "allow"}
            )
            assert (status, body["error"]["code"]) == (404, NOT_FOUND)

            status, body = await http(daemon, "POST", respond, {"decision": "allow"})
            assert status == 200 and body["request_id"] == request["id"]
            status, body = await http(daemon, "POST", respond, {"decision": "deny"})
            assert (status, body["error"]["code"]) == (409, CONFLICT)
            assert "already resolved" in body["error"]["message"]

            assert (await wait_turn_end(client, turn_id))["status"] == "completed"
            assert (await http(daemon, "GET", "/api/requests/pending"))[1]["requests"] == []
            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
            approvals = [i for i in snapshot["items"] if i["kind"] == "approval_request"]
            assert [(i["turn_id"], i["status"]) for i in approvals] == [(turn_id, "allowed")]
        daemon.stop()


async def test_two_threads_wait_on_the_same_recorded_prompt_at_once(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Two threads replaying the default fixture, both at turn 2, each get their own pending
    request although the CLI's prompt id is the same recorded one (domain request ids are
    scoped to their turn); both are listed, answered and both turns complete."""
    with trio.fail_after(10):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            threads = [await new_thread(client, tmp_path) for _ in range(2)]
            for thread_id in threads:
                assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
            turns = {
                (await client.call("turn.start", thread_id=thread_id, text=EDIT))["turn_id"]
                for thread_id in threads
            }
            requests: dict[str, dict[str, Any]] = {}
            while len(requests) < 2:
                data = await client.wait_event(
                    lambda d: d["kind"] == "request.updated" and d["entity"]["status"] == "pending"
                )
                requests[data["entity"]["thread_id"]] = data["entity"]
            assert {r["turn_id"] for r in requests.values()} == turns
            listed = (await client.call("requests.pending"))["requests"]
            assert sorted(r["id"] for r in listed) == sorted(r["id"] for r in requests.values())
            for request in requests.values():
                await client.call("request.respond", request_id=request["id"], decision="allow")
            ended: dict[str, str] = {}
            while len(ended) < 2:
                data = await client.wait_event(
                    lambda d: d["kind"] == "turn.updated" and d["entity"]["status"] in TERMINAL
                )
                ended[data["entity"]["id"]] = data["entity"]["status"]
            assert ended == dict.fromkeys(turns, "completed")
        daemon.stop()


# --- subscriptions ------------------------------------------------------------------------


async def test_shell_subscription_sends_a_snapshot_then_updates(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """subscribe.shell delivers snapshot.chunk and snapshot.end, then project.updated and
    shell.updated events as a project and a thread are created and a turn runs; unsubscribe
    stops delivery; an unknown sub gets -32001."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as watcher, open_client(daemon) as actor:
            sub = await watcher.call("subscribe.shell")
            chunk, end = await watcher.next_notification(), await watcher.next_notification()
            assert (chunk["sub"], chunk["kind"], end["kind"]) == (
                sub["sub"],
                "snapshot.chunk",
                "snapshot.end",
            )
            assert chunk["data"]["projects"] == [] and chunk["data"]["threads"] == []

            thread_id = await new_thread(actor, tmp_path)
            project = await watcher.wait_event(lambda d: d["kind"] == "project.updated")
            assert project["entity"]["path"] == str(tmp_path)
            created = await watcher.wait_event(lambda d: d["kind"] == "shell.updated")
            assert created["entity"]["id"] == thread_id and created["entity"]["turn_count"] == 0

            await run_turn(actor, thread_id, READ)
            row = await watcher.wait_event(
                lambda d: (
                    d["kind"] == "shell.updated"
                    and d["entity"]["turn_count"] == 1
                    and d["entity"]["status"] == "idle"
                )
            )
            assert (
                row["entity"]["item_count"]
                == (await http(daemon, "GET", "/api/shell"))[1]["threads"][0]["item_count"]
            )

            assert await watcher.call("unsubscribe", sub=sub["sub"]) == {"sub": sub["sub"]}
            with pytest.raises(RpcFailed) as failed:
                await watcher.call("unsubscribe", sub=sub["sub"])
            assert failed.value.code == NOT_FOUND
            watcher.notifications.clear()
            await actor.call("thread.rename", thread_id=thread_id, title="renamed")
            second = await watcher.call("subscribe.shell")  # a fresh sub, to know the rename is out
            notes = await notes_for(watcher, second["sub"], lambda n: n["kind"] == "snapshot.end")
            assert notes[0]["data"]["threads"][0]["title"] == "renamed"
            assert [n for n in watcher.notifications if n["sub"] == sub["sub"]] == []
        daemon.stop()


async def test_thread_subscription_errors_and_unsubscribe(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """subscribe.thread on an unknown thread gets -32001; after unsubscribe, a turn on the
    thread delivers nothing more to that subscription, while another one on the same
    connection gets every event."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            with pytest.raises(RpcFailed) as failed:
                await client.call("subscribe.thread", thread_id="no-such-thread")
            assert failed.value.code == NOT_FOUND

            project_id = (await client.call("project.create", path=str(tmp_path)))["project_id"]
            thread_id = (
                await client.call("thread.create", project_id=project_id, provider="replay")
            )["thread_id"]
            gone = (await client.call("subscribe.thread", thread_id=thread_id))["sub"]
            kept = (await client.call("subscribe.thread", thread_id=thread_id))["sub"]
            await client.call("unsubscribe", sub=gone)
            turn_id = (await client.call("turn.start", thread_id=thread_id, text=READ))["turn_id"]
            notes = await notes_for(client, kept, is_turn_end(turn_id))
            assert [
                n["data"]["entity"]["status"]
                for n in notes
                if n["kind"] == "event" and n["data"]["kind"] == "turn.updated"
            ] == [
                "starting",
                "running",
                "completed",
            ]
            await client.call("server.hello")
            assert [
                n for n in client.notifications if n["sub"] == gone and n["kind"] == "event"
            ] == []
        daemon.stop()


def assert_each_event_once(
    notes: list[dict[str, Any]], all_events: list[dict[str, Any]], final: dict[str, Any]
) -> None:
    """A subscription's snapshot and events, up to its turn's end, hold exactly the thread's
    history: events are those after the snapshot's sequence, none missing, none repeated, and
    the snapshot's items updated by the events are the final items."""
    end = next(i for i, n in enumerate(notes) if n["kind"] == "snapshot.end")
    assert end >= 1 and all(n["kind"] == "snapshot.chunk" for n in notes[:end])
    snapshot = merge_chunks(notes[:end])
    assert all(n["kind"] == "event" for n in notes[end + 1 :])
    events = [n["data"] for n in notes[end + 1 :]]
    assert events == [
        e for e in all_events if snapshot["sequence"] < e["sequence"] <= events[-1]["sequence"]
    ]
    items = {i["id"]: i for i in snapshot["items"]}
    for event in events:
        if event["kind"] == "item.updated":
            items[event["entity"]["id"]] = event["entity"]
    ordinal_of = {t["id"]: t["ordinal"] for t in final["turns"]}
    in_order = sorted(items.values(), key=lambda i: (ordinal_of[i["turn_id"]], i["ordinal"]))
    assert in_order == final["items"]


async def test_a_mid_turn_subscriber_sees_every_item_once(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A thread subscribed mid-turn (right after turn.start, and while the turn waits for an
    approval) gets a snapshot and then exactly the thread's later events: no gap, no
    duplicate, nothing already in its snapshot; the union of its snapshot items and events
    equals thread.snapshot afterwards."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with (
            open_client(daemon) as actor,
            open_client(daemon) as early,
            open_client(daemon) as waiting,
        ):
            thread_id = await new_thread(actor, tmp_path)
            await run_turn(actor, thread_id, READ)
            actor.notifications.clear()
            turn_id = (await actor.call("turn.start", thread_id=thread_id, text=EDIT))["turn_id"]
            subs = {early: (await early.call("subscribe.thread", thread_id=thread_id))["sub"]}
            request = await wait_pending_request(actor, thread_id)
            subs[waiting] = (await waiting.call("subscribe.thread", thread_id=thread_id))["sub"]
            await actor.call("request.respond", request_id=request["id"], decision="allow")
            await wait_turn_end(actor, turn_id)

            final = await actor.call("thread.snapshot", thread_id=thread_id)
            all_events = await all_thread_events(daemon, thread_id)
            for client, sub in subs.items():
                notes = await notes_for(client, sub, is_turn_end(turn_id))
                assert_each_event_once(notes, all_events, final)
        daemon.stop()


async def test_subscribers_joining_during_a_burst_see_each_event_once(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Subscribers that join while a turn commits hundreds of events back to back (so commits
    land between joining the hub and reading the snapshot) still get each event exactly once
    after their snapshot, and end with the final items."""
    with trio.fail_after(20):
        fixture = tmp_path / "burst.stdout.jsonl"
        write_flood_fixture(fixture, 400)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(fixture))
        async with (
            open_client(daemon) as actor,
            open_client(daemon) as first,
            open_client(daemon) as second,
            open_client(daemon) as third,
        ):
            thread_id = await new_thread(actor, tmp_path)
            turn_id = (await actor.call("turn.start", thread_id=thread_id, text="burst"))["turn_id"]
            joiners, subs, items_seen = [first, second, third], {}, 0
            while True:
                data = await actor.wait_event(lambda d: True)
                items_seen += data["kind"] == "item.updated"
                if joiners and items_seen > 100 * len(subs):  # join after 1, 101, 201 items
                    client = joiners.pop()
                    subs[client] = (await client.call("subscribe.thread", thread_id=thread_id))[
                        "sub"
                    ]
                if is_turn_end(turn_id)({"kind": "event", "data": data}):
                    break
            assert not joiners, "the turn ended before every subscriber joined"

            final = await actor.call("thread.snapshot", thread_id=thread_id)
            assert len(final["items"]) == 401
            all_events = await all_thread_events(daemon, thread_id)
            for client, sub in subs.items():
                notes = await notes_for(client, sub, is_turn_end(turn_id))
                assert_each_event_once(notes, all_events, final)
        daemon.stop()


async def all_thread_events(daemon: Daemon, thread_id: str) -> list[dict[str, Any]]:
    """Every event of a thread so far, in the wire shape of ``event`` notifications, read from
    the events table (in a worker thread: the loop never runs SQLite)."""

    def read() -> list[dict[str, Any]]:
        conn = apsw.Connection(str(daemon.settings.db_path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            return [
                {"kind": kind, "sequence": seq, "entity": orjson.loads(payload)}
                for seq, kind, payload in conn.execute(
                    "SELECT sequence, kind, payload FROM events WHERE thread_id = ? ORDER BY sequence",
                    (thread_id,),
                )
            ]
        finally:
            conn.close()

    return await trio.to_thread.run_sync(read)


# --- a slow subscriber ------------------------------------------------------------------------

FLOOD_ITEMS = 1200


async def test_a_slow_subscriber_is_resynced_not_dropped(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A subscriber that stops reading while a turn commits more than 1,000 events is not cut
    off and does not make the daemon buffer without bound: once it reads again it gets at most
    a buffer's worth of old events, then ``resync``, a fresh snapshot.chunk/snapshot.end holding
    the turn's final state, then live events; other clients get every event."""
    with trio.fail_after(30):
        fixture = tmp_path / "flood.stdout.jsonl"
        write_flood_fixture(fixture, FLOOD_ITEMS)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(fixture))
        # A 4 KiB receive buffer: once the slow client stops reading, the daemon's sends block
        # after a few dozen frames instead of filling megabytes of kernel buffers.
        async with open_client(daemon) as fast, open_ws(daemon, receive_buffer=4096) as slow:
            thread_id = await new_thread(fast, tmp_path)
            sub = (await slow.call("subscribe.thread", thread_id=thread_id))["sub"]
            # The slow client reads nothing from here on, until the turn is over.
            outcome = await run_turn(fast, thread_id, "flood")
            assert outcome.turn["status"] == "completed"
            assert len(outcome.of_kind("assistant_message")) == FLOOD_ITEMS
            last_seq = outcome.events[-1]["sequence"]

            notes = await notes_for(slow, sub, lambda n: n["kind"] == "resync")
            end = next(i for i, n in enumerate(notes) if n["kind"] == "snapshot.end")
            assert {n["kind"] for n in notes[:end]} == {"snapshot.chunk"}
            stale = notes[end + 1 : -1]
            assert all(n["kind"] == "event" for n in stale)
            assert len(stale) <= 1000  # the daemon kept at most one buffer's worth for it
            fresh = await notes_for(slow, sub, lambda n: n["kind"] == "snapshot.end")
            assert {n["kind"] for n in fresh[:-1]} == {"snapshot.chunk"}
            snapshot = merge_chunks(fresh)
            assert snapshot["sequence"] >= last_seq
            assert snapshot["turns"][-1]["status"] == "completed"
            assert [
                i for i in snapshot["items"] if i["turn_id"] == outcome.turn["id"]
            ] == outcome.items

            await fast.call("thread.rename", thread_id=thread_id, title="after the flood")
            [live] = await notes_for(slow, sub, lambda n: n["kind"] == "event")
            assert (
                live["data"]["kind"] == "thread.updated"
                and live["data"]["entity"]["title"] == "after the flood"
            )
            assert (await slow.call("server.hello"))["server"] == "t3d"
            assert not [n for n in fast.notifications if n["kind"] == "resync"]
        daemon.stop()
