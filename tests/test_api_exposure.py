"""What the daemon's HTTP side shows, and to whom: Host checks, health's public part, 405
and HEAD, refusals on the request head, bodies it will not buffer, hostile WebSocket frames.

A real daemon on 127.0.0.1 port 0 (tests/harness.py); clients are raw sockets so that
each misbehaviour can be played exactly. Each test states the behaviour it pins.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
from harness import Daemon, http, open_client, start_daemon
from served import base_env
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def parse_reply(data: bytes) -> Reply:
    """The first response in ``data`` (a HEAD reply has a length but no body)."""
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    return Reply(int(status_line.split()[1]), headers, rest[:length])


async def receive_until_eof(stream: trio.SocketStream) -> bytes:
    chunks = []
    while chunk := await stream.receive_some():
        chunks.append(chunk)
    return b"".join(chunks)


def request_bytes(
    daemon: Daemon,
    method: str,
    target: str,
    *,
    token: bool = False,
    host: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    body: bytes = b"",
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host or f'127.0.0.1:{daemon.info.port}'}"]
    if token:
        lines.append(f"Authorization: Bearer {daemon.token}")
    lines += [f"{name}: {value}" for name, value in headers]
    if body and not any(name.lower() == "content-length" for name, _ in headers):
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def exchange(daemon: Daemon, data: bytes, *, half_close: bool = False) -> Reply:
    """Send ``data`` on a fresh connection (then EOF if ``half_close``); the reply."""
    async with await trio.open_tcp_stream("127.0.0.1", daemon.info.port) as stream:
        await stream.send_all(data)
        if half_close:
            await stream.send_eof()
        return parse_reply(await receive_until_eof(stream))


# --- who may ask what -------------------------------------------------------------------


async def test_a_host_that_does_not_name_the_daemon_gets_421(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A Host header naming anything but a loopback name or the bound address (what a
    DNS-rebinding page sends) gets 421 with a message naming the accepted names, on health,
    on an authenticated route and on a WebSocket upgrade; loopback names are served."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        port = daemon.info.port
        evil = f"evil.example:{port}"
        for method, target, token in (("GET", "/api/health", False), ("GET", "/api/shell", True)):
            reply = await exchange(daemon, request_bytes(daemon, method, target, token=token, host=evil))
            assert reply.status == 421, (target, reply)
            assert reply.json()["error"]["code"] == "wrong_host"
            assert "localhost" in reply.json()["error"]["message"]
        upgrade = request_bytes(
            daemon,
            "GET",
            "/ws",
            token=True,
            host=evil,
            headers=(
                ("Connection", "Upgrade"),
                ("Upgrade", "websocket"),
                ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("Sec-WebSocket-Version", "13"),
            ),
        )
        assert (await exchange(daemon, upgrade)).status == 421
        assert (await exchange(daemon, request_bytes(daemon, "GET", "/api/health", host=f"127.0.0.1:{port + 1}"))).status == 421
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1"):
            reply = await exchange(daemon, request_bytes(daemon, "GET", "/api/shell", token=True, host=host))
            assert reply.status == 200, host
        daemon.stop()


async def test_the_web_pages_routes_answer_only_to_the_daemons_host(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The page (/, its static files, /auth, /api/auth/*) needs no token, but like every
    route it answers only to a Host naming the daemon: under another name (DNS rebinding)
    each gets 421, and a one-time link is not spent by it."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        evil = f"evil.example:{daemon.info.port}"
        link = await exchange(daemon, request_bytes(daemon, "POST", "/api/auth/link", token=True))
        code = link.json()["url"].partition("?")[2]
        for method, target in (("GET", "/"), ("GET", "/static/app.css"), ("GET", f"/auth?{code}"), ("GET", "/api/auth/session"), ("POST", "/api/auth/logout")):
            assert (await exchange(daemon, request_bytes(daemon, method, target, host=evil))).status == 421, target
        assert (await exchange(daemon, request_bytes(daemon, "GET", "/"))).status == 200
        assert (await exchange(daemon, request_bytes(daemon, "GET", f"/auth?{code}"))).status == 303  # still unused
        daemon.stop()


async def test_every_route_refuses_an_unknown_query_parameter_on_the_head(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Every route, whatever its method (health and the spawner, POST routes, /mcp, the
    WebSocket upgrade), answers a query parameter it does not take with a 400 naming it and
    the ones the route takes, on the request head: a POST that declares a body and sends
    none of it gets its 400 at once. Known parameters are still served."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        upgrade = (
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        )
        mcp = (("Accept", "application/json, text/event-stream"), ("Content-Type", "application/json"))
        unsent_body = (("Content-Length", "1000"),)
        cases: list[tuple[str, str, bool, tuple[tuple[str, str], ...], str]] = [
            ("GET", "/api/health?x=1", False, (), "it takes none"),
            ("GET", "/api/health?x=1", True, (), "it takes none"),
            ("HEAD", "/api/health?x=1", False, (), ""),
            ("GET", "/api/spawner?x=1", True, (), "it takes none"),
            ("GET", "/api/shell?x=1", True, (), "it takes none"),
            ("GET", "/api/schema?x=1", True, (), "it takes none"),
            ("GET", "/api/threads/t1?turnLimit=1", True, (), "it takes turn_limit, before"),
            ("GET", "/api/items/i1?x=1", True, (), "it takes path"),
            ("GET", "/api/requests/pending?x=1", True, (), "it takes thread_id"),
            ("GET", "/api/requests/wait?timout=5", True, (), "it takes after, thread_id, thread_ids, timeout, limit"),
            ("POST", "/api/dispatch?x=1", True, unsent_body, "it takes none"),
            ("POST", "/api/requests/r1/respond?x=1", True, unsent_body, "it takes none"),
            ("POST", "/mcp?x=1", True, mcp + unsent_body, "it takes none"),
            ("GET", "/ws?x=1", True, upgrade, "it takes none"),
        ]
        for method, target, token, headers, takes in cases:
            with trio.fail_after(5):  # on the head: well under the 10 s head and 30 s request deadlines
                reply = await exchange(daemon, request_bytes(daemon, method, target, token=token, headers=headers))
            assert reply.status == 400, (method, target, reply)
            if method != "HEAD":
                unknown = target.partition("?")[2].partition("=")[0]
                message = reply.json()["error"]["message"]
                assert f"unknown query parameter {unknown} for {target.partition('?')[0]}; {takes}" == message
        status, _ = await http(daemon, "GET", "/api/requests/pending?thread_id=t1")
        assert status == 200
        assert (await exchange(daemon, request_bytes(daemon, "GET", "/api/shell?x=1"))).status == 401  # the token first
        daemon.stop()


async def test_a_known_path_with_the_wrong_method_gets_405_with_allow(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A known path asked with a method it does not take gets 405 and an Allow header naming
    the methods it takes (HEAD wherever GET); an unknown path stays 404. Health is public, so
    its 405 needs no token; other paths say 401 first without one."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        cases = [
            ("POST", "/api/shell", True, "GET, HEAD"),
            ("DELETE", "/api/threads/t1", True, "GET, HEAD"),
            ("GET", "/api/dispatch", True, "POST"),
            ("PUT", "/api/requests/r1/respond", True, "POST"),
            ("POST", "/api/health", False, "GET, HEAD"),
        ]
        for method, path, token, allow in cases:
            reply = await exchange(daemon, request_bytes(daemon, method, path, token=token, body=b"{}"))
            assert reply.status == 405, (method, path)
            assert reply.headers["allow"] == allow
            assert reply.json()["error"]["code"] == "method_not_allowed"
            assert allow in reply.json()["error"]["message"]
        assert (await exchange(daemon, request_bytes(daemon, "POST", "/api/shell", body=b"{}"))).status == 401
        assert (await exchange(daemon, request_bytes(daemon, "GET", "/api/nothing", token=True))).status == 404
        daemon.stop()


async def test_head_health_answers_like_get_without_a_body(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """HEAD /api/health needs no token and answers GET's status and length without a body;
    HEAD works on authenticated GET routes too, and a refused HEAD (no token, unknown path,
    wrong Host) gets its status without a body, with no error logged."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        head = await exchange(daemon, request_bytes(daemon, "HEAD", "/api/health"))
        assert (head.status, head.body) == (200, b"")
        assert head.headers["content-type"] == "application/json"
        assert int(head.headers["content-length"]) > 0
        get = await exchange(daemon, request_bytes(daemon, "GET", "/api/shell", token=True))
        shell = await exchange(daemon, request_bytes(daemon, "HEAD", "/api/shell", token=True))
        assert (shell.status, shell.body) == (200, b"")
        assert int(shell.headers["content-length"]) == len(get.body) > 0
        refused = [
            (request_bytes(daemon, "HEAD", "/api/shell"), 401),
            (request_bytes(daemon, "HEAD", "/api/nothing", token=True), 404),
            (request_bytes(daemon, "HEAD", "/api/health", host="evil.example"), 421),
        ]
        for data, status in refused:
            async with await trio.open_tcp_stream("127.0.0.1", daemon.info.port) as stream:
                await stream.send_all(data)
                raw = await receive_until_eof(stream)
            reply = parse_reply(raw)
            assert reply.status == status, data
            assert int(reply.headers["content-length"]) > 0 and raw.endswith(b"\r\n\r\n")  # no body
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        daemon.stop()


