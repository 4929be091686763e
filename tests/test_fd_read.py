"""`read_now` and `receive_some` over a real pipe and a real socket on 127.0.0.1: what
arrived, copied out of the shared buffer; the errors trio's streams raise."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from t3d.fd_read import READ_BYTES, read_now, receive_some


async def test_a_read_copies_what_arrived_out_of_the_shared_buffer() -> None:
    """Each read returns exactly the bytes that arrived, as an object of that size, and a
    later read through the same buffer does not change an earlier result; an empty pipe
    raises BlockingIOError, a closed write end reads as EOF (b"")."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        with pytest.raises(BlockingIOError):
            read_now(r)
        os.write(w, b"first line\n")
        first = read_now(r)
        os.write(w, b"second\n")
        second = read_now(r)
        assert (first, second) == (b"first line\n", b"second\n")
        os.write(w, b"x" * 100)
        assert read_now(r, 30) == b"x" * 30  # at most max_bytes
        assert read_now(r, 10 * READ_BYTES) == b"x" * 70  # capped at the buffer, not beyond it
        os.close(w)
        w = -1
        assert read_now(r) == b""
    finally:
        os.close(r)
        if w != -1:
            os.close(w)


async def test_a_closed_descriptor_is_a_closed_resource() -> None:
    """-1 (what a closed trio stream reports) and a descriptor closed under the reader
    (EBADF) both raise trio.ClosedResourceError, as trio's own streams do."""
    r, w = os.pipe()
    os.close(w)
    os.close(r)
    for fd in (-1, r):
        with pytest.raises(trio.ClosedResourceError):
            read_now(fd)


async def test_receive_some_waits_for_bytes_and_sees_the_peers_close() -> None:
    """Over a real TCP connection: a receive on an empty socket waits until the peer
    writes, returns what it wrote, then b"" once the peer closes; a cancelled caller
    reads nothing, so the bytes stay for the next receive."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with listener:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        server = await listener.accept()
        async with client, server:
            got: list[bytes] = []
            async with trio.open_nursery() as nursery:

                async def receive() -> None:
                    got.append(await receive_some(server.socket.fileno))

                nursery.start_soon(receive)
                await trio.testing.wait_all_tasks_blocked()
                assert got == []  # waiting: nothing has arrived
                await client.send_all(b"GET / HTTP/1.1\r\n")
            assert got == [b"GET / HTTP/1.1\r\n"]

            await client.send_all(b"kept")
            await trio.sleep(0.05)  # the bytes are in the server's socket
            with trio.CancelScope() as scope:
                scope.cancel()
                await receive_some(server.socket.fileno)
            assert scope.cancelled_caught
            assert await receive_some(server.socket.fileno) == b"kept"

            await client.aclose()
            assert await receive_some(server.socket.fileno) == b""