# --- refused on the head, bounded bodies ----------------------------------------------


async def test_a_tokenless_request_is_refused_on_its_head(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A request without the token that declares a body, and sends none of it, gets its 401
    at once (not after a read timeout), and the connection closes."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        head = request_bytes(daemon, "POST", "/api/dispatch", headers=(("Content-Length", "1000000"),))
        with trio.fail_after(5):  # well under every request deadline (10 s head, 30 s request)
            reply = await exchange(daemon, head)
        assert reply.status == 401
        assert reply.headers["connection"] == "close"
        daemon.stop()


async def test_a_100_mb_body_is_refused_with_413_without_being_buffered(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A declared 100 MB body gets 413 before any of it is sent; a chunked one streamed at
    the daemon gets 413 once it passes the 8 MiB cap, long before 100 MB have gone."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        declared = request_bytes(daemon, "POST", "/api/dispatch", token=True, headers=(("Content-Length", str(100 * 2**20)),))
        reply = await exchange(daemon, declared)
        assert reply.status == 413
        assert reply.json()["error"]["code"] == "body_too_large"

        chunked = request_bytes(daemon, "POST", "/api/dispatch", token=True, headers=(("Transfer-Encoding", "chunked"),))
        chunk = b"100000\r\n" + b"x" * 2**20 + b"\r\n"  # 1 MiB
        sent = [0]
        async with (
            await trio.open_tcp_stream("127.0.0.1", daemon.info.port) as stream,
            trio.open_nursery() as inner,
        ):

            async def stream_body() -> None:
                await stream.send_all(chunked)
                try:
                    for _ in range(100):
                        await stream.send_all(chunk)
                        sent[0] += 1
                except trio.BrokenResourceError:
                    pass  # the daemon closed after its 413
                await trio.sleep_forever()

            inner.start_soon(stream_body)
            received = bytearray()
            while b"\r\n\r\n" not in received:
                received += await stream.receive_some()
            inner.cancel_scope.cancel()
        assert parse_reply(bytes(received)).status == 413
        assert sent[0] < 100
        daemon.stop()


async def test_a_body_shorter_than_declared_then_a_half_close_gets_400_at_once(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Content-Length larger than the body, then the client's EOF: a 400 at once, not a
    silent close at a timeout."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        short = request_bytes(daemon, "POST", "/api/dispatch", token=True, headers=(("Content-Length", "100"),), body=b'{"jsonrpc"')
        with trio.fail_after(5):
            reply = await exchange(daemon, short, half_close=True)
        assert reply.status == 400
        assert "malformed" in reply.json()["error"]["message"]
        daemon.stop()


async def test_a_half_closed_request_runs_and_is_answered(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A whole request followed by the client's EOF runs and gets its reply: never run
    without a reply."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        call = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "project.create", "params": {"path": str(tmp_path)}})
        reply = await exchange(daemon, request_bytes(daemon, "POST", "/api/dispatch", token=True, body=call), half_close=True)
        assert reply.status == 200
        project_id = reply.json()["result"]["project_id"]
        _, listed = await http(daemon, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 2, "method": "project.list"})
        assert [p["id"] for p in listed["result"]["projects"]] == [project_id]
        daemon.stop()


# --- hostile WebSocket frames ------------------------------------------------------------


def _masked_frame(first_byte: int, payload: bytes, mask: bytes) -> bytes:
    """A client frame: ``first_byte`` (FIN, RSV, opcode), then masked ``payload``."""
    size = len(payload)
    if size < 126:
        length = bytes([0x80 | size])
    elif size < 65536:
        length = bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        length = bytes([0x80 | 127]) + size.to_bytes(8, "big")
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([first_byte]) + length + mask + masked


def _fuzzed_frames(rng: random.Random) -> bytes:
    """Frames a broken or hostile client might send: bad JSON, invalid UTF-8, reserved bits
    and opcodes, unmasked frames, lying lengths, raw garbage."""
    frames = []
    for _ in range(rng.randrange(1, 8)):
        kind = rng.randrange(6)
        payload = rng.randbytes(rng.randrange(0, 300))
        mask = rng.randbytes(4)
        if kind == 0:  # a text frame of JSON-ish text
            text = rng.choice(['{"jsonrpc":"2.0","id":1,"method":', "[", '{"id":{}}', "null", "\"\\u0000\""])
            frames.append(_masked_frame(0x81, text.encode() + payload.hex().encode(), mask))
        elif kind == 1:  # a text frame of random bytes (usually not UTF-8)
            frames.append(_masked_frame(0x81, payload, mask))
        elif kind == 2:  # any opcode, any RSV bits
            frames.append(_masked_frame(rng.randrange(256), payload[:125], mask))
        elif kind == 3:  # unmasked
            frames.append(bytes([0x81, len(payload[:125])]) + payload[:125])
        elif kind == 4:  # a length that promises more than comes
            frames.append(bytes([0x82, 0x80 | 126]) + (60000).to_bytes(2, "big") + mask + payload)
        else:
            frames.append(payload)
    return b"".join(frames)


async def test_a_burst_of_fuzzed_websocket_frames_crashes_nothing(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """60 connections each send a burst of fuzzed frames; the daemon logs no error (no
    traceback), every such connection ends or answers, and a good client on its own
    connection is answered throughout and after; health stays ok."""
    rng = random.Random(14)
    with trio.fail_after(90):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as good:
            port, token = daemon.info.port, daemon.token

            async def fuzz(data: bytes) -> None:
                async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                    ws = WSConnection(ConnectionType.CLIENT)
                    await stream.send_all(ws.send(Request(host=f"127.0.0.1:{port}", target="/ws", extra_headers=[(b"authorization", f"Bearer {token}".encode())])))
                    received = bytearray()
                    while b"\r\n\r\n" not in received:
                        received += await stream.receive_some()
                    ws.receive_data(bytes(received))
                    assert isinstance(next(ws.events()), AcceptConnection)
                    try:
                        await stream.send_all(data)
                        with trio.move_on_after(3):  # an answer, a close, or nothing (lying length)
                            while await stream.receive_some():
                                pass
                    except trio.BrokenResourceError:
                        pass  # the daemon closed on a protocol error while we still sent

            async with trio.open_nursery() as fuzzers:
                for _ in range(60):
                    fuzzers.start_soon(fuzz, _fuzzed_frames(rng))
                for _ in range(20):
                    assert (await good.call("server.hello"))["server"] == "t3d"
            assert (await good.call("server.hello"))["server"] == "t3d"
        status, health = await http(daemon, "GET", "/api/health")
        assert (status, health["status"]) == (200, "ok")
        daemon.stop()
    assert not [r for r in caplog.records if r.levelno >= 40], [r.getMessage() for r in caplog.records if r.levelno >= 40]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (_masked_frame(0x81, b"\xc3\x28", b"\x01\x02\x03\x04"), 1007),  # a text frame that is not UTF-8
        (_masked_frame(0x83, b"", b"\x01\x02\x03\x04"), 1002),  # a reserved opcode
    ],
)
async def test_a_websocket_protocol_violation_gets_its_close_frame_and_a_log_line(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, frame: bytes, code: int
) -> None:
    """On the daemon, a text frame that is not UTF-8 gets a close frame with 1007, and a
    frame that breaks the framing one with 1002; each is logged as a warning naming the code
    (it was a silent close)."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        port = daemon.info.port
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            ws = WSConnection(ConnectionType.CLIENT)
            await stream.send_all(ws.send(Request(host=f"127.0.0.1:{port}", target="/ws", extra_headers=[(b"authorization", f"Bearer {daemon.token}".encode())])))
            received = bytearray()
            while b"\r\n\r\n" not in received:
                received += await stream.receive_some()
            ws.receive_data(bytes(received))
            assert isinstance(next(ws.events()), AcceptConnection)
            await stream.send_all(frame)
            ws.receive_data(await receive_until_eof(stream))
        closes = [e for e in ws.events() if isinstance(e, CloseConnection)]
        assert [c.code for c in closes] == [code]
        daemon.stop()
    assert [r for r in caplog.records if r.levelname == "WARNING" and f"closing it with {code}" in r.getMessage()]


async def test_a_websocket_upgrade_from_a_foreign_origin_gets_403_with_or_without_the_token(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """An upgrade of /ws from a foreign Origin is refused with 403 whether or not it carries
    the token (the Origin is looked at first); without the token and with no Origin it is 401."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        upgrade = (
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        )
        for token, origin, status in ((True, "http://evil.example", 403), (False, "http://evil.example", 403), (False, None, 401)):
            headers = upgrade if origin is None else (*upgrade, ("Origin", origin))
            data = request_bytes(daemon, "GET", "/ws", token=token, headers=headers).replace(b"Connection: close\r\n", b"")
            reply = await exchange(daemon, data)
            assert reply.status == status, (token, origin)
            assert reply.json()["error"]["code"] == ("forbidden_origin" if status == 403 else "unauthorized")
        daemon.stop()


async def test_listening_on_every_address_refuses_an_origin_of_that_address(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Bound to 0.0.0.0, a WebSocket upgrade or an MCP call whose Origin is
    ``http://0.0.0.0:PORT`` is refused with 403 (the unspecified address is no page's home);
    a loopback Origin is accepted, and a Host of any IP address (how a remote client names
    the daemon) is served while a DNS name still gets 421."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", host="0.0.0.0")
        port = daemon.info.port
        upgrade = (
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        )
        mcp = (("Accept", "application/json, text/event-stream"), ("Content-Type", "application/json"))
        ping = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        for origin, status in ((f"http://0.0.0.0:{port}", 403), (f"http://[::]:{port}", 403), (f"http://127.0.0.1:{port}", 101)):
            headers = (*upgrade, ("Origin", origin))
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                data = request_bytes(daemon, "GET", "/ws", token=True, headers=headers)
                await stream.send_all(data.replace(b"Connection: close\r\n", b""))  # it is an upgrade
                received = bytearray()
                while b"\r\n\r\n" not in received and (chunk := await stream.receive_some()):
                    received += chunk
            assert parse_reply(bytes(received)).status == status, origin
            reply = await exchange(daemon, request_bytes(daemon, "POST", "/mcp", token=True, headers=(*mcp, ("Origin", origin)), body=ping))
            assert reply.status == (200 if status == 101 else 403), origin
        assert (await exchange(daemon, request_bytes(daemon, "GET", "/api/shell", token=True, host=f"192.0.2.7:{port}"))).status == 200
        assert (await exchange(daemon, request_bytes(daemon, "GET", "/api/shell", token=True, host=f"evil.example:{port}"))).status == 421
        daemon.stop()


# --- start-up --------------------------------------------------------------------------


async def test_serve_warns_when_it_listens_beyond_loopback(tmp_path: Path) -> None:
    """`t3d serve --host 0.0.0.0` logs a warning that says the API is on every interface
    and how to keep it local; it still serves."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "t3d", "serve", "--host", "0.0.0.0", "--port", "0", "--state-dir", str(tmp_path / "state")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=base_env(),
    )
    stderr = bytearray()
    try:
        with trio.fail_after(30):
            assert process.stderr is not None
            async for chunk in process.stderr:
                stderr += chunk
                if b"t3d serving on" in stderr:
                    break
    finally:
        with trio.move_on_after(20):  # SIGTERM, so the daemon stops its spawner too
            process.terminate()
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = stderr.decode()
    assert "t3d serving on http://0.0.0.0:" in text
    assert "WARNING" in text and "every network interface" in text and "--host 127.0.0.1" in text
